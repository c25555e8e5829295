// The direct forward convolution of images with few channels (a network's first layer, the
// "stem": 3 -> 64 channels at 3x3; conv_direct.cpp chooses it). As an implicit GEMM its K is
// C KH KW = 27, too short for the GEMM kernels' tile pipelines (the NCHW gather kernel took 131
// us at batch 512 on an H100, 14 TFLOP/s): these kernels copy a tile of output rows' input into
// shared memory once and multiply from there, on the tensor cores for bf16 and f16 where K <= 64
// (KILN_CONV_DIRECT_MMA, below), else on the CUDA cores (KILN_CONV_DIRECT; the first form for
// every dtype, 96 us for the stem on the H100 in bf16, bound by issuing its instructions).
//
// The host defines KILN_T (float, kiln::cuda::Bf16 or F16), the geometry's constants
// KILN_DIRECT_C (channels), KILN_DIRECT_KH, KILN_DIRECT_KW and KILN_DIRECT_S (stride), and
// KILN_CONV_DIRECT or KILN_CONV_DIRECT_MMA, the kernel's name.
//
// KILN_CONV_DIRECT: a block takes KILN_DIRECT_F filters (blockIdx.y's) of `th` output rows of
// one image (blockIdx.x: image * tiles + tile). It copies the tile's input rows, widened to f32
// with the padding as zeros, and its filters' weights, laid [tap][filter] so that a thread reads a
// tap's filters as four float4 broadcasts, into shared memory. A thread then takes 4 adjacent
// output columns of one row (th rows x groups of 4 columns <= 256 threads): per (c, kh) it loads
// the run of input columns they cover (float4 loads, 16-byte aligned because a run starts at 4 S
// columns a thread) and multiplies each tap kw into 4 x F accumulators, summing c, kh, kw in that
// order (one fixed order: the same bits every run). Outputs are stored NCHW, rounded once, 4
// columns at a time where the row allows.
#pragma once

#include "backends/cuda/kernels/storage.cuh"

#define KILN_DIRECT_F 16  // filters a block
#define KILN_DIRECT_P 4   // adjacent output columns a thread

// The input run a thread reads per (c, kh): its 4 columns' windows, in float4s.
#define KILN_DIRECT_RUN(S, KW) ((((KILN_DIRECT_P - 1) * (S) + (KW)) + 3) / 4 * 4)

namespace kiln::cuda {

// The tile's rows of x inside the image, as D (f32, or T itself), into the zeroed image tile:
// one contiguous run of `valid` rows a channel, in 16-byte pieces where `pieces` (w a multiple of
// a piece's elements, x 16-byte aligned), so that a thread's loads are all in flight at once.
template <typename T, int C, typename D>
__device__ __forceinline__ void direct_copy_rows(const T* __restrict__ x, D* image, int b, int h,
                                                 int w, int pad, int in_row0, int rows, int cols,
                                                 bool pieces) {
  const int first = max(in_row0, 0), valid = min(in_row0 + rows, h) - first;
  if (valid <= 0) return;
  const int per_channel = valid * w, skip = first - in_row0;
  const T* source = x + (static_cast<long long>(b) * C * h + first) * w;
  auto place = [&](int c, int e) -> D* {  // element e of channel c's run
    const int r = e / w;
    return image + (c * rows + skip + r) * cols + pad + (e - r * w);
  };
  constexpr int E = 16 / sizeof(T);
  if (pieces) {
    const int count = per_channel / E;
    for (int i = threadIdx.x; i < C * count; i += blockDim.x) {
      const int c = i / count, e = (i - c * count) * E;
      const uint4 raw =
          *reinterpret_cast<const uint4*>(source + static_cast<long long>(c) * h * w + e);
      const T* values = reinterpret_cast<const T*>(&raw);
      D* to = place(c, e);  // (a piece lies in one row: w % E == 0)
#pragma unroll
      for (int k = 0; k < E; ++k) to[k] = static_cast<D>(values[k]);
    }
    return;
  }
#pragma unroll 4
  for (int i = threadIdx.x; i < C * per_channel; i += blockDim.x) {
    const int c = i / per_channel, e = i - c * per_channel;
    *place(c, e) = static_cast<D>(source[static_cast<long long>(c) * h * w + e]);
  }
}

// N floats (a multiple of 4) from shared memory as N / 4 float4 loads.
template <int N>
__device__ __forceinline__ void load_quads(float (&to)[N], const float4* from) {
#pragma unroll
  for (int q = 0; q < N / 4; ++q) {
    const float4 four = from[q];
    to[4 * q] = four.x;
    to[4 * q + 1] = four.y;
    to[4 * q + 2] = four.z;
    to[4 * q + 3] = four.w;
  }
}

}  // namespace kiln::cuda

