// The tensor cores' bf16 rate with both operands in shared memory, by operand layout: whether
// wgmma's MN-major operands (the weight gradient's dy and x channels-last, both transposed) run
// at the K-major rate (the forward's). No global memory in the loop: each block multiplies the
// same tiles `steps` times (a step: four k16 slices, one commit group, at most one group in
// flight, as conv_wgmma_wgrad_tma.cuh's consumers), `warpgroups` warpgroups a block, each its
// own 64 rows of A and all of B; `blocks` blocks an SM. Optionally a writer warp streams
// `write_kb` KiB a step into a spare stage with cp.async.bulk (what the TMA producer adds), in
// 8 KiB pieces of a source of `pieces` pieces: 16 (every block the same 128 KiB: hot lines) or
// 4096 (32 MiB, in L2; each block its own sequence). With no warpgroups, the copies alone: what
// L2 delivers to the SMs.
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I. bench/wgmma_layouts.cu -o
//   wgmma_layouts
//   ./wgmma_layouts            (every case: layout, N, warpgroups, blocks an SM, writes)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backends/cuda/kernels/wgmma.cuh"

namespace {

using kiln::cuda::Bf16;

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes,
                                          unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
      "l"(src), "r"(bytes), "r"(static_cast<unsigned>(__cvta_generic_to_shared(bar)))
      : "memory");
}
__device__ __forceinline__ void bar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(
                   static_cast<unsigned>(__cvta_generic_to_shared(bar))),
               "r"(count));
}
__device__ __forceinline__ void bar_expect(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(
                   static_cast<unsigned>(__cvta_generic_to_shared(bar))),
               "r"(bytes));
}
__device__ __forceinline__ void bar_wait(unsigned long long* bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred p;\nwait_%=:\nmbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n"
      "@!p bra wait_%=;\n}\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(bar))),
      "r"(parity)
      : "memory");
}

// A: warpgroups x 64 rows x 64 K (K-major: rows of 128 bytes; MN-major: 64 K rows of 64 M per
// warpgroup), B: N x 64 K (K-major rows, or MN-major atoms of 64 N x 64 K rows 8 KiB apart).
template <int N, bool A_MN, bool B_MN, bool A_K32 = false>
__global__ void multiply(const unsigned short* src, float* out, int steps, int write_kb,
                         int pieces) {
  extern __shared__ __align__(1024) unsigned char raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<unsigned long long>(raw) + 1023) & ~1023ull);
  const int warpgroups = (blockDim.x - 32) / 128;
  unsigned short* a_tiles = reinterpret_cast<unsigned short*>(base);
  unsigned short* b_tile = a_tiles + warpgroups * 64 * 64;
  unsigned char* spare = reinterpret_cast<unsigned char*>(b_tile + N * 64);
  auto* bar = reinterpret_cast<unsigned long long*>(spare + write_kb * 1024);
  const int a_elems = warpgroups * 64 * 64 + N * 64;
  for (int i = threadIdx.x; i < a_elems; i += blockDim.x) a_tiles[i] = src[i % 4096];
  if (threadIdx.x == 0) {
    bar_init(bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int group = threadIdx.x / 128;
  if (group == warpgroups) {  // the writer warp
    if (threadIdx.x % 32 != 0 || write_kb == 0) return;
    for (int step = 0; step < steps; ++step) {
      bar_expect(bar, write_kb * 1024);
      for (int k = 0; k < write_kb; k += 8) {
        const long long piece = (blockIdx.x * 977LL + step * 6LL + k / 8) % pieces;
        bulk_copy(spare + k * 1024, src + piece * 4096, 8192, bar);
      }
      bar_wait(bar, step & 1);
    }
    return;
  }
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
  const unsigned short* a_tile = a_tiles + group * 64 * 64;
  for (int step = 0; step < steps; ++step) {
    kiln::cuda::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      // (A_K32: rows of 16 K elements in the 32-byte swizzle, a 64-row block a k16 slice)
      const unsigned long long a =
          A_MN    ? kiln::cuda::wgmma_descriptor(a_tile + kk * 16 * 64, 16, 1024, 1)
          : A_K32 ? kiln::cuda::wgmma_descriptor(a_tile + kk * 64 * 16, 16, 256, 3)
                  : kiln::cuda::wgmma_descriptor(a_tile + kk * 16, 16, 1024, 1);
      const unsigned long long b =
          B_MN ? kiln::cuda::wgmma_descriptor(b_tile + kk * 16 * 64, 64 * 64 * 2, 1024, 1)
               : kiln::cuda::wgmma_descriptor(b_tile + kk * 16, 16, 1024, 1);
      kiln::cuda::Wgmma<Bf16, N>::template run<B_MN ? 1 : 0, A_MN ? 1 : 0>(acc, a, b);
    }
    kiln::cuda::wgmma_commit();
    kiln::cuda::wgmma_wait<1>();  // (no wgmma_hold here: ptxas would serialize the multiplies)
  }
  kiln::cuda::wgmma_wait<0>();
  kiln::cuda::wgmma_hold(acc);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) sum += acc[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "wgmma_layouts: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// The writer's bytes a step and the source's 8 KiB pieces (16: hot lines; 4096: 32 MiB).
struct Writes {
  int kb = 0, pieces = 16;
};

template <int N, bool A_MN, bool B_MN, bool A_K32 = false>
void run(const unsigned short* src, float* out, int sms, int warpgroups, int per_sm,
         Writes writes) {
  auto kernel = multiply<N, A_MN, B_MN, A_K32>;
  const int smem = 1024 + (warpgroups * 64 * 64 + N * 64) * 2 + writes.kb * 1024 + 16;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
        "shared memory");
  const int blocks = sms * per_sm, threads = warpgroups * 128 + 32, steps = 4000;
  const char* a = A_MN ? "A MN" : A_K32 ? "A K32" : "A K";
  std::printf("%-6s %-6s N %3d  %d wg  %d/SM  write %2d KiB of %4d pieces: ", a,
              B_MN ? "B MN" : "B K", N, warpgroups, per_sm, writes.kb, writes.pieces);
  int fit = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, threads, smem), "occupancy");
  if (fit < per_sm) {
    std::printf("does not fit (%d a SM)\n", fit);
    return;
  }
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  kernel<<<blocks, threads, smem>>>(src, out, 100, writes.kb, writes.pieces);
  check(cudaGetLastError(), "launch");
  check(cudaEventRecord(start), "record");
  kernel<<<blocks, threads, smem>>>(src, out, steps, writes.kb, writes.pieces);
  check(cudaEventRecord(stop), "record");
  check(cudaEventSynchronize(stop), "run");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, start, stop), "time");
  const double flops = 2.0 * 64 * N * 64 * warpgroups * static_cast<double>(steps) * blocks;
  const double bytes = 1024.0 * writes.kb * static_cast<double>(steps) * blocks;
  std::printf("%7.3f ms  %6.1f TFLOP/s  copies %5.2f TB/s\n", ms, flops / (ms * 1e9),
              bytes / (ms * 1e9));
}

