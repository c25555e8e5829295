// The channels-last copy of images, xt[b, pix, c] = x[b, c, pix] (the convolutions' NHWC
// operands and transpose's [B][C][HW] planes; layout.cpp's nchw_to_nhwc picks the form):
//
// - tiled: 64 channels by 64 pixels of one image through shared memory, each thread reading two
//   pixels and writing two channels as one pair (128 or 256 contiguous bytes a warp both ways);
//   grid (HW/64, C/64, B), 256 threads. Any even channel count, 16- or 32-bit elements.
// - wide (16-bit elements, channels and pixels a multiple of 8, both pointers 16-byte aligned):
//   a thread moves 8 channels by 8 pixels, eight 16-byte loads (a channel's 8 pixels each), a
//   transpose in registers, eight 16-byte stores (a pixel's 8 channels each), and no shared
//   memory. The pixels are the batch's, q = b HW + pix (a run of 8 never crosses an image), so
//   small planes (4 x 4) fill whole warps. A warp is 4 groups of 8 channels by 8 runs of 8
//   pixels, lane = 8 group + run: a load reads 4 rows of 128 contiguous bytes, a store 8 pixels'
//   64 contiguous bytes. Warps take 32 channels by 64 pixels, the channels fastest, so a block
//   writes its pixels' whole rows of xt. Grid: ceil(warps / 8) blocks of 256.
//
// KILN_U: the element's unsigned type.
#pragma once

namespace kiln::cuda {

template <typename U>
struct NhwcPair;
template <>
struct NhwcPair<unsigned short> {
  using type = ushort2;
};
template <>
struct NhwcPair<unsigned> {
  using type = uint2;
};

template <typename U>
__device__ __forceinline__ void nchw_to_nhwc_tiled(const U* __restrict__ x, U* __restrict__ xt,
                                                   int channels, int hw) {
  using Pair = typename NhwcPair<U>::type;
  __shared__ U tile[64][66];
  const long long image = (long long)blockIdx.z * channels * hw;
  const int p0 = blockIdx.x * 64, c0 = blockIdx.y * 64, lane = threadIdx.x % 32;
  const bool pairs = hw % 2 == 0;  // rows of x start pair-aligned
  for (int r = threadIdx.x / 32; r < 64; r += 8) {
    const int c = c0 + r, p = p0 + 2 * lane;
    U v0 = 0, v1 = 0;
    if (c < channels && pairs && p + 1 < hw) {
      const Pair v = *reinterpret_cast<const Pair*>(x + image + (long long)c * hw + p);
      v0 = v.x;
      v1 = v.y;
    } else if (c < channels) {
      if (p < hw) v0 = x[image + (long long)c * hw + p];
      if (p + 1 < hw) v1 = x[image + (long long)c * hw + p + 1];
    }
    tile[r][2 * lane] = v0;
    tile[r][2 * lane + 1] = v1;
  }
  __syncthreads();
  for (int r = threadIdx.x / 32; r < 64; r += 8) {
    const int p = p0 + r, c = c0 + 2 * lane;
    if (p >= hw || c >= channels) continue;  // channels even: c + 1 < channels too
    Pair v;
    v.x = tile[2 * lane][r];
    v.y = tile[2 * lane + 1][r];
    *reinterpret_cast<Pair*>(xt + image + (long long)p * channels + c) = v;
  }
}

// Word i of v (i a constant once unrolled: no local memory).
__device__ __forceinline__ unsigned uint4_word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ void nchw_to_nhwc_wide(const unsigned short* __restrict__ x,
                                                  unsigned short* __restrict__ xt, int channels,
                                                  int hw, long long pixels) {
  const int lane = threadIdx.x % 32;
  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int channel_pieces = (channels + 31) / 32;
  const long long pixel_piece = warp / channel_pieces;
  const int c = (int)(warp - pixel_piece * channel_pieces) * 32 + (lane / 8) * 8;
  const long long q = (pixel_piece * 8 + lane % 8) * 8;
  if (c >= channels || q >= pixels) return;
  const long long b = q / hw;
  const int p = (int)(q - b * hw);
  const uint4* src = reinterpret_cast<const uint4*>(x + (b * channels + c) * hw + p);
  const int row = hw / 8;  // a channel's row of x in 16-byte units
  uint4 in[8];             // in[k]: channel c + k's 8 pixels, two a word
#pragma unroll
  for (int k = 0; k < 8; ++k) in[k] = src[(long long)k * row];
  uint4* dst = reinterpret_cast<uint4*>(xt + q * channels + c);
  const int pitch = channels / 8;  // a pixel's row of xt in 16-byte units
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    // Pixel j's channels 2m and 2m + 1: the low (j even) or high halves of word j / 2 of
    // in[2m] and in[2m + 1].
    const unsigned select = j % 2 == 0 ? 0x5410u : 0x7632u;
    const auto pair = [&](int m) {
      return __byte_perm(uint4_word(in[2 * m], j / 2), uint4_word(in[2 * m + 1], j / 2), select);
    };
    dst[(long long)j * pitch] = make_uint4(pair(0), pair(1), pair(2), pair(3));
  }
}

}  // namespace kiln::cuda

#ifdef KILN_NHWC_IMAGE
// wide (16-bit elements only) picks the form; the grid is the form's (nchw_to_nhwc in
// layout.cpp).
extern "C" __global__ void __launch_bounds__(256)
    KILN_NHWC_IMAGE(const KILN_U* __restrict__ x, KILN_U* __restrict__ xt, int channels, int hw,
                    long long pixels, int wide) {
  KILN_AFTER_PRIOR_GRIDS();
  if (sizeof(KILN_U) == 2 && wide)
    kiln::cuda::nchw_to_nhwc_wide(reinterpret_cast<const unsigned short*>(x),
                                  reinterpret_cast<unsigned short*>(xt), channels, hw, pixels);
  else
    kiln::cuda::nchw_to_nhwc_tiled<KILN_U>(x, xt, channels, hw);
}
#endif
