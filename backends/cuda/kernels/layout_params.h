// The parameter blocks of the layout kernels (layout.cuh), passed by value: the one
// definition that the host code and NVRTC both compile.
#pragma once

namespace kiln::cuda {

// y[i] = x[sum_d coord_d(i) * src_strides[d]], coords of i in y's dims (row-major).
inline constexpr int kMaxTransposeRank = 8;
struct TransposeShape {
  long long dims[kMaxTransposeRank];
  long long src_strides[kMaxTransposeRank];
  int rank;
};
static_assert(sizeof(TransposeShape) == 17 * 8,
              "TransposeShape: 16 64-bit fields and a padded int");

// Up to kConcatPieces pieces of a concat, one launch: piece k fills columns [end[k-1], end[k])
// (end[-1] = 0) of every row of its range of the output (concat kernel, layout.cuh).
inline constexpr int kConcatPieces = 32;
struct ConcatPieces {
  const void* src[kConcatPieces];
  long long end[kConcatPieces];
  int count;
};
static_assert(sizeof(ConcatPieces) == 65 * 8,
              "ConcatPieces: 64 pointers and offsets, a padded int");

}  // namespace kiln::cuda
