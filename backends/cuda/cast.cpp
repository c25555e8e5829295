// cast on the GPU (kernels/cast.cuh): a kernel per (from, to) pair of floating dtypes, one
// grid-stride launch, and the op's CUDA entry.
#include <fmt/format.h>

#include "backends/cuda/cast.h"
#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/op_entry.h"
#include "core/error.h"
#include "kiln_kernel_files.h"

namespace kiln::cuda {
namespace {

constexpr DType kFloating[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

const char* storage_traits(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "kiln::cuda::F32Storage";
    case DType::f64:
      return "kiln::cuda::F64Storage";
    case DType::bf16:
      return "kiln::cuda::Bf16Storage";
    case DType::f16:
      return "kiln::cuda::F16Storage";
    default:
      break;
  }
  throw Error(fmt::format("cast: dtype {} is not a floating dtype", dtype_name(dtype)));
}

std::string cast_name(DType from, DType to) {
  return fmt::format("kiln_cast_{}_{}", dtype_name(from), dtype_name(to));
}

gpu::KernelSource cast_source(DType from, DType to) {
  return embedded_kernel(cast_name(from, to), kernel_files::cast_cuh, "KILN_CAST",
                         {{"KILN_FROM", storage_traits(from)}, {"KILN_TO", storage_traits(to)}});
}

const DeviceKernel& cast_kernel(DType from, DType to) {
  return device_kernel(cast_name(from, to), [&] { return cast_source(from, to); });
}

void launch_cast(const DeviceKernel& k, std::int64_t n, const void* x, void* y,
                 gpu::Stream stream) {
  long long count = n;
  void* args[] = {&x, &y, &count};
  launch_items(k, n, stream, args);
}

Launch prepare_cast(const LaunchSetup& s) {
  const DeviceKernel* k = &cast_kernel(s.input_types[0].dtype, s.node.outputs[0].dtype);
  const std::int64_t n = s.input_types[0].shape.numel();
  const void* x = s.inputs[0];
  void* y = s.outputs[0];
  return [=](gpu::Stream stream) { launch_cast(*k, n, x, y, stream); };
}

}  // namespace

void cast(DType from, DType to, std::int64_t n, const void* x, void* y, gpu::Stream stream) {
  launch_cast(cast_kernel(from, to), n, x, y, stream);
}

void add_cast_ops(CudaOpTable& table) {
  CudaOpEntry e{.prepare = prepare_cast};
  e.sources = [](const Node& n, const InputTypes& in) {
    return std::vector<gpu::KernelSource>{cast_source(in[0].dtype, n.outputs[0].dtype)};
  };
  e.every_source = [] {
    std::vector<gpu::KernelSource> all;
    for (DType from : kFloating)
      for (DType to : kFloating)
        if (from != to) all.push_back(cast_source(from, to));
    return all;
  };
  table[OpId::cast] = e;
}

}  // namespace kiln::cuda
