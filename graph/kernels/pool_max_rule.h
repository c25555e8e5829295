// Max pooling's rule for the first maximum of a window (its cells in row-major order; a cell
// takes it when strictly greater, or a NaN), in forms whose loops vectorize: pool_cpu.cpp's
// NCHW kernels and pool_blocked.cpp's blocked ones share it, so they pick the same cells.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace kiln::kernels::max_rule {

// v != v as an integer compare of the bits: GCC compiles `v > best || v != v` to two branches
// on the flags of float compares (the second on the parity of an unordered one); with the NaN
// test in integers it keeps one, and LeNet's and VGG's pools run about 1.5-2x faster.
template <class T>
using MaxBits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
template <class T>
inline bool is_nan(T v) {
  constexpr MaxBits<T> kMagnitude = std::numeric_limits<MaxBits<T>>::max() >> 1;
  return (std::bit_cast<MaxBits<T>>(v) & kMagnitude) >
         std::bit_cast<MaxBits<T>>(std::numeric_limits<T>::infinity());
}

// The first maximum of a 2x2 window with cells a, b (top row) and c, d, in row-major order:
// the value, and for each cell a mask of all ones if it is the one that wins, else 0. The
// choices are selects and the winners integer masks, so a loop over windows vectorizes (with
// bool selects on the stored cells, GCC turned the loop's body into jumps).
template <class T>
struct Max2x2 {
  T value;
  MaxBits<T> wins[4];
};
template <class T>
inline Max2x2<T> first_max_of_2x2(T a, T b, T c, T d) {
  using Bits = MaxBits<T>;
  const bool take_b = (b > a) | is_nan(b);
  const T ab = take_b ? b : a;
  const bool take_c = (c > ab) | is_nan(c);
  const T abc = take_c ? c : ab;
  const bool take_d = (d > abc) | is_nan(d);
  const Bits tb = take_b, tc = take_c, td = take_d;
  return {take_d ? d : abc,
          {(tb | tc | td) - 1, Bits{0} - (tb & ((tc | td) ^ 1)), Bits{0} - (tc & (td ^ 1)),
           Bits{0} - td}};
}

// v where the mask is all ones, +0 where it is 0.
template <class T>
inline T masked(T v, MaxBits<T> mask) {
  return std::bit_cast<T>(std::bit_cast<MaxBits<T>>(v) & mask);
}

// dy as a gradient with ReLU's mask (max_pool2d_grad relu=1) routes it: dy where the window's
// maximum is positive, else dy * 0 (+-0, or NaN for an infinite or NaN dy), the bits of dy
// times relu's 0/1 mask of the pooled value.
template <class T>
inline T relu_routed(T dy, T max, bool relu) {
  return relu && !(max > T(0)) ? dy * T(0) : dy;
}

}  // namespace kiln::kernels::max_rule
