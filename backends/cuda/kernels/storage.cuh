// The element types of the hand-written kernels (DESIGN.md, Precision): Bf16 and F16 are
// 16-bit storage types that load as float and are made from float only explicitly, rounding
// to nearest even (as core/half.h on the CPU), so every rounding is visible where a kernel
// stores; Wide<T>::type is what a kernel computes and accumulates in (float, double for f64).
#pragma once

namespace kiln::cuda {

struct Bf16 {
  unsigned short bits;
  Bf16() = default;
  __device__ explicit Bf16(float f) { asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(f)); }
  __device__ operator float() const { return __uint_as_float(((unsigned)bits) << 16); }
};

struct F16 {
  unsigned short bits;
  F16() = default;
  __device__ explicit F16(float f) { asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(f)); }
  __device__ operator float() const {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
    return f;
  }
};

// What a tile of the tensor-core kernels keeps of an element: its bits (the 16 of bf16 and f16,
// the 32 of f32), `piece` of them to a 16-byte load.
template <int BYTES>
struct BitsOfSize;
template <>
struct BitsOfSize<2> {
  typedef unsigned short type;
};
template <>
struct BitsOfSize<4> {
  typedef unsigned type;
};
template <typename T>
struct Bits {
  typedef typename BitsOfSize<sizeof(T)>::type type;
  static constexpr int piece = 16 / sizeof(T);
};

template <typename T>
struct Wide {
  typedef float type;
};
template <>
struct Wide<double> {
  typedef double type;
};

}  // namespace kiln::cuda
