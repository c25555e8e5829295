// The parameter blocks of the convolution kernels (conv.cuh, conv_igemm.cuh), passed by value:
// the one definition that the host code and NVRTC both compile (plain C++, no includes).
#pragma once

namespace kiln::cuda {

// The most columns of taps (KW) the TMA pass's halo form takes: its barriers' array
// (conv_wgmma_tma_halo.cuh) and the host's fit (conv_tma_halo_tile).
constexpr int kHaloMaxTapsW = 7;

// One chunk of a convolution's images and its patch matrix `col`, element
// col[b * image_stride + ((c * KH + kh) * KW + kw) * row_stride + oh * OW + ow].
// Per-image layout [b][P][OH*OW]: image_stride = P*OH*OW, row_stride = OH*OW.
// Batch-folded layout [P][b][OH*OW]: image_stride = OH*OW, row_stride = images*OH*OW.
struct ConvShape {
  long long images, channels, height, width;
  long long kernel_h, kernel_w, stride, padding, out_h, out_w;
  long long row_stride, image_stride;
};
static_assert(sizeof(ConvShape) == 12 * 8, "ConvShape: twelve 64-bit fields, no padding");

// One pass of a convolution as an implicit GEMM (conv_igemm.cuh): C[M, N] = A[M, K] B[K, N]
// where B is gathered from an NCHW "image" on the fly. Each GEMM index along the image's
// grid is "spatial" (b, oh, ow) over a [*, M, s_hw] output-like tensor; each index along
// the filter is a "patch" (c, kh, kw). Forward and grad_input: N spatial, K patch;
// grad_weight: K spatial, N patch, its K range split over blockIdx.z in k_chunk pieces.
// All offsets fit 32 bits (the host checks). a_ms, c_ms: A's and C's stride along M.
struct ConvGemmShape {
  int m, n, k, k_chunk;
  int s_hw, s_w, stride, pad_h, pad_w;
  int img_chw, img_hw, img_h, img_w;
  int khkw, kw, a_ms, c_ms;
};
static_assert(sizeof(ConvGemmShape) == 17 * 4, "ConvGemmShape: seventeen 32-bit fields");

// The input gradient's filter as `count` classes of taps. With stride s, dx's pixel (s a + rh,
// s b + rw) takes only the taps kh = rh + pad (mod s), kw likewise: each class of pixels (rh,
// rw) is a stride-1 convolution of dy over a grid of H / s x W / s pixels with taps_h x taps_w
// of the flipped filter, kh = first_kh + s (taps_h - 1 - j) for its j-th row of taps, reading
// dy's row a + j - pad_h (pad_h may be negative). count 1, stride 1: the whole flipped filter
// (kh = KH - 1 - j). The classes' taps lie one after another along K (class-major, tap-major
// within a class, dy's channels within a tap); a class's pixel p (row p / s_w, column p % s_w
// of its grid) is dx's out_offset[c] + row * row_pitch + column * stride of an image of `plane`
// pixels. A class without taps (a 1x1 filter's odd pixels) is zeros.
struct ConvClasses {
  int count, stride, kernel_w, plane, row_pitch;
  int taps_h[4], taps_w[4], first_kh[4], first_kw[4], pad_h[4], pad_w[4], out_offset[4];
};
static_assert(sizeof(ConvClasses) == 33 * 4, "ConvClasses: thirty-three 32-bit fields");

#ifdef __CUDACC_RTC__
#define KILN_CONV_BOTH __host__ __device__
#else
#define KILN_CONV_BOTH
#endif
// TF32's TMA weight gradient (conv_wgmma_wgrad_tma.cuh) over the output's rows (OH*OW a
// multiple of 32) at stride 1 with the output as wide as x: the centre tap's column (kw = pad)
// is x's own, so it is boxed from x, and x's tap columns hold the other KW - 1.
KILN_CONV_BOTH inline bool tf32_centre_from_x(const ConvGemmShape& g) {
  return g.stride == 1 && g.s_hw % 32 == 0 && g.img_w == g.s_w && g.pad_w >= 0 && g.pad_w < g.kw;
}

// The filter tap (kh KW + kw) that the input gradient's K tap t holds: the classes' taps one
// after another (ConvClasses).
KILN_CONV_BOTH inline int class_source_tap(const ConvClasses& cl, int t) {
  int c = 0;
  for (; c + 1 < cl.count && t >= cl.taps_h[c] * cl.taps_w[c]; ++c)
    t -= cl.taps_h[c] * cl.taps_w[c];
  const int jh = t / cl.taps_w[c], jw = t - jh * cl.taps_w[c];
  return (cl.first_kh[c] + cl.stride * (cl.taps_h[c] - 1 - jh)) * cl.kernel_w + cl.first_kw[c] +
         cl.stride * (cl.taps_w[c] - 1 - jw);
}
#undef KILN_CONV_BOTH

// The channels-last copy of a filter (conv_mma_nhwc.cuh, nhwc_weights): the filter tap that each
// of its KH*KW taps holds, in the order the pass reads them (graph/ops.h, conv_filter_layout).
constexpr int kMaxFilterTaps = 256;
struct FilterTaps {
  int source[kMaxFilterTaps];
};
static_assert(sizeof(FilterTaps) == kMaxFilterTaps * 4, "FilterTaps: 32-bit taps, no padding");
// Filters of one size copied so in one launch: each copy's filter w and its layout a, rows x
// cols of them (the layout's rows: filters or input channels), a block a chunk of one row's
// columns, the copy's blocks from first_block on.
constexpr int kMaxFilterCopies = 24;
struct FilterCopy {
  const void* w;
  void* a;
  int rows, cols, chunk, first_block;
};
struct FilterCopies {
  int count, khkw;
  FilterCopy copy[kMaxFilterCopies];
};
static_assert(sizeof(FilterCopy) == 32 && sizeof(FilterCopies) == 8 + kMaxFilterCopies * 32,
              "FilterCopies: no padding");

}  // namespace kiln::cuda
