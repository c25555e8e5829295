// The random_uniform kernel: one thread per Philox block of four values, in a grid-stride
// loop; integer Philox4x32-10 exactly as core/philox.cpp, then (bits >> 8) * 2^-24 in float.
#include "backends/cuda/random.h"

#include <fmt/format.h>

#include <algorithm>

#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "core/error.h"

namespace kiln::cuda {

gpu::KernelSource random_uniform_source(DType dtype) {
  const std::string name = fmt::format("kiln_random_uniform_{}", dtype_name(dtype));
  const std::string code = fmt::format(R"(typedef {0} T;
__device__ __forceinline__ void kiln_mul_hi_lo(unsigned a, unsigned b, unsigned& hi, unsigned& lo) {{
  const unsigned long long p = (unsigned long long)a * b;
  hi = (unsigned)(p >> 32);
  lo = (unsigned)p;
}}
extern "C" __global__ void {1}(T* __restrict__ out, long long* __restrict__ next_step, const long long* __restrict__ step,
                               unsigned long long seed, long long n) {{
  const unsigned long long s = (unsigned long long)step[0];
  if (blockIdx.x == 0 && threadIdx.x == 0) next_step[0] = (long long)(s + 1);
  const long long blocks = (n + 3) / 4;
  for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; b < blocks; b += (long long)gridDim.x * blockDim.x) {{
    unsigned c0 = (unsigned)b, c1 = (unsigned)((unsigned long long)b >> 32), c2 = (unsigned)s, c3 = (unsigned)(s >> 32);
    unsigned k0 = (unsigned)seed, k1 = (unsigned)(seed >> 32);
    for (int round = 0; round < 10; ++round) {{
      unsigned hi0, lo0, hi1, lo1;
      kiln_mul_hi_lo(0xD2511F53u, c0, hi0, lo0);
      kiln_mul_hi_lo(0xCD9E8D57u, c2, hi1, lo1);
      c0 = hi1 ^ c1 ^ k0;
      c1 = lo1;
      c2 = hi0 ^ c3 ^ k1;
      c3 = lo0;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }}
    const unsigned words[4] = {{c0, c1, c2, c3}};
    for (int w = 0; w < 4; ++w) {{
      const long long i = 4 * b + w;
      if (i < n) out[i] = (T)((float)(words[w] >> 8) * 5.9604644775390625e-8f);  // * 2^-24, exact
    }}
  }}
}}
)",
                                       cuda_type_name(dtype), name);
  return {name, code, {}};
}

void random_uniform(DType dtype, std::uint64_t seed, std::int64_t n, const void* step, void* out,
                    void* next_step, gpu::Stream stream) {
  KILN_CHECK(dtype == DType::f32 || dtype == DType::f64,
             "random_uniform: dtype {} (f32 or f64 expected)", dtype_name(dtype));
  const DeviceKernel& k = device_kernel(fmt::format("kiln_random_uniform_{}", dtype_name(dtype)),
                                        [&] { return random_uniform_source(dtype); });
  unsigned long long key = seed;
  long long count = n;
  void* args[] = {&out, &next_step, &step, &key, &count};
  launch_items(k, std::max<std::int64_t>(1, (n + 3) / 4), stream,
               args);  // one item at least: next_step
}

}  // namespace kiln::cuda
