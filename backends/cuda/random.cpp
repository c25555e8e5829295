// The random_uniform launcher and its kernel's source (kernels/random.cuh: Philox4x32-10
// exactly as core/philox.cpp, one thread per block of four values).
#include "backends/cuda/random.h"

#include <fmt/format.h>

#include <algorithm>

#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/op_entry.h"
#include "core/error.h"
#include "kiln_kernel_files.h"

namespace kiln::cuda {

gpu::KernelSource random_uniform_source(DType dtype) {
  return embedded_kernel(fmt::format("kiln_random_uniform_{}", dtype_name(dtype)),
                         kernel_files::random_cuh, "KILN_RANDOM_UNIFORM",
                         {{"KILN_T", cuda_type_name(dtype)}});
}

void random_uniform(DType dtype, std::uint64_t seed, std::int64_t n, const void* step, void* out,
                    void* next_step, gpu::Stream stream) {
  KILN_CHECK(is_floating(dtype), "random_uniform: dtype {} (f32, f64, bf16 or f16 expected)",
             dtype_name(dtype));
  const DeviceKernel& k = device_kernel(fmt::format("kiln_random_uniform_{}", dtype_name(dtype)),
                                        [&] { return random_uniform_source(dtype); });
  unsigned long long key = seed;
  long long count = n;
  void* args[] = {&out, &next_step, &step, &key, &count};
  launch_items(k, std::max<std::int64_t>(1, (n + 3) / 4), stream,
               args);  // one item at least: next_step
}

// random_uniform(step) -> (values, next step); the seed is an attribute.
void add_random_ops(CudaOpTable& table) {
  CudaOpEntry e;
  e.prepare = [](const LaunchSetup& s) -> Launch {
    const DType d = s.node.outputs[0].dtype;
    const auto seed = static_cast<std::uint64_t>(s.node.attrs.integer("seed"));
    const std::int64_t n = s.node.outputs[0].shape.numel();
    const void* step = s.inputs[0];
    void *out = s.outputs[0], *next = s.outputs[1];
    return [=](gpu::Stream st) { random_uniform(d, seed, n, step, out, next, st); };
  };
  e.sources = [](const Node& n, const InputTypes&) {
    return std::vector<gpu::KernelSource>{random_uniform_source(n.outputs[0].dtype)};
  };
  e.every_source = [] {
    std::vector<gpu::KernelSource> all;
    for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
      all.push_back(random_uniform_source(t));
    return all;
  };
  table[OpId::random_uniform] = e;
}

}  // namespace kiln::cuda
