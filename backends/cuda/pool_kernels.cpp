// CUDA C of max pooling: forward and select (one thread per window) and the gradient as a
// gather (one thread per input element, summing the windows whose first maximum it is).
#include <fmt/format.h>

#include "backends/cuda/kernel_params.h"
#include "backends/cuda/kernel_sources.h"
#include "core/error.h"

namespace kiln::cuda {
namespace {

// The flat index in x of window (plane, oh, ow)'s maximum, by the CPU's rule
// (graph/kernels/conv_cpu.cpp, for_each_window_max): the first maximum, and a NaN wins
// (the last NaN, as the CPU's `take` keeps taking NaNs).
constexpr const char* kWindowArgmax = R"(
__device__ __forceinline__ long long window_argmax(const T* __restrict__ x, const PoolShape& g,
                                                   long long plane, long long oh, long long ow) {
  const long long corner = (plane * g.height + oh * g.stride) * g.width + ow * g.stride;
  long long best = corner;
  T best_value = x[corner];
  for (long long kh = 0; kh < g.kernel; ++kh)
    for (long long kw = 0; kw < g.kernel; ++kw) {
      const long long at = corner + kh * g.width + kw;
      const T v = x[at];
      const bool take = v > best_value || v != v;
      best = take ? at : best;
      best_value = take ? v : best_value;
    }
  return best;
}
)";

// y[window] = src[argmax of x over the window]; src is x (forward) or g (select).
std::string gather_body(const std::string& name, bool from_x) {
  return fmt::format(R"(
extern "C" __global__ void {0}(const T* __restrict__ x, {1}T* __restrict__ y, PoolShape g) {{
  const long long n = g.planes * g.out_h * g.out_w;
  {2} {{
    const long long ow = i % g.out_w;
    const long long oh = (i / g.out_w) % g.out_h;
    const long long plane = i / (g.out_w * g.out_h);
    y[i] = {3}[window_argmax(x, g, plane, oh, ow)];
  }}
}}
)",
                     name, from_x ? "" : "const T* __restrict__ src, ", kGridStrideLoop, from_x ? "x" : "src");
}

// dx[e] = sum of dy over the windows containing e (in window order, as the CPU adds them)
// whose maximum is e. Without overlap (stride >= kernel) at most one window contains e.
std::string grad_body(const std::string& name) {
  return fmt::format(R"(
extern "C" __global__ void {0}(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx, PoolShape g) {{
  const long long n = g.planes * g.height * g.width;
  {1} {{
    const long long iw = i % g.width;
    const long long ih = (i / g.width) % g.height;
    const long long plane = i / (g.width * g.height);
    // Windows oh with oh*s <= ih <= oh*s + k - 1, clipped to the output.
    const long long oh_lo = ih >= g.kernel ? (ih - g.kernel + g.stride) / g.stride : 0;
    const long long ow_lo = iw >= g.kernel ? (iw - g.kernel + g.stride) / g.stride : 0;
    const long long oh_hi = min(ih / g.stride, g.out_h - 1);
    const long long ow_hi = min(iw / g.stride, g.out_w - 1);
    T sum = T(0);
    for (long long oh = oh_lo; oh <= oh_hi; ++oh)
      for (long long ow = ow_lo; ow <= ow_hi; ++ow)
        if (window_argmax(x, g, plane, oh, ow) == i) sum += dy[(plane * g.out_h + oh) * g.out_w + ow];
    dx[i] = sum;
  }}
}}
)",
                     name, kGridStrideLoop);
}

const char* kernel_suffix(PoolKernel which) {
  switch (which) {
    case PoolKernel::forward: return "forward";
    case PoolKernel::grad: return "grad";
    case PoolKernel::select: return "select";
  }
  KILN_ASSERT(false, "unknown pool kernel {}", static_cast<int>(which));
}

}  // namespace

jit::KernelSource max_pool_source(PoolKernel which, DType dtype) {
  const std::string name = fmt::format("kiln_max_pool2d_{}_{}", kernel_suffix(which), dtype_name(dtype));
  std::string code = fmt::format("typedef {} T;\n{}{}", cuda_type_name(dtype), kPoolShapeStruct, kWindowArgmax);
  code += which == PoolKernel::grad ? grad_body(name) : gather_body(name, which == PoolKernel::forward);
  return {name, code, {}};
}

}  // namespace kiln::cuda