template <int N>
void layouts(const unsigned short* src, float* out, int sms, int warpgroups, int per_sm,
             Writes writes) {
  run<N, false, false>(src, out, sms, warpgroups, per_sm, writes);
  run<N, false, true>(src, out, sms, warpgroups, per_sm, writes);
  run<N, true, true>(src, out, sms, warpgroups, per_sm, writes);
  run<N, false, true, true>(src, out, sms, warpgroups, per_sm, writes);  // stage 4's dy
}

}  // namespace

int main() {
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "device");
  std::vector<unsigned short> host(4096 * 4096);   // 4096 pieces of 8 KiB
  for (std::size_t i = 0; i < host.size(); ++i) {  // bf16 of small values, 1/8 .. 1
    const float v = 0.125f * static_cast<float>(1 + (i * 2654435761u >> 7) % 8);
    unsigned bits;
    std::memcpy(&bits, &v, 4);
    host[i] = static_cast<unsigned short>(bits >> 16);
  }
  unsigned short* src = nullptr;
  float* out = nullptr;
  check(cudaMalloc(&src, host.size() * 2), "malloc");
  check(cudaMalloc(&out, sizeof(float) * 1024 * 1024), "malloc");
  check(cudaMemcpy(src, host.data(), host.size() * 2, cudaMemcpyHostToDevice), "copy");
  std::printf("%d SMs; a step: 4 x m64nNk16 a warpgroup, one group in flight\n", sms);
  // The copies alone (no warpgroups): L2's delivery to the SMs, hot lines and spread.
  for (int pieces : {16, 4096})
    for (int per_sm : {1, 2}) run<256, false, false>(src, out, sms, 0, per_sm, {48, pieces});
  for (Writes writes : {Writes{0, 16}, Writes{48, 16}, Writes{48, 4096}}) {
    layouts<256>(src, out, sms, 2, 1, writes);  // stages 2-4's 128 x 256
    layouts<192>(src, out, sms, 2, 1, writes);  // 128 x 192
    layouts<192>(src, out, sms, 1, 2, writes);  // stage 1's 64 x 192, two blocks an SM
    layouts<192>(src, out, sms, 1, 1, writes);
    layouts<256>(src, out, sms, 1, 2, writes);
  }
  return 0;
}
