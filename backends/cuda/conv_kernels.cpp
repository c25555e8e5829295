// CUDA C of the convolution kernels: the implicit GEMM that runs every pass it can (see
// conv_igemm_source), the ordered sum of its split-K partials, and the data-movement kernels
// of the im2col + cuBLAS fallback: im2col (one thread per patch-matrix element) and col2im
// as a gather (one thread per input element, no atomics).
#include <fmt/format.h>

#include "backends/cuda/kernel_params.h"
#include "backends/cuda/kernel_sources.h"
#include "core/error.h"

namespace kiln::cuda {

// col[(c, kh, kw), (oh, ow)] of image b = x[b, c, oh*s - p + kh, ow*s - p + kw], 0 outside.
gpu::KernelSource im2col_source(DType dtype) {
  const std::string name = fmt::format("kiln_im2col_{}", dtype_name(dtype));
  std::string code = fmt::format("typedef {} T;\n{}", cuda_type_name(dtype), kConvShapeStruct);
  code += fmt::format(R"(
extern "C" __global__ void {0}(const T* __restrict__ x, T* __restrict__ col, ConvShape g) {{
  const long long cols = g.out_h * g.out_w;
  const long long rows = g.channels * g.kernel_h * g.kernel_w;
  const long long n = g.images * rows * cols;
  {1} {{
    const long long ohw = i % cols;
    const long long row = (i / cols) % rows;
    const long long b = i / (cols * rows);
    const long long kw = row % g.kernel_w;
    const long long kh = (row / g.kernel_w) % g.kernel_h;
    const long long c = row / (g.kernel_w * g.kernel_h);
    const long long ih = (ohw / g.out_w) * g.stride - g.padding + kh;
    const long long iw = (ohw % g.out_w) * g.stride - g.padding + kw;
    const bool inside = ih >= 0 && ih < g.height && iw >= 0 && iw < g.width;
    col[b * g.image_stride + row * g.row_stride + ohw] =
        inside ? x[((b * g.channels + c) * g.height + ih) * g.width + iw] : T(0);
  }}
}}
)",
                      name, kGridStrideLoop);
  return {name, code, {}};
}

// The adjoint of im2col: x[b, c, ih, iw] = sum over (kh, kw) of the col element that read
// it, in the CPU col2im's order of (kh, kw), so each element's sum is deterministic.
gpu::KernelSource col2im_source(DType dtype) {
  const std::string name = fmt::format("kiln_col2im_{}", dtype_name(dtype));
  std::string code = fmt::format("typedef {} T;\n{}", cuda_type_name(dtype), kConvShapeStruct);
  code += fmt::format(R"(
extern "C" __global__ void {0}(const T* __restrict__ col, T* __restrict__ x, ConvShape g) {{
  const long long n = g.images * g.channels * g.height * g.width;
  {1} {{
    const long long iw = i % g.width;
    const long long ih = (i / g.width) % g.height;
    const long long c = (i / (g.width * g.height)) % g.channels;
    const long long b = i / (g.width * g.height * g.channels);
    const T* image = col + b * g.image_stride;
    T sum = T(0);
    for (long long kh = 0; kh < g.kernel_h; ++kh) {{
      const long long oh_s = ih + g.padding - kh;  // oh * stride
      if (oh_s < 0 || oh_s % g.stride != 0 || oh_s / g.stride >= g.out_h) continue;
      for (long long kw = 0; kw < g.kernel_w; ++kw) {{
        const long long ow_s = iw + g.padding - kw;
        if (ow_s < 0 || ow_s % g.stride != 0 || ow_s / g.stride >= g.out_w) continue;
        const long long row = (c * g.kernel_h + kh) * g.kernel_w + kw;
        sum += image[row * g.row_stride + (oh_s / g.stride) * g.out_w + ow_s / g.stride];
      }}
    }}
    x[i] = sum;
  }}
}}
)",
                      name, kGridStrideLoop);
  return {name, code, {}};
}

