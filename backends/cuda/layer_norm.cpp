// layer_norm and layer_norm_grad on the GPU (kernels/layer_norm.cuh): the kernels' sources,
// one launch each, and the ops' CUDA entries.
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/op_entry.h"
#include "core/error.h"
#include "kiln_kernel_files.h"

namespace kiln::cuda {
namespace {

constexpr unsigned kThreads = 256, kRowsPerBlock = kThreads / 32;  // kLayerNormThreads

std::string layer_norm_name(bool backward, DType dtype) {
  return fmt::format("kiln_layer_norm_{}_{}", backward ? "backward" : "forward", dtype_name(dtype));
}

gpu::KernelSource layer_norm_source(bool backward, DType dtype) {
  return embedded_kernel(layer_norm_name(backward, dtype), kernel_files::layer_norm_cuh,
                         backward ? "KILN_LAYER_NORM_BACKWARD" : "KILN_LAYER_NORM_FORWARD",
                         {{"KILN_T", cuda_type_name(dtype)}});
}

// x [..., D] as rows of D; D fits the kernel's int index.
struct Rows {
  long long rows = 0;
  int d = 0;
};
Rows rows_of(const Shape& x, const char* op) {
  const std::int64_t d = x[x.rank() - 1];
  KILN_CHECK(d <= std::numeric_limits<int>::max(), "{}: rows of {} elements are too long", op, d);
  return {x.numel() / d, static_cast<int>(d)};
}

// One warp per row, grid-strided: as many blocks as rows need, at most 65535 * 8 rows a pass.
void launch_rows(bool backward, DType dtype, long long rows, gpu::Stream stream, void** args) {
  if (rows == 0) return;
  const DeviceKernel& k = device_kernel(layer_norm_name(backward, dtype),
                                        [&] { return layer_norm_source(backward, dtype); });
  const auto blocks =
      static_cast<unsigned>(std::min<long long>((rows + kRowsPerBlock - 1) / kRowsPerBlock, 65535));
  k.kernel.launch({blocks, 1, 1}, {kThreads, 1, 1}, 0, stream, args);
}

void check_dtype(DType dtype, const char* op) {
  KILN_CHECK(is_floating(dtype), "{}: dtype {} (f32, f64, bf16 or f16 expected)", op,
             dtype_name(dtype));
}

// x -> y, mean, rstd.
Launch prepare_forward(const LaunchSetup& s) {
  const DType dtype = s.input_types[0].dtype;
  check_dtype(dtype, "layer_norm");
  const Rows r = rows_of(s.input_types[0].shape, "layer_norm");
  double eps = s.node.attrs.real("eps");
  const void* x = s.inputs[0];
  void *y = s.outputs[0], *mean = s.outputs[1], *rstd = s.outputs[2];
  return [=](gpu::Stream st) mutable {
    float eps32 = static_cast<float>(eps);
    // eps is of the compute type: double for f64, float for the others.
    void* eps_arg = dtype != DType::f64 ? static_cast<void*>(&eps32) : static_cast<void*>(&eps);
    long long rows = r.rows;
    int d = r.d;
    void* args[] = {&x, &y, &mean, &rstd, &rows, &d, eps_arg};
    launch_rows(false, dtype, rows, st, args);
  };
}

// dy, x, mean, rstd -> dx.
Launch prepare_backward(const LaunchSetup& s) {
  const DType dtype = s.input_types[1].dtype;
  check_dtype(dtype, "layer_norm_grad");
  const Rows r = rows_of(s.input_types[1].shape, "layer_norm_grad");
  const void *dy = s.inputs[0], *x = s.inputs[1], *mean = s.inputs[2], *rstd = s.inputs[3];
  void* dx = s.outputs[0];
  return [=](gpu::Stream st) mutable {
    long long rows = r.rows;
    int d = r.d;
    void* args[] = {&dy, &x, &mean, &rstd, &dx, &rows, &d};
    launch_rows(true, dtype, rows, st, args);
  };
}

std::vector<gpu::KernelSource> every_source() {
  std::vector<gpu::KernelSource> all;
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16})
    for (bool backward : {false, true}) all.push_back(layer_norm_source(backward, t));
  return all;
}

}  // namespace

void add_norm_ops(CudaOpTable& table) {
  table[OpId::layer_norm] = {
      .prepare = prepare_forward,
      .sources =
          [](const Node&, const InputTypes& in) {
            return std::vector<gpu::KernelSource>{layer_norm_source(false, in[0].dtype)};
          },
      .every_source = every_source};
  table[OpId::layer_norm_grad] = {
      .prepare = prepare_backward, .sources = [](const Node&, const InputTypes& in) {
        return std::vector<gpu::KernelSource>{layer_norm_source(true, in[1].dtype)};
      }};
}

}  // namespace kiln::cuda
