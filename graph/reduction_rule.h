// Builds a reduction's table entry (ReductionRule in graph/op.h) from one combine function,
// so that its CPU loops and its NaN rule are written once for every reduction.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "graph/op.h"

namespace kiln {

// The CPU loops of a reduction whose combine (without the NaN rule) is `Combine`, a
// stateless callable double(double acc, double value).
template <NanRule kNan, class Combine>
struct ReductionLoops {
  static double combine(double acc, double v) {
    if constexpr (kNan == NanRule::propagate) {
      if (v != v) return v;
    }
    return Combine{}(acc, v);
  }
  // Long runs fold into kLanes interleaved accumulators (independent chains the processor
  // overlaps and the compiler vectorises), combined in lane order at the end: the order
  // depends only on n, so the result is the same bits for any thread count.
  template <class T>
  static double fold(double acc, const T* x, std::int64_t n, std::int64_t step) {
    // 32 lanes (eight 4-double vectors: enough independent additions to cover their latency)
    // where the run is long enough, else 8.
    return n >= 64 ? fold_lanes<T, 32>(acc, x, n, step) : fold_lanes<T, 8>(acc, x, n, step);
  }

  template <class T>
  static void accumulate(double* acc, std::int64_t acc_step, const T* x, std::int64_t n,
                         std::int64_t step) {
    for (std::int64_t i = 0; i < n; ++i)
      acc[i * acc_step] = combine(acc[i * acc_step], static_cast<double>(x[i * step]));
  }
  // Rows of 16 values combined element by element into acc[0, 16): four rows at a time into
  // four sets of accumulators (independent chains), combined in order at the end, so that
  // the order depends only on `rows`.
  static void accumulate_rows16(double* acc, const float* x, std::int64_t rows) {
    constexpr int kWidth = 16, kSets = 4;
    std::int64_t r = 0;
    if (rows >= 2 * kSets) {
      double sets[kSets][kWidth];
      for (int k = 0; k < kSets; ++k)
        for (int i = 0; i < kWidth; ++i) sets[k][i] = static_cast<double>(x[k * kWidth + i]);
      for (r = kSets; r + kSets <= rows; r += kSets)
        for (int k = 0; k < kSets; ++k)
          for (int i = 0; i < kWidth; ++i)
            sets[k][i] = combine(sets[k][i], static_cast<double>(x[(r + k) * kWidth + i]));
      for (int k = 0; k < kSets; ++k)
        for (int i = 0; i < kWidth; ++i) acc[i] = combine(acc[i], sets[k][i]);
    }
    for (; r < rows; ++r)
      for (int i = 0; i < kWidth; ++i)
        acc[i] = combine(acc[i], static_cast<double>(x[r * kWidth + i]));
  }

 private:
  template <class T, std::int64_t kLanes>
  static double fold_lanes(double acc, const T* x, std::int64_t n, std::int64_t step) {
    std::int64_t i = 0;
    if (n >= 2 * kLanes) {
      double lanes[kLanes];
      for (std::int64_t k = 0; k < kLanes; ++k) lanes[k] = static_cast<double>(x[k * step]);
      for (i = kLanes; i + kLanes <= n; i += kLanes)
        for (std::int64_t k = 0; k < kLanes; ++k)
          lanes[k] = combine(lanes[k], static_cast<double>(x[(i + k) * step]));
      for (std::int64_t k = 0; k < kLanes; ++k) acc = combine(acc, lanes[k]);
    }
    for (; i < n; ++i) acc = combine(acc, static_cast<double>(x[i * step]));
    return acc;
  }
};

// `cuda_combine` is Combine in CUDA C over {0} (the accumulator) and {1} (the value).
template <NanRule kNan, class Combine>
ReductionRule make_reduction_rule(double identity, std::string cuda_combine) {
  using L = ReductionLoops<kNan, Combine>;
  return {.identity = identity,
          .nan = kNan,
          .cuda_combine = std::move(cuda_combine),
          .combine = &L::combine,
          .fold_f32 = &L::template fold<float>,
          .fold_f64 = &L::template fold<double>,
          .accumulate_f32 = &L::template accumulate<float>,
          .accumulate_f64 = &L::template accumulate<double>,
          .accumulate_rows16_f32 = &L::accumulate_rows16};
}

// The fold of `rule` for element type T (float or double).
template <class T>
auto reduction_fold(const ReductionRule& rule) {
  if constexpr (std::is_same_v<T, float>)
    return rule.fold_f32;
  else
    return rule.fold_f64;
}
template <class T>
auto reduction_accumulate(const ReductionRule& rule) {
  if constexpr (std::is_same_v<T, float>)
    return rule.accumulate_f32;
  else
    return rule.accumulate_f64;
}

}  // namespace kiln
