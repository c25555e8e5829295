// The parameter blocks of the convolution kernels (conv.cuh, conv_igemm.cuh), passed by value:
// the one definition that the host code and NVRTC both compile (plain C++, no includes).
#pragma once

namespace kiln::cuda {

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

}  // namespace kiln::cuda
