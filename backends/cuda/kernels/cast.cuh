// cast between floating dtypes: each storage type loads as its arithmetic type (float for
// bf16, f16 and f32; double for f64) and stores from float or double rounding to nearest
// even, as the CPU's conversions do (a double goes to bf16 or f16 through float there too).
// The host defines KILN_CAST as the kernel's name and KILN_FROM, KILN_TO as storage traits
// below (layout_kernels.cpp's cast_source).
#pragma once

#include "backends/cuda/kernels/common.cuh"

namespace kiln::cuda {

struct F32Storage {
  typedef float T;
  __device__ static float load(T v) { return v; }
  __device__ static T store(float v) { return v; }
  __device__ static T store(double v) { return (float)v; }
};
struct F64Storage {
  typedef double T;
  __device__ static double load(T v) { return v; }
  __device__ static T store(float v) { return (double)v; }
  __device__ static T store(double v) { return v; }
};
struct Bf16Storage {
  typedef unsigned short T;
  __device__ static float load(T v) { return __uint_as_float(((unsigned)v) << 16); }
  __device__ static T store(float v) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
  }
  __device__ static T store(double v) { return store((float)v); }
};
struct F16Storage {
  typedef unsigned short T;
  __device__ static float load(T v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
  }
  __device__ static T store(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
  }
  __device__ static T store(double v) { return store((float)v); }
};

}  // namespace kiln::cuda

#ifdef KILN_CAST
extern "C" __global__ void KILN_CAST(const KILN_FROM::T* __restrict__ x, KILN_TO::T* __restrict__ y,
                                     long long n) {
  KILN_AFTER_PRIOR_GRIDS();
  KILN_FOR_EACH_ITEM(i, n) y[i] = KILN_TO::store(KILN_FROM::load(x[i]));
}
#endif
