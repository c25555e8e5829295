// fuse_conv_statistics: batch norm's statistics into the epilogue of the convolution they read
// (issue 17). Batch norm (graph/nn/batch_norm.cpp) sums d = y - k and d * d over every axis
// but the channels, k one value of each channel; where y is a conv2d's output, each sum is one
// more pass over y after the convolution has written it. This pass makes the convolution a
// conv2d_moments node (graph/ops.h), which also writes each channel's count n_t, mean m_t and
// squared deviations q_t over runs of 64 pixels (the GPU's TMA pass in its epilogue, from the
// tile in registers), and rewrites the two sums as sums over those runs:
//
//   sum(y - k)       = sum_t n_t (m_t - k)
//   sum((y - k)^2)   = sum_t q_t + n_t (m_t - k)^2
//
// exact identities whose terms have no large difference in them: the statistics group then
// reads [3, T, C] run moments, 1/16 of y's bf16 bytes, instead of y.
//
// Matched: a conv2d that `takes` picks, a sub(y, k) with k of shape [1, C, 1, 1], and both
// reduce_sum(d) and reduce_sum(d * d) over axes {0, 2, 3} with keepdims, each directly or
// through a cast to f32 (autocast's form). The sums are then computed in f32 from y as stored,
// where the unfused ops rounded d and d * d to y's dtype first: the same value to within that
// rounding (bf16: a relative 2^-9 a term, in no fixed direction).
//
// Pre: verify(g) holds, after autograd (conv2d_moments has no gradient). Post: verify holds;
// outputs and assignments refer to the same values.
#pragma once

#include <functional>
#include <span>

#include "graph/graph.h"

namespace kiln {

// Whether the conv2d node `conv` (its inputs' types `inputs`) should write its output's moments
// (the GPU's policy: where its TMA pass computes them in the epilogue).
using ConvMomentsWanted = std::function<bool(const Node& conv, std::span<const TensorType> inputs)>;

// min_pixels: a convolution of at most this many output pixels (B OH OW, the values a channel's
// sums add) keeps its statistics as they are: the GPU's stage pass merges such short rows'
// sums with the normalisation that reads them into one kernel (cuda_stage_options), which the
// moments would split in two.
Graph fuse_conv_statistics(const Graph& g, const ConvMomentsWanted& takes,
                           std::int64_t min_pixels = 0);

}  // namespace kiln