#ifdef KILN_CONV_DIRECT
namespace kiln::cuda {

// x [B, C, h, w], wt [co, C, KH, KW], y [B, co, oh, ow]; rows x cols: a tile's input in shared
// memory (rows = (th - 1) S + KH; cols at least 4 S (groups - 1) + KILN_DIRECT_RUN and pad + w,
// a multiple of 4). flags: 1, y's rows take whole 4-column stores (ow % 4 == 0, y 16-byte aligned);
// 2, x's rows load in 16-byte pieces (direct_copy_rows); 4, ReLU as y is stored. bias [co] (or
// null: none) is added to each filter's sums before the ReLU (conv2d_bias's epilogue: the bits
// of the sum rounded, then the add and relu ops, where T is float).
extern "C" __global__ void __launch_bounds__(256, 2)
    KILN_CONV_DIRECT(const KILN_T* __restrict__ x, const KILN_T* __restrict__ wt,
                     const KILN_T* __restrict__ bias, KILN_T* __restrict__ y, int h, int w, int pad,
                     int oh, int ow, int co, int th, int tiles, int rows, int cols, int flags) {
  KILN_AFTER_PRIOR_GRIDS();
  constexpr int C = KILN_DIRECT_C, KH = KILN_DIRECT_KH, KW = KILN_DIRECT_KW, S = KILN_DIRECT_S;
  constexpr int F = KILN_DIRECT_F;
  constexpr int P = KILN_DIRECT_P, TAPS = C * KH * KW, RUN = KILN_DIRECT_RUN(S, KW);
  extern __shared__ float4 shared4[];
  float* weights = reinterpret_cast<float*>(shared4);  // [TAPS][F]
  float* image = weights + TAPS * F;                   // [C][rows][cols]
  const int b = blockIdx.x / tiles, row0 = (blockIdx.x - b * tiles) * th;
  const int f0 = blockIdx.y * F;
  for (int i = threadIdx.x; i < C * rows * cols / 4; i += blockDim.x)  // the padding's zeros
    shared4[TAPS * F / 4 + i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int i = threadIdx.x; i < TAPS * F; i += blockDim.x) {
    const int tap = i / F, f = i - tap * F;
    weights[i] =
        f0 + f < co ? static_cast<float>(wt[static_cast<long long>(f0 + f) * TAPS + tap]) : 0.0f;
  }
  __syncthreads();
  direct_copy_rows<KILN_T, C, float>(x, image, b, h, w, pad, row0 * S - pad, rows, cols, flags & 2);
  __syncthreads();
  // One item a thread (th x groups <= the block's threads: the host's plan). A loop over items
  // would have the compiler keep every tap's weights in registers across its iterations.
  const int groups = (ow + P - 1) / P, item = threadIdx.x, r = item / groups;
  if (r >= min(th, oh - row0)) return;
  const int col0 = (item - r * groups) * P;
  float acc[P][F];
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int f = 0; f < F; ++f) acc[p][f] = 0.0f;
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int kh = 0; kh < KH; ++kh) {
      const float4* line =
          reinterpret_cast<const float4*>(image + (c * rows + r * S + kh) * cols + col0 * S);
      float v[RUN];
      load_quads(v, line);
#pragma unroll
      for (int kw = 0; kw < KW; ++kw) {
        const float4* tap =
            reinterpret_cast<const float4*>(weights + ((c * KH + kh) * KW + kw) * F);
        float wf[F];
        load_quads(wf, tap);
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int f = 0; f < F; ++f) acc[p][f] = fmaf(v[p * S + kw], wf[f], acc[p][f]);
      }
    }
  const int oh_row = row0 + r;
