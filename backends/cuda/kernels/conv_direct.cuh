// The direct forward convolution of images with few channels (a network's first layer, the
// "stem": 3 -> 64 channels at 3x3; conv_direct.cpp chooses it). As an implicit GEMM its K is
// C KH KW = 27, too short for a tensor-core tile's pipeline to start (the NCHW gather kernel
// took 131 us at batch 512 on an H100, 14 TFLOP/s), so this kernel multiplies on the CUDA
// cores from shared memory instead.
//
// The host defines KILN_T (float, kiln::cuda::Bf16 or F16), the geometry's constants
// KILN_DIRECT_C (channels), KILN_DIRECT_KH, KILN_DIRECT_KW and KILN_DIRECT_S (stride), and
// KILN_CONV_DIRECT, the kernel's name.
// A block takes KILN_DIRECT_F filters (blockIdx.y's) of `th` output rows of one image
// (blockIdx.x: image * tiles + tile). It copies the tile's input rows, widened to f32 with the
// padding as zeros, and its filters' weights, laid [tap][filter] so that a thread reads a tap's
// filters as four float4 broadcasts, into shared memory. A thread then takes 4 adjacent output
// columns of one row (th rows x groups of 4 columns <= 256 threads): per (c, kh) it loads the run
// of input columns they cover (float4 loads, 16-byte aligned because a run starts at 4 S columns a
// thread) and multiplies each tap kw into 4 x F accumulators, summing c, kh, kw in that order (one
// fixed order: the same bits every run). Outputs are stored NCHW, rounded once, 4 columns at a time
// where the row allows.
#pragma once

#include "backends/cuda/kernels/storage.cuh"

#define KILN_DIRECT_F 16  // filters a block
#define KILN_DIRECT_P 4   // adjacent output columns a thread

// The input run a thread reads per (c, kh): its 4 columns' windows, in float4s.
#define KILN_DIRECT_RUN(S, KW) ((((KILN_DIRECT_P - 1) * (S) + (KW)) + 3) / 4 * 4)

#ifdef KILN_CONV_DIRECT
namespace kiln::cuda {

// The tile's rows of x inside the image, widened to f32, into the zeroed image tile: one
// contiguous run of `valid` rows a channel, in 16-byte pieces where `pieces` (w a multiple of a
// piece's elements, x 16-byte aligned), so that a thread's loads are all in flight at once.
template <typename T, int C>
__device__ __forceinline__ void direct_copy_rows(const T* __restrict__ x, float* image, int b,
                                                 int h, int w, int pad, int in_row0, int rows,
                                                 int cols, bool pieces) {
  const int first = max(in_row0, 0), valid = min(in_row0 + rows, h) - first;
  if (valid <= 0) return;
  const int per_channel = valid * w, skip = first - in_row0;
  const T* source = x + (static_cast<long long>(b) * C * h + first) * w;
  auto place = [&](int c, int e) -> float* {  // element e of channel c's run
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
      float* to = place(c, e);  // (a piece lies in one row: w % E == 0)
#pragma unroll
      for (int k = 0; k < E; ++k) to[k] = static_cast<float>(values[k]);
    }
    return;
  }
#pragma unroll 4
  for (int i = threadIdx.x; i < C * per_channel; i += blockDim.x) {
    const int c = i / per_channel, e = i - c * per_channel;
    *place(c, e) = static_cast<float>(source[static_cast<long long>(c) * h * w + e]);
  }
}

// conv2d_moments' run moments of 64 pixels (count, mean and squared deviations, [3, runs, co]),
// from a half-warp's 16 x 4 outputs of filter f as rounded: the half-warp's lanes are one run
// (the host's plan: ow % 4 == 0, runs that start a tile's rows and end within its image).
__device__ __forceinline__ void direct_run_moments(float* __restrict__ moments, const float (&v)[4],
                                                   long long run, long long runs, int co, int f) {
  const unsigned half = 0xffffu << (threadIdx.x & 16u);
  float sum = 0.0f;
#pragma unroll
  for (int p = 0; p < 4; ++p) sum += v[p];
#pragma unroll
  for (int mask = 1; mask < 16; mask <<= 1) sum += __shfl_xor_sync(half, sum, mask);
  const float mean = sum / 64.0f;
  float squares = 0.0f;
#pragma unroll
  for (int p = 0; p < 4; ++p) squares += (v[p] - mean) * (v[p] - mean);
#pragma unroll
  for (int mask = 1; mask < 16; mask <<= 1) squares += __shfl_xor_sync(half, squares, mask);
  if ((threadIdx.x & 15u) == 0u) {
    const long long at = run * co + f, plane = runs * co;
    moments[at] = 64.0f;
    moments[plane + at] = mean;
    moments[2 * plane + at] = squares;
  }
}

// x [B, C, h, w], wt [co, C, KH, KW], y [B, co, oh, ow]; rows x cols: a tile's input in shared
// memory (rows = (th - 1) S + KH; cols at least 4 S (groups - 1) + KILN_DIRECT_RUN and pad + w,
// a multiple of 4). flags: 1, y's rows take whole 4-column stores (ow % 4 == 0, y 16-byte aligned);
// 2, x's rows load in 16-byte pieces (direct_copy_rows). moments: where not null, y's run moments
// too (runs of them in all; direct_run_moments).
extern "C" __global__ void __launch_bounds__(256, 2)
    KILN_CONV_DIRECT(const KILN_T* __restrict__ x, const KILN_T* __restrict__ wt,
                     KILN_T* __restrict__ y, float* __restrict__ moments, int h, int w, int pad,
                     int oh, int ow, int co, int th, int tiles, int rows, int cols, int flags,
                     long long runs) {
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
  direct_copy_rows<KILN_T, C>(x, image, b, h, w, pad, row0 * S - pad, rows, cols, flags & 2);
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
#pragma unroll
      for (int q = 0; q < RUN / 4; ++q) {
        const float4 four = line[q];
        v[4 * q] = four.x;
        v[4 * q + 1] = four.y;
        v[4 * q + 2] = four.z;
        v[4 * q + 3] = four.w;
      }
#pragma unroll
      for (int kw = 0; kw < KW; ++kw) {
        const float4* tap =
            reinterpret_cast<const float4*>(weights + ((c * KH + kh) * KW + kw) * F);
        float wf[F];
#pragma unroll
        for (int q = 0; q < F / 4; ++q) {
          const float4 four = tap[q];
          wf[4 * q] = four.x;
          wf[4 * q + 1] = four.y;
          wf[4 * q + 2] = four.z;
          wf[4 * q + 3] = four.w;
        }
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int f = 0; f < F; ++f) acc[p][f] = fmaf(v[p * S + kw], wf[f], acc[p][f]);
      }
    }
  const int oh_row = row0 + r;
  const long long run = (static_cast<long long>(b) * oh * ow + row0 * ow) / 64 + item / 16;
#pragma unroll
  for (int f = 0; f < F; ++f) {
    if (f0 + f >= co) break;  // (the same for every thread: a run's lanes all take part)
    KILN_T* out = y + ((static_cast<long long>(b) * co + f0 + f) * oh + oh_row) * ow + col0;
    __align__(16) KILN_T four[P];
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
    if (moments != nullptr) {
      float rounded[P];
#pragma unroll
      for (int p = 0; p < P; ++p) rounded[p] = static_cast<float>(four[p]);
      direct_run_moments(moments, rounded, run, runs, co, f0 + f);
    }
  }
}

}  // namespace kiln::cuda
#endif
