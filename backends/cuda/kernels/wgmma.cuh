// The warpgroup tensor-core building blocks of sm_90 (wgmma; conv_wgmma*.cuh): the
// m64nNk16 multiplies of bf16/f16 and the m64nNk8 ones of TF32 (f32 storage; both operands
// K-major) with f32 accumulation from shared memory, their descriptors, fences and waits, and
// the 128-byte swizzle of the tiles they read. Compiled for sm_90a only.
//
// A tile the descriptors name: rows of 128 bytes (64 16-bit elements of K, 32 f32), the
// 16-byte piece p of row r at piece p ^ (r % 8), groups of 8 rows 1024 bytes apart, the tile on
// a 1024-byte boundary (the swizzle's period). A K slice (16 16-bit elements, 8 TF32: 32 bytes)
// at byte offset 32 kk starts there in the rows: the hardware applies the swizzle to the
// address it computes, so the slices of one row group are found by moving the start address
// alone.
//
// The accumulators of m64nNk16: warp i of a warpgroup holds rows 16 i .. 16 i + 15, laid out as
// N / 8 fragments of mma.sync's m16n8 (register 4 j + e: row lane / 4 + 8 (e / 2), column
// 8 j + 2 (lane % 4) + e % 2), so the mma.sync kernels' stores write them.
#pragma once

#include "backends/cuda/kernels/mma.cuh"