namespace {

// The implicit GEMM C[M, N] = A[M, K] B[K, N] of one convolution pass (kernel_params.h,
// ConvGemmShape). A block computes a BM x BN tile of C over its K range (blockIdx.z's
// k_chunk), KG groups of (BM/TM)(BN/TN) threads, each thread a TM x TN sub-tile (4 or 8 a
// side: 8 is two runs of 4, BM/2 or BN/2 apart, so a warp's shared-memory reads stay
// conflict-free and an 8 x 8 thread does 64 FMAs for 4 128-bit reads, not 16 for 2); a K step
// loads BK = KS*KG rows of A and B into shared memory (double-buffered: the next step's
// global loads are in flight while this step computes) and group q sums rows q*KS.. of it.
// The groups' sums are added in group order at the end, so every result is deterministic.
// B is gathered from the image through two tables of (image offset, h, w, aux) entries,
// one per K index of the current chunk of TK, one per N index of the tile: the element
// exists when (h_k + h_n, w_k + w_n) lies inside the image, at offset off_k + off_n. A is
// read at aux_k + m * a_ms, C written at aux_n + m * c_ms (out + blockIdx.z * M * N for
// split-K partials). Forward and grad_input: N spatial, K patch; grad_weight the reverse.
// Loads along K (all of A, and B in grad_weight) go through 8 (k) x 4 (m or n) blocks per
// warp: 32-byte pieces of memory, and shared-memory stores to 32 distinct banks.
constexpr const char* kConvIgemm = R"(
#define KILN_OUTSIDE (-30000)

__device__ __forceinline__ void load4(const float* p, float (&r)[4]) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;
}
__device__ __forceinline__ void load4(const double* p, double (&r)[4]) {
  const double2 u = reinterpret_cast<const double2*>(p)[0], v = reinterpret_cast<const double2*>(p)[1];
  r[0] = u.x; r[1] = u.y; r[2] = v.x; r[3] = v.y;
}
__device__ __forceinline__ void store4(float* p, const float (&r)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(r[0], r[1], r[2], r[3]);
}
__device__ __forceinline__ void store4(double* p, const double (&r)[4]) {
  reinterpret_cast<double2*>(p)[0] = make_double2(r[0], r[1]);
  reinterpret_cast<double2*>(p)[1] = make_double2(r[2], r[3]);
}

// Spatial index j = (b, oh, ow) of the [B, M, s_hw] tensor (y, dx or dy): the window's
// corner in the image and j's offset in that tensor. Past `end`: an entry that is never inside.
__device__ __forceinline__ int4 spatial_entry(const ConvGemmShape& g, int j, int end) {
  if (j >= end) return make_int4(0, KILN_OUTSIDE, KILN_OUTSIDE, -1);
  const int b = j / g.s_hw, pix = j - b * g.s_hw;
  const int oh = pix / g.s_w, ow = pix - oh * g.s_w;
  const int h = oh * g.stride - g.pad_h, w = ow * g.stride - g.pad_w;
  return make_int4(b * g.img_chw + h * g.img_w + w, h, w, b * g.m * g.s_hw + pix);
}

// Patch index j = (c, kh, kw): its offset from a window's corner, and aux: j itself (the
// weight's column in forward, dW's column in grad_weight) or, in grad_input, the offset of
// w[c, 0, KH-1-kh, KW-1-kw] (the flipped filter, m = input channel adds m * KH*KW).
template <int MODE>
__device__ __forceinline__ int4 patch_entry(const ConvGemmShape& g, int j, int end) {
  if (j >= end) return make_int4(0, KILN_OUTSIDE, KILN_OUTSIDE, -1);
  const int c = j / g.khkw, r = j - c * g.khkw;
  const int kh = r / g.kw, kw = r - kh * g.kw;
  const int aux = MODE == 1 ? (c * g.m + 1) * g.khkw - 1 - r : j;
  return make_int4(c * g.img_hw + kh * g.img_w + kw, kh, kw, aux);
}

template <int MODE>
__device__ __forceinline__ int4 k_entry(const ConvGemmShape& g, int j, int end) {
  return MODE == 2 ? spatial_entry(g, j, end) : patch_entry<MODE>(g, j, end);
}
template <int MODE>
__device__ __forceinline__ int4 n_entry(const ConvGemmShape& g, int j, int end) {
  return MODE == 2 ? patch_entry<MODE>(g, j, end) : spatial_entry(g, j, end);
}

