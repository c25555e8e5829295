// Parameter blocks passed by value to the hand-written kernels. Each has a twin struct,
// field for field, in the kernel's CUDA C source (the *_STRUCT strings below).
#pragma once

#include <cstdint>

namespace kiln::cuda {

// One chunk of a convolution's images and its patch matrix `col`, element
// col[b * image_stride + ((c * KH + kh) * KW + kw) * row_stride + oh * OW + ow].
// Per-image layout [b][P][OH*OW]: image_stride = P*OH*OW, row_stride = OH*OW.
// Batch-folded layout [P][b][OH*OW]: image_stride = OH*OW, row_stride = images*OH*OW.
struct ConvShape {
  std::int64_t images, channels, height, width;
  std::int64_t kernel_h, kernel_w, stride, padding, out_h, out_w;
  std::int64_t row_stride, image_stride;
};
inline constexpr const char* kConvShapeStruct =
    "struct ConvShape { long long images, channels, height, width;"
    " long long kernel_h, kernel_w, stride, padding, out_h, out_w;"
    " long long row_stride, image_stride; };\n";

// One pass of a convolution as an implicit GEMM (conv_kernels.cpp): C[M, N] = A[M, K] B[K, N]
// where B is gathered from an NCHW "image" on the fly. Each GEMM index along the image's
// grid is "spatial" (b, oh, ow) over a [*, M, s_hw] output-like tensor; each index along
// the filter is a "patch" (c, kh, kw). Forward and grad_input: N spatial, K patch;
// grad_weight: K spatial, N patch, its K range split over blockIdx.z in k_chunk pieces.
// All offsets fit 32 bits (the host checks). a_ms, c_ms: A's and C's stride along M.
struct ConvGemmShape {
  std::int32_t m, n, k, k_chunk;
  std::int32_t s_hw, s_w, stride, pad_h, pad_w;
  std::int32_t img_chw, img_hw, img_h, img_w;
  std::int32_t khkw, kw, a_ms, c_ms;
};
inline constexpr const char* kConvGemmShapeStruct =
    "struct ConvGemmShape { int m, n, k, k_chunk; int s_hw, s_w, stride, pad_h, pad_w;"
    " int img_chw, img_hw, img_h, img_w; int khkw, kw, a_ms, c_ms; };\n";

// x: [planes, H, W], square windows (graph/kernels/pool_cpu.h's PoolGeometry).
struct PoolShape {
  std::int64_t planes, height, width, kernel, stride, padding, out_h, out_w;
};
inline constexpr const char* kPoolShapeStruct =
    "struct PoolShape { long long planes, height, width, kernel, stride, padding, out_h, out_w; "
    "};\n";
// The same with 32-bit fields, for planes * H * W < 2^30 (the fast kernels).
struct PoolShape32 {
  std::int32_t planes, height, width, kernel, stride, padding, out_h, out_w;
};
inline constexpr const char* kPoolShape32Struct =
    "struct PoolShape32 { int planes, height, width, kernel, stride, padding, out_h, out_w; };\n";

// y[i] = x[sum_d coord_d(i) * src_strides[d]], coords of i in y's dims (row-major).
inline constexpr int kMaxTransposeRank = 8;
struct TransposeShape {
  std::int64_t dims[kMaxTransposeRank];
  std::int64_t src_strides[kMaxTransposeRank];
  std::int32_t rank;
};
inline constexpr const char* kTransposeShapeStruct =
    "struct TransposeShape { long long dims[8]; long long src_strides[8]; int rank; };\n";

// Up to kConcatPieces pieces of a concat, one launch: piece k fills columns [end[k-1], end[k])
// (end[-1] = 0) of every row of its range of the output (concat kernel, layout_kernels.cpp).
inline constexpr int kConcatPieces = 32;
struct ConcatPieces {
  const void* src[kConcatPieces];
  std::int64_t end[kConcatPieces];
  std::int32_t count;
};
inline constexpr const char* kConcatPiecesStruct =
    "struct ConcatPieces { const void* src[32]; long long end[32]; int count; };\n";

}  // namespace kiln::cuda
