// random_uniform: one thread per Philox block of four values, in a grid-stride loop; integer
// Philox4x32-10 exactly as core/philox.cpp, then (bits >> 8) * 2^-24 in float. The host
// defines KILN_T and KILN_RANDOM_UNIFORM, the kernel's name (random.cpp). bf16/f16 values
// are that float rounded to nearest even, as the CPU rounds its f32 values (1 - 2^-24 rounds
// to 1 there).
#pragma once

#include "backends/cuda/kernels/storage.cuh"

namespace kiln::cuda {

__device__ __forceinline__ void mul_hi_lo(unsigned a, unsigned b, unsigned& hi, unsigned& lo) {
  const unsigned long long p = (unsigned long long)a * b;
  hi = (unsigned)(p >> 32);
  lo = (unsigned)p;
}

// Philox4x32-10 of counter (block, step) under key `seed`: four 32-bit words.
__device__ __forceinline__ void philox4x32(unsigned long long block, unsigned long long step,
                                           unsigned long long seed, unsigned (&words)[4]) {
  unsigned c0 = (unsigned)block, c1 = (unsigned)(block >> 32), c2 = (unsigned)step,
           c3 = (unsigned)(step >> 32);
  unsigned k0 = (unsigned)seed, k1 = (unsigned)(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    unsigned hi0, lo0, hi1, lo1;
    mul_hi_lo(0xD2511F53u, c0, hi0, lo0);
    mul_hi_lo(0xCD9E8D57u, c2, hi1, lo1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  words[0] = c0;
  words[1] = c1;
  words[2] = c2;
  words[3] = c3;
}

// out[i] for i in [0, n): uniform in [0, 1) from the step counter step[0]; thread 0 writes
// step + 1 to next_step.
template <typename T>
__device__ __forceinline__ void random_uniform(T* __restrict__ out,
                                               long long* __restrict__ next_step,
                                               const long long* __restrict__ step,
                                               unsigned long long seed, long long n) {
  const unsigned long long s = (unsigned long long)step[0];
  if (blockIdx.x == 0 && threadIdx.x == 0) next_step[0] = (long long)(s + 1);
  const long long blocks = (n + 3) / 4;
  for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; b < blocks;
       b += (long long)gridDim.x * blockDim.x) {
    unsigned words[4];
    philox4x32((unsigned long long)b, s, seed, words);
    for (int w = 0; w < 4; ++w) {
      const long long i = 4 * b + w;
      if (i < n) out[i] = (T)((float)(words[w] >> 8) * 5.9604644775390625e-8f);  // * 2^-24, exact
    }
  }
}

}  // namespace kiln::cuda

#ifdef KILN_RANDOM_UNIFORM
extern "C" __global__ void KILN_RANDOM_UNIFORM(KILN_T* __restrict__ out,
                                               long long* __restrict__ next_step,
                                               const long long* __restrict__ step,
                                               unsigned long long seed, long long n) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::random_uniform(out, next_step, step, seed, n);
}
#endif