template <int MODE, int BM, int BN, int KG, int KS, int TK, int TM, int TN>
__device__ __forceinline__ void conv_igemm(const T* __restrict__ a_src, const T* __restrict__ img,
                                           T* __restrict__ out, const ConvGemmShape& g) {
  constexpr int BK = KS * KG, CT = (BM / TM) * (BN / TN), NT = KG * CT, WARPS = NT / 32;
  constexpr int RM = TM / 4, RN = TN / 4;  // runs of 4 rows (columns) per thread, BM / RM (BN / RN) apart
  constexpr int A_PER = BM * BK / NT, B_PER = BK * BN / NT;
  constexpr bool K_FAST = MODE == 2;  // B's contiguous axis: K (grad_weight) or N
  static_assert((TM == 4 || TM == 8) && (TN == 4 || TN == 8) && BM % (4 * TM) == 0 && BN % (4 * TN) == 0 && KS % 16 == 0 && NT % 32 == 0 && NT % BN == 0 && TK % BK == 0,
                "tile shape");
  static_assert(KG == 1 || (KG - 1) * BM * BN <= 2 * BK * (BM + 4), "group sums must fit in As");
  __shared__ __align__(16) T As[2][BK][BM + 4];
  __shared__ __align__(16) T Bs[2][BK][BN + 4];
  __shared__ int4 ktab[TK];
  __shared__ int4 ntab[BN];

  const int t = threadIdx.x;
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
  const int k_begin = blockIdx.z * g.k_chunk;
  const int k_end = min(g.k, k_begin + g.k_chunk);
  const int grp = t / CT, tc = t - grp * CT, ty = tc / (BN / TN), tx = tc - ty * (BN / TN);
  // This thread's row i and column j of the tile.
  auto row = [&](int i) { return (i / 4) * (BM / RM) + ty * 4 + (i & 3); };
  auto col = [&](int j) { return (j / 4) * (BN / RN) + tx * 4 + (j & 3); };
  // Load j of this thread along K: row (k) and column (m or n) of the 8 x 4 block
  // warp + j * WARPS of the tile's (BK / 8) x (columns / 4) blocks.
  // (When the warps span whole rows of blocks, k does not depend on j: one table entry per step.)
  constexpr unsigned KB = BK / 8;
  auto k_of = [&](int j) -> int {
    const unsigned kb = WARPS % KB == 0 ? warp % KB : (warp + (unsigned)j * WARPS) % KB;
    return (int)(kb * 8 + (lane & 7u));
  };
  auto col_of = [&](int j) -> int {
    const unsigned cb = WARPS % KB == 0 ? warp / KB + (unsigned)j * (WARPS / KB) : (warp + (unsigned)j * WARPS) / KB;
    return (int)(cb * 4 + (lane >> 3));
  };

  for (int i = t; i < BN; i += NT) ntab[i] = n_entry<MODE>(g, n0 + i, g.n);
  __syncthreads();
  int4 nent[B_PER];  // B load j: (k, n) = (k_of(j), col_of(j)) or (t / BN + j * NT / BN, t % BN)
#pragma unroll
  for (int j = 0; j < B_PER; ++j) nent[j] = ntab[K_FAST ? col_of(j) : t % BN];

  T acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = T(0);
  T ra[A_PER], rb[B_PER];

  auto load_tiles = [&](int step) {
    const int kk0 = step * BK;
#pragma unroll
    for (int j = 0; j < A_PER; ++j) {
      const int aux = ktab[kk0 + k_of(j)].w;
      const int m = m0 + col_of(j);
      ra[j] = aux >= 0 && m < g.m ? a_src[aux + m * g.a_ms] : T(0);
    }
#pragma unroll
    for (int j = 0; j < B_PER; ++j) {
      const int4 ke = ktab[kk0 + (K_FAST ? k_of(j) : t / BN + j * (NT / BN))];
      const int h = ke.y + nent[j].y, w = ke.z + nent[j].z;
      rb[j] = (unsigned)h < (unsigned)g.img_h && (unsigned)w < (unsigned)g.img_w ? img[ke.x + nent[j].x] : T(0);
    }
  };
  auto store_tiles = [&](int buf) {
#pragma unroll
    for (int j = 0; j < A_PER; ++j) As[buf][k_of(j)][col_of(j)] = ra[j];
#pragma unroll
    for (int j = 0; j < B_PER; ++j) {
      if (K_FAST) Bs[buf][k_of(j)][col_of(j)] = rb[j];
      else Bs[buf][t / BN + j * (NT / BN)][t % BN] = rb[j];
    }
  };
  auto compute = [&](int buf) {
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      T a[RM][4], b[RN][4];
#pragma unroll
      for (int r = 0; r < RM; ++r) load4(&As[buf][grp * KS + kk][r * (BM / RM) + ty * 4], a[r]);
#pragma unroll
      for (int r = 0; r < RN; ++r) load4(&Bs[buf][grp * KS + kk][r * (BN / RN) + tx * 4], b[r]);
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i / 4][i & 3] * b[j / 4][j & 3];
    }
  };

  for (int c0 = k_begin; c0 < k_end; c0 += TK) {
    const int c1 = min(k_end, c0 + TK);
    const int steps = (c1 - c0 + BK - 1) / BK;
    __syncthreads();  // the previous chunk's last reads of ktab and the tiles are done
    for (int i = t; i < steps * BK; i += NT) ktab[i] = k_entry<MODE>(g, c0 + i, c1);
    __syncthreads();
    load_tiles(0);
    store_tiles(0);
    __syncthreads();
    for (int step = 0; step < steps; ++step) {
      if (step + 1 < steps) load_tiles(step + 1);
      compute(step & 1);
      if (step + 1 < steps) store_tiles((step + 1) & 1);
      __syncthreads();
    }
  }

  if (KG > 1) {  // group 0 adds the other groups' sums, in group order
    T* red = &As[0][0][0];
    __syncthreads();
    if (grp > 0)
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) red[((grp - 1) * BM + row(i)) * BN + col(j)] = acc[i][j];
    __syncthreads();
    if (grp == 0)
      for (int q = 1; q < KG; ++q)
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
          for (int j = 0; j < TN; ++j) acc[i][j] += red[((q - 1) * BM + row(i)) * BN + col(j)];
  }
  if (grp != 0) return;
  out += (size_t)blockIdx.z * (size_t)g.m * (size_t)g.n;