namespace kiln::cuda {

// The accumulator lists of m64n64, m64n128, m64n192 and m64n256 (N / 2 registers a thread).
#define KILN_WGMMA_N64_D                                                        \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "      \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, " \
  "%31"
#define KILN_WGMMA_N128_D                                                         \
  KILN_WGMMA_N64_D                                                                \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, " \
  "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "   \
  "%62, %63"
#define KILN_WGMMA_N192_D                                                         \
  KILN_WGMMA_N128_D                                                               \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, " \
  "%79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, "   \
  "%94, %95"
#define KILN_WGMMA_N256_D                                                        \
  KILN_WGMMA_N192_D                                                              \
  ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, " \
  "%109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, "     \
  "%121, %122, %123, %124, %125, %126, %127"
#define KILN_WGMMA_F8(d, i)                                                                   \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define KILN_WGMMA_F32(d, i) \
  KILN_WGMMA_F8(d, i), KILN_WGMMA_F8(d, i + 8), KILN_WGMMA_F8(d, i + 16), KILN_WGMMA_F8(d, i + 24)
// d (+)= A B: scale-d from a register (1: add to d), A K-major or (TRANS_A 1) MN-major, B
// K-major or (TRANS 1) MN-major, unscaled. TF32 takes no transpositions (both K-major): its
// kind writes them with KILN_WGMMA_K_MAJOR.
#define KILN_WGMMA_ASM(N, K, TYPE, D, DESCRIPTORS, SCALE, TRANSPOSES)                     \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE                                               \
  ", 0;\n"                                                                                \
  "wgmma.mma_async.sync.aligned.m64n" #N K ".f32." TYPE "." TYPE " {" D "}, " DESCRIPTORS \
  ", p, 1, 1" TRANSPOSES ";\n}\n"
#define KILN_WGMMA_TRANSPOSED(TRANS_A, TRANS) ", " TRANS_A ", " TRANS
#define KILN_WGMMA_K_MAJOR(TRANS_A, TRANS) ""

// One warpgroup's d[64 x N] += A[64 x K] B[K x N] (K: a slice of 32 bytes), A and B in shared
// memory (descriptors); A K-major, or under TRANS_A MN-major (M contiguous); B K-major, or under
// TRANS_B MN-major (N contiguous). TF32 (T float) reads both K-major.
template <typename T, int N>
struct Wgmma;
// Wgmma<T, N>: its accumulator list D, the operand numbers of the descriptors, of scale-d and of
// A's and B's transpositions, and the accumulators as asm outputs (__VA_ARGS__).
#define KILN_WGMMA_SIZE(T, K, TYPE, XPOSE, N, D, DESCRIPTORS, SCALE, TRANS_A, TRANS, ...)       \
  template <>                                                                                   \
  struct Wgmma<T, N> {                                                                          \
    template <int TRANS_B = 0, int TRANS_A_ = 0>                                                \
    __device__ static void run(float (&d)[N / 2], unsigned long long a, unsigned long long b) { \
      static_assert(sizeof(T) == 2 || (TRANS_B == 0 && TRANS_A_ == 0), "TF32 is K-major");      \
      asm volatile(KILN_WGMMA_ASM(N, K, TYPE, D, DESCRIPTORS, SCALE, XPOSE(TRANS_A, TRANS))     \
                   : __VA_ARGS__                                                                \
                   : "l"(a), "l"(b), "r"(1), "n"(TRANS_B), "n"(TRANS_A_));                      \
    }                                                                                           \
  };
#define KILN_WGMMA_KIND(T, K, TYPE, XPOSE)                                                         \
  KILN_WGMMA_SIZE(T, K, TYPE, XPOSE, 64, KILN_WGMMA_N64_D, "%32, %33", "%34", "%36", "%35",        \
                  KILN_WGMMA_F32(d, 0))                                                            \
  KILN_WGMMA_SIZE(T, K, TYPE, XPOSE, 128, KILN_WGMMA_N128_D, "%64, %65", "%66", "%68", "%67",      \
                  KILN_WGMMA_F32(d, 0), KILN_WGMMA_F32(d, 32))                                     \
  KILN_WGMMA_SIZE(T, K, TYPE, XPOSE, 192, KILN_WGMMA_N192_D, "%96, %97", "%98", "%100", "%99",     \
                  KILN_WGMMA_F32(d, 0), KILN_WGMMA_F32(d, 32), KILN_WGMMA_F32(d, 64))              \
  KILN_WGMMA_SIZE(T, K, TYPE, XPOSE, 256, KILN_WGMMA_N256_D, "%128, %129", "%130", "%132", "%131", \
                  KILN_WGMMA_F32(d, 0), KILN_WGMMA_F32(d, 32), KILN_WGMMA_F32(d, 64),              \
                  KILN_WGMMA_F32(d, 96))
KILN_WGMMA_KIND(Bf16, "k16", "bf16", KILN_WGMMA_TRANSPOSED)
KILN_WGMMA_KIND(F16, "k16", "f16", KILN_WGMMA_TRANSPOSED)
KILN_WGMMA_KIND(float, "k8", "tf32", KILN_WGMMA_K_MAJOR)

// A shared-memory descriptor: start address / 16 (bits 0-13), `leading` and `stride` offsets in
// bytes (/ 16, bits 16-29 and 32-45), `swizzle` the mode (bits 62-63; 1: 128-byte, 2: 64-byte,
// 3: 32-byte). For an MN-major B in the 128-byte swizzle (rows of 64 N elements, one per K
// index), `stride` steps 8 rows of K and `leading` the next 64 N elements.
__device__ __forceinline__ unsigned long long wgmma_descriptor(const void* p, unsigned leading,
                                                               unsigned stride, unsigned swizzle) {
  const unsigned long long address = shared_address(p);
  return ((address & 0x3ffff) >> 4) | ((unsigned long long)(leading >> 4) << 16) |
         ((unsigned long long)(stride >> 4) << 32) | ((unsigned long long)swizzle << 62);
}
// The descriptor of a K-major tile in the 128-byte swizzle from `p` (its rows 128 bytes apart,
// groups of 8 rows 1024): leading offset 16 (unused by the swizzled K-major layout), stride
// offset 1024, swizzle mode 1.
__device__ __forceinline__ unsigned long long wgmma_descriptor(const void* p) {
  return wgmma_descriptor(p, 16, 1024, 1);
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int PENDING>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(PENDING) : "memory");
}
// cp.async's stores (the generic proxy) made visible to wgmma's reads (the async proxy).
__device__ __forceinline__ void fence_shared_to_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Keeps the compiler from moving the accumulators across the asynchronous multiplies.
template <int R>
__device__ __forceinline__ void wgmma_hold(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The 16-byte piece `piece` (0-7) of row `row` of a swizzled tile of elements' bits E.
template <typename E>
__device__ __forceinline__ E* swizzled_piece(E* tile, int row, int piece) {
  constexpr int EP = Bits<E>::piece;
  return tile + row * 8 * EP + (piece ^ (row & 7)) * EP;
}

// The first 1024-byte boundary in dynamic shared memory `smem` (its size 1 KiB over the tiles').
__device__ __forceinline__ unsigned short* wgmma_tiles(unsigned char* smem) {
  return reinterpret_cast<unsigned short*>(smem + ((1024 - (shared_address(smem) & 1023)) & 1023));
}

// A warpgroup's acc[64 x N] += a[64 x K] b[K x N]^T over one 128-byte row of swizzled tiles
// (K: 64 16-bit elements, 32 TF32; 4 slices of 32 bytes), committed as one group.
template <typename T, int N>
__device__ __forceinline__ void wgmma_k64(float (&acc)[N / 2], const void* a, const void* b) {
  const unsigned char* a_bytes = static_cast<const unsigned char*>(a);
  const unsigned char* b_bytes = static_cast<const unsigned char*>(b);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)  // 32 bytes along the rows a slice
    Wgmma<T, N>::run(acc, wgmma_descriptor(a_bytes + kk * 32), wgmma_descriptor(b_bytes + kk * 32));
  wgmma_commit();
}

}  // namespace kiln::cuda