#pragma unroll
  for (int f = 0; f < F; ++f) {
    if (f0 + f >= co) break;
    KILN_T* out = y + ((static_cast<long long>(b) * co + f0 + f) * oh + oh_row) * ow + col0;
    __align__(16) KILN_T four[P];
    if (bias != nullptr) {
      const float b = static_cast<float>(bias[f0 + f]);
#pragma unroll
      for (int p = 0; p < P; ++p) acc[p][f] = static_cast<float>(KILN_T(acc[p][f])) + b;
    }
    if (flags & 4)
#pragma unroll
      for (int p = 0; p < P; ++p) acc[p][f] = acc[p][f] > 0.0f ? acc[p][f] : 0.0f;
#pragma unroll
    for (int p = 0; p < P; ++p) four[p] = KILN_T(acc[p][f]);
    if (flags & 1) {  // (then ow % 4 == 0: the 4 columns lie in the row)
      if constexpr (sizeof(KILN_T) == 4)
        *reinterpret_cast<float4*>(out) = *reinterpret_cast<const float4*>(four);
      else
        *reinterpret_cast<uint2*>(out) = *reinterpret_cast<const uint2*>(four);
    } else {
#pragma unroll
      for (int p = 0; p < P; ++p)
        if (col0 + p < ow) out[p] = four[p];
    }
  }
}

}  // namespace kiln::cuda
#endif

#ifdef KILN_CONV_DIRECT_MMA
#include "backends/cuda/kernels/mma.cuh"

