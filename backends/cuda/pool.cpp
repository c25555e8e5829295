// Host side of max pooling: one launch each. The gradient is a gather over input
// elements (see pool_kernels.cpp), which is exact and needs no atomics for any stride.
#include "backends/cuda/pool.h"

#include <fmt/format.h>

#include "backends/cuda/kernel_params.h"
#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "core/error.h"

namespace kiln::cuda {
namespace {

PoolShape shape_of(const kernels::PoolGeometry& g) {
  KILN_CHECK(g.kernel >= 1 && g.stride >= 1 && g.height >= g.kernel && g.width >= g.kernel,
             "max_pool2d: kernel {} and stride {} on {}x{} planes", g.kernel, g.stride, g.height, g.width);
  return {g.planes, g.height, g.width, g.kernel, g.stride, g.out_h, g.out_w};
}

const DeviceKernel& pool_kernel(PoolKernel which, DType dtype) {
  KILN_CHECK(dtype == DType::f32 || dtype == DType::f64, "max_pool2d: dtype {} is not supported (f32 or f64 expected)",
             dtype_name(dtype));
  const char* suffix = which == PoolKernel::forward ? "forward" : which == PoolKernel::grad ? "grad" : "select";
  return device_kernel(fmt::format("kiln_max_pool2d_{}_{}", suffix, dtype_name(dtype)),
                       [&] { return max_pool_source(which, dtype); });
}

}  // namespace

void max_pool2d_forward(DType dtype, const kernels::PoolGeometry& g, const void* x, void* y, jit::Stream stream) {
  PoolShape shape = shape_of(g);
  void* args[] = {&x, &y, &shape};
  launch_items(pool_kernel(PoolKernel::forward, dtype), g.planes * g.out_h * g.out_w, stream, args);
}

void max_pool2d_grad(DType dtype, const kernels::PoolGeometry& g, const void* x, const void* dy, void* dx,
                     jit::Stream stream) {
  PoolShape shape = shape_of(g);
  void* args[] = {&x, &dy, &dx, &shape};
  launch_items(pool_kernel(PoolKernel::grad, dtype), g.planes * g.height * g.width, stream, args);
}

void max_pool2d_select(DType dtype, const kernels::PoolGeometry& g, const void* x, const void* g_in, void* out,
                       jit::Stream stream) {
  PoolShape shape = shape_of(g);
  void* args[] = {&x, &g_in, &out, &shape};
  launch_items(pool_kernel(PoolKernel::select, dtype), g.planes * g.out_h * g.out_w, stream, args);
}

}  // namespace kiln::cuda
