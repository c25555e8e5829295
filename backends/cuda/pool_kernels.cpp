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

// The 32-bit kernels. window_max32: the CPU's first maximum (a NaN wins, the last NaN) of
// the window whose top-left element is x[corner]; KS > 0 fixes the window size.
constexpr const char* kWindowMax32 = R"(
template <int KS>
__device__ __forceinline__ int window_max32(const T* __restrict__ x, const PoolShape32& g, int corner,
                                            T& best_value) {
  const int k = KS > 0 ? KS : g.kernel;
  int best = corner;
  best_value = x[corner];
#pragma unroll
  for (int kh = 0; kh < k; ++kh)
#pragma unroll
    for (int kw = 0; kw < k; ++kw) {
      const int at = corner + kh * g.width + kw;
      const T v = x[at];
      const bool take = v > best_value || v != v;
      best = take ? at : best;
      best_value = take ? v : best_value;
    }
  return best;
}

// Window i = (plane, oh, ow) -> its top-left element.
__device__ __forceinline__ int window_corner(const PoolShape32& g, int i, int& oh, int& ow) {
  ow = i % g.out_w;
  const int r = i / g.out_w;
  oh = r % g.out_h;
  const int plane = r / g.out_h;
  return (plane * g.height + oh * g.stride) * g.width + ow * g.stride;
}
)";

constexpr const char* kGridStrideLoop32 =
    "for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)";

// forward: y = max of x's window; select: y = src at the window's first maximum.
std::string fast_gather_body(const std::string& name, bool select, int ks) {
  return fmt::format(R"(
extern "C" __global__ void {0}(const T* __restrict__ x, {1}T* __restrict__ y, PoolShape32 g) {{
  const int n = g.planes * g.out_h * g.out_w;
  {2} {{
    int oh, ow;
    T best_value;
    const int best = window_max32<{3}>(x, g, window_corner(g, i, oh, ow), best_value);
    y[i] = {4};
  }}
}}
)",
                     name, select ? "const T* __restrict__ src, " : "", kGridStrideLoop32, ks,
                     select ? "src[best]" : "best_value");
}

// Windows that do not overlap (stride >= kernel): the cells [oh*s, (oh+1)*s) x [ow*s, (ow+1)*s),
// the last row and column of cells reaching the plane's edge, partition the plane, and each
// window lies in its cell. One thread per cell writes all of it: 0 + dy (as the CPU adds dy
// to a zeroed dx) at the window's first maximum, 0 elsewhere. cells2: every cell is 2x2.
std::string fast_cells_body(const std::string& name, bool exact2) {
  const char* write = exact2 ? R"(
    dx[corner] = best == corner ? value : T(0);
    dx[corner + 1] = best == corner + 1 ? value : T(0);
    dx[corner + g.width] = best == corner + g.width ? value : T(0);
    dx[corner + g.width + 1] = best == corner + g.width + 1 ? value : T(0);)"
                             : R"(
    const int rows = oh == g.out_h - 1 ? g.height - oh * g.stride : g.stride;
    const int cols = ow == g.out_w - 1 ? g.width - ow * g.stride : g.stride;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {{
        const int at = corner + r * g.width + c;
        dx[at] = best == at ? value : T(0);
      }})";
  return fmt::format(R"(
extern "C" __global__ void {0}(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx, PoolShape32 g) {{
  const int n = g.planes * g.out_h * g.out_w;
  {1} {{
    int oh, ow;
    T best_value;
    const int corner = window_corner(g, i, oh, ow);
    const int best = window_max32<{2}>(x, g, corner, best_value);
    const T value = T(0) + dy[i];{3}
  }}
}}
)",
                     name, kGridStrideLoop32, exact2 ? 2 : 0, fmt::format(fmt::runtime(write)));
}

// Overlapping windows: the gather of grad_body with 32-bit indices.
std::string fast_overlap_body(const std::string& name) {
  return fmt::format(R"(
extern "C" __global__ void {0}(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx, PoolShape32 g) {{
  const int n = g.planes * g.height * g.width;
  {1} {{
    const int iw = i % g.width;
    const int r = i / g.width;
    const int ih = r % g.height;
    const int plane = r / g.height;
    const int oh_lo = ih >= g.kernel ? (ih - g.kernel + g.stride) / g.stride : 0;
    const int ow_lo = iw >= g.kernel ? (iw - g.kernel + g.stride) / g.stride : 0;
    const int oh_hi = min(ih / g.stride, g.out_h - 1);
    const int ow_hi = min(iw / g.stride, g.out_w - 1);
    T sum = T(0);
    for (int oh = oh_lo; oh <= oh_hi; ++oh)
      for (int ow = ow_lo; ow <= ow_hi; ++ow) {{
        T best_value;
        const int corner = (plane * g.height + oh * g.stride) * g.width + ow * g.stride;
        if (window_max32<0>(x, g, corner, best_value) == i) sum += dy[(plane * g.out_h + oh) * g.out_w + ow];
      }}
    dx[i] = sum;
  }}
}}
)",
                     name, kGridStrideLoop32);
}

const char* fast_suffix(PoolFast which) {
  switch (which) {
    case PoolFast::forward_k2: return "forward_k2";
    case PoolFast::forward_any: return "forward";
    case PoolFast::select_k2: return "select_k2";
    case PoolFast::select_any: return "select";
    case PoolFast::grad_cells2: return "grad_cells2";
    case PoolFast::grad_cells: return "grad_cells";
    case PoolFast::grad_overlap: return "grad_overlap";
  }
  KILN_ASSERT(false, "unknown pool kernel {}", static_cast<int>(which));
}

}  // namespace

std::string max_pool_fast_name(PoolFast which, DType dtype) {
  return fmt::format("kiln_max_pool2d32_{}_{}", fast_suffix(which), dtype_name(dtype));
}

jit::KernelSource max_pool_fast_source(PoolFast which, DType dtype) {
  const std::string name = max_pool_fast_name(which, dtype);
  std::string code = fmt::format("typedef {} T;\n{}{}", cuda_type_name(dtype), kPoolShape32Struct, kWindowMax32);
  switch (which) {
    case PoolFast::forward_k2: code += fast_gather_body(name, false, 2); break;
    case PoolFast::forward_any: code += fast_gather_body(name, false, 0); break;
    case PoolFast::select_k2: code += fast_gather_body(name, true, 2); break;
    case PoolFast::select_any: code += fast_gather_body(name, true, 0); break;
    case PoolFast::grad_cells2: code += fast_cells_body(name, true); break;
    case PoolFast::grad_cells: code += fast_cells_body(name, false); break;
    case PoolFast::grad_overlap: code += fast_overlap_body(name); break;
  }
  return {name, code, {}};
}

jit::KernelSource max_pool_source(PoolKernel which, DType dtype) {
  const std::string name = fmt::format("kiln_max_pool2d_{}_{}", kernel_suffix(which), dtype_name(dtype));
  std::string code = fmt::format("typedef {} T;\n{}{}", cuda_type_name(dtype), kPoolShapeStruct, kWindowArgmax);
  code += which == PoolKernel::grad ? grad_body(name) : gather_body(name, which == PoolKernel::forward);
  return {name, code, {}};
}

}  // namespace kiln::cuda
