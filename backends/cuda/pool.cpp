// Host side of pooling: one launch each. Max pooling on planes of fewer than 2^30 elements
// in all uses the 32-bit kernels: forward and select one thread per window; the gradient one
// thread per cell when windows neither overlap nor are padded (each dx element is written
// once, by one thread) and a gather per input element otherwise (planes of up to 4096 cells
// whole in a block, each window's maximum found once in shared memory). Either way exact,
// deterministic and atomic-free. Larger tensors use the 64-bit kernels (forward/select per
// window, the gradient a gather), as average pooling always does. The ops' CUDA entries at the
// end.
#include "backends/cuda/pool.h"

#include <fmt/format.h>

#include "backends/cuda/kernels/pool_params.h"
#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/op_entry.h"
#include "core/error.h"
#include "graph/ops.h"

namespace kiln::cuda {
namespace {

PoolShape shape_of(const kernels::PoolGeometry& g, const char* op = "max_pool2d") {
  KILN_CHECK(g.kernel >= 1 && g.stride >= 1 && g.padding >= 0 && 2 * g.padding <= g.kernel &&
                 g.height + 2 * g.padding >= g.kernel && g.width + 2 * g.padding >= g.kernel,
             "{}: kernel {}, stride {} and padding {} on {}x{} planes", op, g.kernel, g.stride,
             g.padding, g.height, g.width);
  return {g.planes, g.height, g.width, g.kernel, g.stride, g.padding, g.out_h, g.out_w};
}

void check_dtype(DType dtype, const char* op = "max_pool2d") {
  KILN_CHECK(is_floating(dtype), "{}: dtype {} is not supported (f32, f64, bf16 or f16 expected)",
             op, dtype_name(dtype));
}

const DeviceKernel& pool_kernel(PoolKernel which, DType dtype) {
  check_dtype(dtype);
  const char* suffix = which == PoolKernel::forward ? "forward"
                       : which == PoolKernel::grad  ? "grad"
                                                    : "select";
  return device_kernel(fmt::format("kiln_max_pool2d_{}_{}", suffix, dtype_name(dtype)),
                       [&] { return max_pool_source(which, dtype); });
}

const DeviceKernel& fast_kernel(PoolFast which, DType dtype) {
  check_dtype(dtype);
  return device_kernel(max_pool_fast_name(which, dtype),
                       [&] { return max_pool_fast_source(which, dtype); });
}

// Whether the 32-bit kernels apply (every index and grid-stride step stays below 2^31).
bool small(const kernels::PoolGeometry& g) {
  return g.planes * g.height * g.width < (std::int64_t{1} << 30);
}

PoolShape32 shape32_of(const PoolShape& s) {
  return {static_cast<std::int32_t>(s.planes), static_cast<std::int32_t>(s.height),
          static_cast<std::int32_t>(s.width),  static_cast<std::int32_t>(s.kernel),
          static_cast<std::int32_t>(s.stride), static_cast<std::int32_t>(s.padding),
          static_cast<std::int32_t>(s.out_h),  static_cast<std::int32_t>(s.out_w)};
}

}  // namespace

void max_pool2d_forward(DType dtype, const kernels::PoolGeometry& g, const void* x, void* y,
                        gpu::Stream stream) {
  PoolShape shape = shape_of(g);
  if (small(g)) {
    PoolShape32 s = shape32_of(shape);
    void* args[] = {&x, &y, &s};
    const bool k2 = g.kernel == 2 && g.padding == 0;
    launch_items(fast_kernel(k2 ? PoolFast::forward_k2 : PoolFast::forward_any, dtype),
                 g.planes * g.out_h * g.out_w, stream, args);
    return;
  }
  void* args[] = {&x, &y, &shape};
  launch_items(pool_kernel(PoolKernel::forward, dtype), g.planes * g.out_h * g.out_w, stream, args);
}

void max_pool2d_grad(DType dtype, const kernels::PoolGeometry& g, const void* x, const void* dy,
                     void* dx, gpu::Stream stream, bool relu) {
  PoolShape shape = shape_of(g);
  int relu_flag = relu ? 1 : 0;
  if (small(g)) {
    PoolShape32 s = shape32_of(shape);
    void* args[] = {&x, &dy, &dx, &s, &relu_flag};
    if (g.stride < g.kernel || g.padding > 0) {
      if (g.height * g.width <= kPlaneCells && g.out_h * g.out_w <= kPlaneCells) {
        const std::int64_t per = planes_per_block(s);  // whole planes a block
        const auto blocks = static_cast<unsigned>((g.planes + per - 1) / per);
        if (blocks > 0)
          fast_kernel(PoolFast::grad_planes, dtype)
              .kernel.launch({blocks, 1, 1}, {kPlaneThreads, 1, 1}, 0, stream, args);
        return;
      }
      launch_items(fast_kernel(PoolFast::grad_overlap, dtype), g.planes * g.height * g.width,
                   stream, args);
      return;
    }
    const bool cells2 = g.kernel == 2 && g.stride == 2 && g.height % 2 == 0 && g.width % 2 == 0;
    launch_items(fast_kernel(cells2 ? PoolFast::grad_cells2 : PoolFast::grad_cells, dtype),
                 g.planes * g.out_h * g.out_w, stream, args);
    return;
  }
  void* args[] = {&x, &dy, &dx, &shape, &relu_flag};
  launch_items(pool_kernel(PoolKernel::grad, dtype), g.planes * g.height * g.width, stream, args);
}

void max_pool2d_select(DType dtype, const kernels::PoolGeometry& g, const void* x, const void* g_in,
                       void* out, gpu::Stream stream) {
  PoolShape shape = shape_of(g);
  if (small(g)) {
    PoolShape32 s = shape32_of(shape);
    void* args[] = {&x, &g_in, &out, &s};
    const bool k2 = g.kernel == 2 && g.padding == 0;
    launch_items(fast_kernel(k2 ? PoolFast::select_k2 : PoolFast::select_any, dtype),
                 g.planes * g.out_h * g.out_w, stream, args);
    return;
  }
  void* args[] = {&x, &g_in, &out, &shape};
  launch_items(pool_kernel(PoolKernel::select, dtype), g.planes * g.out_h * g.out_w, stream, args);
}

void avg_pool2d_forward(DType dtype, const kernels::PoolGeometry& g, const void* x, void* y,
                        gpu::Stream stream) {
  PoolShape shape = shape_of(g, "avg_pool2d");
  check_dtype(dtype, "avg_pool2d");
  void* args[] = {&x, &y, &shape};
  launch_items(
      device_kernel(avg_pool_name(false, dtype), [&] { return avg_pool_source(false, dtype); }),
      g.planes * g.out_h * g.out_w, stream, args);
}

void avg_pool2d_grad(DType dtype, const kernels::PoolGeometry& g, const void* dy, void* dx,
                     gpu::Stream stream) {
  PoolShape shape = shape_of(g, "avg_pool2d_grad");
  check_dtype(dtype, "avg_pool2d_grad");
  void* args[] = {&dy, &dx, &shape};
  launch_items(
      device_kernel(avg_pool_name(true, dtype), [&] { return avg_pool_source(true, dtype); }),
      g.planes * g.height * g.width, stream, args);
}

namespace {

// The geometry of a pooling node whose pooled tensor (x, or dx for avg_pool2d_grad) is `x`.
kernels::PoolGeometry geometry_of(const Node& n, const Shape& x) {
  return kernels::pool_geometry(x, n.attrs.integer("kernel"), n.attrs.integer("stride"),
                                n.attrs.integer("padding"));
}

// Every max-pooling kernel of `dtype` appended to `all` (a program preloads them all: which
// one runs depends on sizes and windows).
std::vector<gpu::KernelSource> max_pool_sources_of(DType dtype,
                                                   std::vector<gpu::KernelSource> all) {
  for (PoolKernel p : {PoolKernel::forward, PoolKernel::grad, PoolKernel::select})
    all.push_back(max_pool_source(p, dtype));
  for (PoolFast p :
       {PoolFast::forward_k2, PoolFast::forward_any, PoolFast::select_k2, PoolFast::select_any,
        PoolFast::grad_cells2, PoolFast::grad_cells, PoolFast::grad_overlap, PoolFast::grad_planes})
    all.push_back(max_pool_fast_source(p, dtype));
  return all;
}

std::vector<gpu::KernelSource> max_pool_sources(const Node&, const InputTypes& in) {
  return max_pool_sources_of(in[0].dtype, {});
}

using OneInput = void (*)(DType, const kernels::PoolGeometry&, const void*, void*, gpu::Stream);
using TwoInputs = void (*)(DType, const kernels::PoolGeometry&, const void*, const void*, void*,
                           gpu::Stream);

// x -> y (max_pool2d, avg_pool2d) or dy -> dx (avg_pool2d_grad, whose pooled tensor is dx).
std::function<Launch(const LaunchSetup&)> prepare_one(OneInput launch, bool pooled_is_output) {
  return [=](const LaunchSetup& s) -> Launch {
    const kernels::PoolGeometry g =
        geometry_of(s.node, pooled_is_output ? s.node.outputs[0].shape : s.input_types[0].shape);
    const DType d = s.input_types[0].dtype;
    const void* x = s.inputs[0];
    void* y = s.outputs[0];
    return [=](gpu::Stream st) { launch(d, g, x, y, st); };
  };
}

// x, g -> out (max_pool2d_select).
std::function<Launch(const LaunchSetup&)> prepare_two(TwoInputs launch) {
  return [=](const LaunchSetup& s) -> Launch {
    const kernels::PoolGeometry g = geometry_of(s.node, s.input_types[0].shape);
    const DType d = s.input_types[0].dtype;
    const void *x = s.inputs[0], *second = s.inputs[1];
    void* out = s.outputs[0];
    return [=](gpu::Stream st) { launch(d, g, x, second, out, st); };
  };
}

// x, dy -> dx (max_pool2d_grad), with its relu attribute.
Launch prepare_max_grad(const LaunchSetup& s) {
  const kernels::PoolGeometry g = geometry_of(s.node, s.input_types[0].shape);
  const DType d = s.input_types[0].dtype;
  const void *x = s.inputs[0], *dy = s.inputs[1];
  void* dx = s.outputs[0];
  const bool relu = max_pool_grad_relu(s.node.attrs);
  return [=](gpu::Stream st) { max_pool2d_grad(d, g, x, dy, dx, st, relu); };
}

std::function<std::vector<gpu::KernelSource>(const Node&, const InputTypes&)> avg_sources(
    bool grad) {
  return [grad](const Node&, const InputTypes& in) {
    return std::vector<gpu::KernelSource>{avg_pool_source(grad, in[0].dtype)};
  };
}

std::vector<gpu::KernelSource> every_pool_source() {
  std::vector<gpu::KernelSource> all;
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    all = max_pool_sources_of(t, std::move(all));
    for (bool grad : {false, true}) all.push_back(avg_pool_source(grad, t));
  }
  return all;
}

}  // namespace

void add_pool_ops(CudaOpTable& table) {
  table[OpId::max_pool2d] = {.prepare = prepare_one(max_pool2d_forward, false),
                             .sources = max_pool_sources,
                             .every_source = every_pool_source};
  table[OpId::max_pool2d_grad] = {.prepare = prepare_max_grad, .sources = max_pool_sources};
  table[OpId::max_pool2d_select] = {.prepare = prepare_two(max_pool2d_select),
                                    .sources = max_pool_sources};
  table[OpId::avg_pool2d] = {.prepare = prepare_one(avg_pool2d_forward, false),
                             .sources = avg_sources(false)};
  table[OpId::avg_pool2d_grad] = {.prepare = prepare_one(avg_pool2d_grad, true),
                                  .sources = avg_sources(true)};
}

}  // namespace kiln::cuda