#pragma unroll
  for (int r = 0; r < RN; ++r) {  // each run of 4 columns: one 4-wide store per row where they are adjacent
    int4 ne[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) ne[j] = ntab[col(r * 4 + j)];
    const bool run = ne[0].w >= 0 && ne[3].w == ne[0].w + 3 && ne[1].w == ne[0].w + 1 && ne[2].w == ne[0].w + 2;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int m = m0 + row(i);
      if (m >= g.m) continue;
      T* dst = out + m * g.c_ms;
      T v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = acc[i][r * 4 + j];
      if (run && ((size_t)(dst + ne[0].w) & 15) == 0) {
        store4(dst + ne[0].w, v);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (ne[j].w >= 0) dst[ne[j].w] = v[j];
      }
    }
  }
}
)";

const char* mode_name(IgemmMode mode) {
  switch (mode) {
    case IgemmMode::forward:
      return "fwd";
    case IgemmMode::grad_input:
      return "dgrad";
    case IgemmMode::grad_weight:
      return "wgrad";
  }
  return "?";
}

}  // namespace

std::string conv_igemm_name(IgemmMode mode, IgemmTile tile, DType dtype) {
  return fmt::format("kiln_conv_igemm_{}_{}x{}x{}k{}t{}x{}_{}", mode_name(mode), tile.bm, tile.bn,
                     tile.kg, tile.ks, tile.tm, tile.tn, dtype_name(dtype));
}

int igemm_threads(IgemmTile tile) {
  return tile.tm > 0 && tile.tn > 0 ? tile.kg * (tile.bm / tile.tm) * (tile.bn / tile.tn) : 0;
}