namespace kiln::cuda {

// The tensor-core form for bf16 and f16 where K = C KH KW <= 64 (a stem's 27): y[64 filters,
// pixels] = W[64, K] x patches[K, pixels] on mma.sync m16n8k16, K padded with zeros to KS steps
// of 16. A block takes 64 filters (blockIdx.y's) of `th` output rows of one image, the tile's
// input rows in shared memory as stored (zeros for the padding) and W's rows padded to KS 16 + 8
// elements. Each warp keeps W's fragments in registers and takes chunks of 32 of the tile's
// pixels in turn: per 8 pixels and K step it gathers its B fragment (four elements a lane, at
// offsets c rows cols + kh cols + kw from the pixel's window, made once), multiplies it into
// 4 x 16 filters, then rounds the chunk's 64 x 32 outputs into its staging tile (rows of 40
// elements), from which a filter's 32 pixels go out as four 16-byte stores (`flags` 1: the
// planes and tiles start 16-byte aligned; else element by element). One fixed order of the sums.
extern "C" __global__ void __launch_bounds__(256, 2)
    KILN_CONV_DIRECT_MMA(const KILN_T* __restrict__ x, const KILN_T* __restrict__ wt,
                         KILN_T* __restrict__ y, int h, int w, int pad, int oh, int ow, int co,
                         int th, int tiles, int rows, int cols, int flags) {
  KILN_AFTER_PRIOR_GRIDS();
  typedef KILN_T T;
  constexpr int C = KILN_DIRECT_C, KH = KILN_DIRECT_KH, KW = KILN_DIRECT_KW, S = KILN_DIRECT_S;
  constexpr int K = C * KH * KW, KS = (K + 15) / 16, AP = KS * 16 + 8, SP = 40;
  static_assert(KS <= 4, "K = C KH KW <= 64");
  extern __shared__ uint4 shared16[];
  T* filters = reinterpret_cast<T*>(shared16);  // [64][AP]
  T* stage = filters + 64 * AP;                 // [8 warps][64][SP]
  T* image = stage + 8 * 64 * SP;               // [C][rows][cols]
  const int b = blockIdx.x / tiles, row0 = (blockIdx.x - b * tiles) * th, f0 = blockIdx.y * 64;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = lane >> 2, pair = lane & 3;
  for (int i = threadIdx.x; i < C * rows * cols / 8; i += blockDim.x)  // the padding's zeros
    shared16[(64 * AP + 8 * 64 * SP) / 8 + i] = make_uint4(0u, 0u, 0u, 0u);
  for (int i = threadIdx.x; i < 64 * AP; i += blockDim.x) {
    const int m = i / AP, k = i - m * AP;
    filters[i] = f0 + m < co && k < K ? wt[static_cast<long long>(f0 + m) * K + k] : T(0.0f);
  }
  __syncthreads();
  direct_copy_rows<T, C, T>(x, image, b, h, w, pad, row0 * S - pad, rows, cols, flags & 2);
  __syncthreads();
  unsigned a[4][KS][4];  // W's fragments: 4 tiles of 16 filters x KS steps
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int m = mt * 16 + group + 8 * (q & 1), k = ks * 16 + pair * 2 + 8 * (q >> 1);
        a[mt][ks][q] = *reinterpret_cast<const unsigned*>(filters + m * AP + k);
      }
  int offset[KS][4];  // this lane's K rows (c, kh, kw) from a window's corner; -1 past K
#pragma unroll
  for (int ks = 0; ks < KS; ++ks)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int k = ks * 16 + pair * 2 + (q & 1) + 8 * (q >> 1);
      const int c = k / (KH * KW), kh = k / KW % KH, kw = k % KW;
      offset[ks][q] = k < K ? (c * rows + kh) * cols + kw : -1;
    }
  const unsigned short* bits = reinterpret_cast<const unsigned short*>(image);
  T* mine = stage + warp * 64 * SP;
  const int pixels = min(th, oh - row0) * ow, chunks = (pixels + 31) / 32;
  const long long plane = static_cast<long long>(oh) * ow;
  for (int chunk = warp; chunk < chunks; chunk += 8) {
    __syncwarp();  // (the previous chunk's stores have read the staging tile)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {  // 8 pixels: their sums, rounded into the staging tile
      const int n = chunk * 32 + nt * 8 + group, r = n / ow;
      const int corner = n < pixels ? r * S * cols + (n - r * ow) * S : -1;
      float acc[4][4];  // [filter tile][fragment]
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][e] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        unsigned v[4];
#pragma unroll
        for (int q = 0; q < 4; ++q)
          v[q] = corner >= 0 && offset[ks][q] >= 0 ? bits[corner + offset[ks][q]] : 0u;
        const unsigned b0 = v[0] | (v[1] << 16), b1 = v[2] | (v[3] << 16);
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) MmaOp<T>::run(acc[mt], a[mt][ks], b0, b1);
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const T lo(acc[mt][2 * half]), hi(acc[mt][2 * half + 1]);
          *reinterpret_cast<unsigned*>(mine + (mt * 16 + group + 8 * half) * SP + nt * 8 +
                                       pair * 2) = lo.bits | (static_cast<unsigned>(hi.bits) << 16);
        }
    }
    __syncwarp();
    const long long first = static_cast<long long>(row0) * ow + chunk * 32;
#pragma unroll
    for (int it = 0; it < 8; ++it) {
      const int m = it * 8 + (lane >> 2), q = lane & 3, n = chunk * 32 + q * 8;
      if (f0 + m >= co || n >= pixels) continue;
      T* out = y + (static_cast<long long>(b) * co + f0 + m) * plane + first + q * 8;
      const T* from = mine + m * SP + q * 8;
      if ((flags & 1) && n + 8 <= pixels)
        *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(from);
      else
        for (int e = 0; e < 8 && n + e < pixels; ++e) out[e] = from[e];
    }
  }
}

}  // namespace kiln::cuda
#endif
