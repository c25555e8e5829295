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

// x: [planes, H, W], square windows.
struct PoolShape {
  std::int64_t planes, height, width, kernel, stride, out_h, out_w;
};
inline constexpr const char* kPoolShapeStruct =
    "struct PoolShape { long long planes, height, width, kernel, stride, out_h, out_w; };\n";

// y[i] = x[sum_d coord_d(i) * src_strides[d]], coords of i in y's dims (row-major).
inline constexpr int kMaxTransposeRank = 8;
struct TransposeShape {
  std::int64_t dims[kMaxTransposeRank];
  std::int64_t src_strides[kMaxTransposeRank];
  std::int32_t rank;
};
inline constexpr const char* kTransposeShapeStruct =
    "struct TransposeShape { long long dims[8]; long long src_strides[8]; int rank; };\n";

}  // namespace kiln::cuda