namespace {

// Shared memory of a tile with a K table of `table` entries.
std::size_t igemm_shared(IgemmTile tile, DType dtype, std::size_t table) {
  const std::size_t t = dtype_size(dtype), bk = static_cast<std::size_t>(tile.ks) * tile.kg;
  return 2 * bk * (tile.bm + 4) * t + 2 * bk * (tile.bn + 4) * t + (table + tile.bn) * 16;
}

// The K table's entries: the most of 1024, 512, 256 that fits 48 KiB (0: none fits).
int igemm_table(IgemmTile tile, DType dtype) {
  for (int table : {1024, 512, 256})
    if (igemm_shared(tile, dtype, table) <= 48 * 1024 && table % (tile.ks * tile.kg) == 0)
      return table;
  return 0;
}

}  // namespace

std::size_t igemm_static_shared_bytes(IgemmTile tile, DType dtype) {
  const int table = igemm_table(tile, dtype);
  return table > 0 ? igemm_shared(tile, dtype, table) : 0;
}

bool igemm_tile_valid(IgemmTile tile, DType dtype) {
  if ((tile.tm != 4 && tile.tm != 8) || (tile.tn != 4 && tile.tn != 8)) return false;
  if (tile.bm < 16 || tile.bn < 16 || tile.kg < 1 || tile.bm % (4 * tile.tm) != 0 ||
      tile.bn % (4 * tile.tn) != 0)
    return false;
  if (tile.ks != 16 && tile.ks != 32) return false;
  const int threads = igemm_threads(tile);
  // 64 threads at least: the kernel registry sizes blocks from 64 up to the kernel's bound.
  if (threads < 64 || threads > 1024 || threads % 32 != 0 || threads % tile.bn != 0) return false;
  if (tile.kg > 1 && (tile.kg - 1) * tile.bm * tile.bn > 2 * tile.ks * tile.kg * (tile.bm + 4))
    return false;
  return igemm_table(tile, dtype) > 0;
}

gpu::KernelSource conv_igemm_source(IgemmMode mode, IgemmTile tile, DType dtype) {
  KILN_CHECK(
      igemm_tile_valid(tile, dtype),
      "conv implicit GEMM: no kernel for the {}x{}x{} tile (K step {}, {}x{} per thread) in {}",
      tile.bm, tile.bn, tile.kg, tile.ks, tile.tm, tile.tn, dtype_name(dtype));
  const std::string name = conv_igemm_name(mode, tile, dtype);
  std::string code =
      fmt::format("typedef {} T;\n{}{}", cuda_type_name(dtype), kConvGemmShapeStruct, kConvIgemm);
  code += fmt::format(R"(
extern "C" __global__ void __launch_bounds__({1}) {0}(const T* __restrict__ a, const T* __restrict__ img,
                                                     T* __restrict__ out, ConvGemmShape g) {{
  conv_igemm<{2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}>(a, img, out, g);
}}
)",
                      name, igemm_threads(tile), static_cast<int>(mode), tile.bm, tile.bn, tile.kg,
                      tile.ks, igemm_table(tile, dtype), tile.tm, tile.tn);
  return {name, code, {}};
}

// out[i] = sum over z of part[z * mn + i], z ascending within each of blockDim.y lanes
// (lane y takes z = y, y + blockDim.y, ...), then the lanes in order: a fixed order for a
// given (splits, blockDim.y). Blocks of (32, lanes) threads, 32 outputs each.
gpu::KernelSource conv_splitk_sum_source(DType dtype) {
  const std::string name = fmt::format("kiln_conv_splitk_sum_{}", dtype_name(dtype));
  std::string code = fmt::format("typedef {} T;\n", cuda_type_name(dtype));
  code += fmt::format(R"(
extern "C" __global__ void {0}(const T* __restrict__ part, T* __restrict__ out, int mn, int splits) {{
  __shared__ T sums[32][33];
  const int i = blockIdx.x * 32 + threadIdx.x;
  T s = T(0);
  if (i < mn)
    for (int z = threadIdx.y; z < splits; z += blockDim.y) s += part[(size_t)z * mn + i];
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && i < mn) {{
    T total = sums[0][threadIdx.x];
    for (int y = 1; y < blockDim.y; ++y) total += sums[y][threadIdx.x];
    out[i] = total;
  }}
}}
)",
                      name);
  return {name, code, {}};
}

}  // namespace kiln::cuda
