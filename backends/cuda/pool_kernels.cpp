// CUDA C of pooling. Max: forward and select (one thread per window) and the gradient as a
// gather (one thread per input element, summing the windows whose first maximum it is).
// Average: forward per window, gradient as a gather. Windows are clipped to the plane
// (Note [padded pooling], graph/kernels/pool_cpu.cpp).
#include <fmt/format.h>

#include <utility>

#include "backends/cuda/kernel_params.h"
#include "backends/cuda/kernel_sources.h"
#include "core/error.h"

namespace kiln::cuda {
namespace {

// The window (oh, ow) clipped to the plane: rows [h0, h1), columns [w0, w1).
constexpr const char* kWindowRange = R"(
struct WindowRange { long long h0, h1, w0, w1; };
__device__ __forceinline__ WindowRange window_range(const PoolShape& g, long long oh, long long ow) {
  const long long top = oh * g.stride - g.padding, left = ow * g.stride - g.padding;
  WindowRange r;
  r.h0 = max(top, 0LL);
  r.h1 = min(top + g.kernel, g.height);
  r.w0 = max(left, 0LL);
  r.w1 = min(left + g.kernel, g.width);
  return r;
}
// The windows [lo, hi] along one axis that contain input index i (empty when lo > hi).
__device__ __forceinline__ void windows_over(long long i, long long out, const PoolShape& g, long long& lo,
                                             long long& hi) {
  const long long shifted = i + g.padding;
  lo = shifted >= g.kernel ? (shifted - g.kernel + g.stride) / g.stride : 0;
  hi = min(shifted / g.stride, out - 1);
}
)";

// The flat index in x of window (plane, oh, ow)'s maximum, by the CPU's rule
// (graph/kernels/pool_cpu.cpp, for_each_window_max): the first maximum, and a NaN wins
// (the last NaN, as the CPU's `take` keeps taking NaNs).
constexpr const char* kWindowArgmax = R"(
__device__ __forceinline__ long long window_argmax(const T* __restrict__ x, const PoolShape& g,
                                                   long long plane, long long oh, long long ow) {
  const WindowRange r = window_range(g, oh, ow);
  const long long base = plane * g.height * g.width;
  long long best = base + r.h0 * g.width + r.w0;
  T best_value = x[best];
  for (long long h = r.h0; h < r.h1; ++h)
    for (long long c = r.w0; c < r.w1; ++c) {
      const long long at = base + h * g.width + c;
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
                     name, from_x ? "" : "const T* __restrict__ src, ", kGridStrideLoop,
                     from_x ? "x" : "src");
}

// dx[e] = sum of dy over the windows containing e (in window order, as the CPU adds them)
// whose maximum is e. Without overlap (stride >= kernel) at most one window contains e.
// Windows oh with oh*s - p <= ih <= oh*s - p + k - 1, clipped to the output.
std::string grad_body(const std::string& name) {
  return fmt::format(R"(
extern "C" __global__ void {0}(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx, PoolShape g) {{
  const long long n = g.planes * g.height * g.width;
  {1} {{
    const long long iw = i % g.width;
    const long long ih = (i / g.width) % g.height;
    const long long plane = i / (g.width * g.height);
    long long oh_lo, oh_hi, ow_lo, ow_hi;
    windows_over(ih, g.out_h, g, oh_lo, oh_hi);
    windows_over(iw, g.out_w, g, ow_lo, ow_hi);
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
    case PoolKernel::forward:
      return "forward";
    case PoolKernel::grad:
      return "grad";
    case PoolKernel::select:
      return "select";
  }
  KILN_ASSERT(false, "unknown pool kernel {}", static_cast<int>(which));
}

// The 32-bit kernels. window_max32: the CPU's first maximum (a NaN wins, the last NaN) of
// the window whose top-left element is x[corner] (no padding); KS > 0 fixes the window
// size. window_max32_clipped: the same for window (plane, oh, ow) with any padding.
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

__device__ __forceinline__ int window_max32_clipped(const T* __restrict__ x, const PoolShape32& g, int plane,
                                                    int oh, int ow, T& best_value) {
  const int top = oh * g.stride - g.padding, left = ow * g.stride - g.padding;
  const int h0 = max(top, 0), h1 = min(top + g.kernel, g.height);
  const int w0 = max(left, 0), w1 = min(left + g.kernel, g.width);
  const int base = plane * g.height * g.width;
  int best = base + h0 * g.width + w0;
  best_value = x[best];
  for (int h = h0; h < h1; ++h)
    for (int c = w0; c < w1; ++c) {
      const int at = base + h * g.width + c;
      const T v = x[at];
      const bool take = v > best_value || v != v;
      best = take ? at : best;
      best_value = take ? v : best_value;
    }
  return best;
}

// The windows [lo, hi] along one axis that contain input index i (empty when lo > hi).
__device__ __forceinline__ void windows_over32(int i, int out, const PoolShape32& g, int& lo, int& hi) {
  const int shifted = i + g.padding;
  lo = shifted >= g.kernel ? (shifted - g.kernel + g.stride) / g.stride : 0;
  hi = min(shifted / g.stride, out - 1);
}

// Window i -> (plane, oh, ow).
__device__ __forceinline__ void window_coords(const PoolShape32& g, int i, int& plane, int& oh, int& ow) {
  ow = i % g.out_w;
  const int r = i / g.out_w;
  oh = r % g.out_h;
  plane = r / g.out_h;
}

// Window i = (plane, oh, ow) -> its top-left element (no padding).
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

// forward: y = max of x's window; select: y = src at the window's first maximum. ks = 2:
// 2x2 windows without padding; ks = 0: any window and padding.
std::string fast_gather_body(const std::string& name, bool select, int ks) {
  const char* find = ks > 0 ? "window_max32<2>(x, g, window_corner(g, i, oh, ow), best_value)"
                            : "window_max32_clipped(x, g, plane, oh, ow, best_value)";
  return fmt::format(R"(
extern "C" __global__ void {0}(const T* __restrict__ x, {1}T* __restrict__ y, PoolShape32 g) {{
  const int n = g.planes * g.out_h * g.out_w;
  {2} {{
    int plane, oh, ow;
    window_coords(g, i, plane, oh, ow);
    T best_value;
    const int best = {3};
    y[i] = {4};
  }}
}}
)",
                     name, select ? "const T* __restrict__ src, " : "", kGridStrideLoop32, find,
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

// Overlapping or padded windows: the gather of grad_body with 32-bit indices.
std::string fast_overlap_body(const std::string& name) {
  return fmt::format(R"(
extern "C" __global__ void {0}(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx, PoolShape32 g) {{
  const int n = g.planes * g.height * g.width;
  {1} {{
    const int iw = i % g.width;
    const int r = i / g.width;
    const int ih = r % g.height;
    const int plane = r / g.height;
    int oh_lo, oh_hi, ow_lo, ow_hi;
    windows_over32(ih, g.out_h, g, oh_lo, oh_hi);
    windows_over32(iw, g.out_w, g, ow_lo, ow_hi);
    T sum = T(0);
    for (int oh = oh_lo; oh <= oh_hi; ++oh)
      for (int ow = ow_lo; ow <= ow_hi; ++ow) {{
        T best_value;
        if (window_max32_clipped(x, g, plane, oh, ow, best_value) == i) sum += dy[(plane * g.out_h + oh) * g.out_w + ow];
      }}
    dx[i] = sum;
  }}
}}
)",
                     name, kGridStrideLoop32);
}

// Average pooling, as the CPU computes it: forward, the window's cells summed in row-major
// order from 0 and divided by their count; gradient, a gather per input element of
// dy[w] / cells(w) over the windows w containing it, in window order.
constexpr const char* kAvgForward = R"(
extern "C" __global__ void NAME(const T* __restrict__ x, T* __restrict__ y, PoolShape g) {
  const long long n = g.planes * g.out_h * g.out_w;
  LOOP {
    const long long ow = i % g.out_w;
    const long long oh = (i / g.out_w) % g.out_h;
    const T* __restrict__ in = x + i / (g.out_w * g.out_h) * g.height * g.width;
    const WindowRange r = window_range(g, oh, ow);
    T sum = T(0);
    for (long long h = r.h0; h < r.h1; ++h)
      for (long long c = r.w0; c < r.w1; ++c) sum += in[h * g.width + c];
    y[i] = sum / (T)((r.h1 - r.h0) * (r.w1 - r.w0));
  }
}
)";

constexpr const char* kAvgGrad = R"(
extern "C" __global__ void NAME(const T* __restrict__ dy, T* __restrict__ dx, PoolShape g) {
  const long long n = g.planes * g.height * g.width;
  LOOP {
    const long long iw = i % g.width;
    const long long ih = (i / g.width) % g.height;
    const T* __restrict__ grad = dy + i / (g.width * g.height) * g.out_h * g.out_w;
    long long oh_lo, oh_hi, ow_lo, ow_hi;
    windows_over(ih, g.out_h, g, oh_lo, oh_hi);
    windows_over(iw, g.out_w, g, ow_lo, ow_hi);
    T sum = T(0);
    for (long long oh = oh_lo; oh <= oh_hi; ++oh)
      for (long long ow = ow_lo; ow <= ow_hi; ++ow) {
        const WindowRange r = window_range(g, oh, ow);
        sum += grad[oh * g.out_w + ow] / (T)((r.h1 - r.h0) * (r.w1 - r.w0));
      }
    dx[i] = sum;
  }
}
)";

// `body` with NAME and LOOP substituted (it contains braces, so no fmt).
std::string substitute(std::string body, const std::string& name) {
  for (const auto& [key, value] :
       {std::pair<std::string, std::string>{"NAME", name}, {"LOOP", kGridStrideLoop}}) {
    const std::size_t at = body.find(key);
    KILN_ASSERT(at != std::string::npos, "pool kernel template lacks {}", key);
    body.replace(at, key.size(), value);
  }
  return body;
}

const char* fast_suffix(PoolFast which) {
  switch (which) {
    case PoolFast::forward_k2:
      return "forward_k2";
    case PoolFast::forward_any:
      return "forward";
    case PoolFast::select_k2:
      return "select_k2";
    case PoolFast::select_any:
      return "select";
    case PoolFast::grad_cells2:
      return "grad_cells2";
    case PoolFast::grad_cells:
      return "grad_cells";
    case PoolFast::grad_overlap:
      return "grad_overlap";
  }
  KILN_ASSERT(false, "unknown pool kernel {}", static_cast<int>(which));
}

}  // namespace

std::string max_pool_fast_name(PoolFast which, DType dtype) {
  return fmt::format("kiln_max_pool2d32_{}_{}", fast_suffix(which), dtype_name(dtype));
}

gpu::KernelSource max_pool_fast_source(PoolFast which, DType dtype) {
  const std::string name = max_pool_fast_name(which, dtype);
  std::string code =
      fmt::format("typedef {} T;\n{}{}", cuda_type_name(dtype), kPoolShape32Struct, kWindowMax32);
  switch (which) {
    case PoolFast::forward_k2:
      code += fast_gather_body(name, false, 2);
      break;
    case PoolFast::forward_any:
      code += fast_gather_body(name, false, 0);
      break;
    case PoolFast::select_k2:
      code += fast_gather_body(name, true, 2);
      break;
    case PoolFast::select_any:
      code += fast_gather_body(name, true, 0);
      break;
    case PoolFast::grad_cells2:
      code += fast_cells_body(name, true);
      break;
    case PoolFast::grad_cells:
      code += fast_cells_body(name, false);
      break;
    case PoolFast::grad_overlap:
      code += fast_overlap_body(name);
      break;
  }
  return {name, code, {}};
}

gpu::KernelSource max_pool_source(PoolKernel which, DType dtype) {
  const std::string name =
      fmt::format("kiln_max_pool2d_{}_{}", kernel_suffix(which), dtype_name(dtype));
  std::string code = fmt::format("typedef {} T;\n{}{}{}", cuda_type_name(dtype), kPoolShapeStruct,
                                 kWindowRange, kWindowArgmax);
  code +=
      which == PoolKernel::grad ? grad_body(name) : gather_body(name, which == PoolKernel::forward);
  return {name, code, {}};
}

std::string avg_pool_name(bool grad, DType dtype) {
  return fmt::format("kiln_avg_pool2d_{}_{}", grad ? "grad" : "forward", dtype_name(dtype));
}

gpu::KernelSource avg_pool_source(bool grad, DType dtype) {
  const std::string name = avg_pool_name(grad, dtype);
  std::string code =
      fmt::format("typedef {} T;\n{}{}", cuda_type_name(dtype), kPoolShapeStruct, kWindowRange);
  code += substitute(grad ? kAvgGrad : kAvgForward, name);
  return {name, code, {}};
}

}  // namespace kiln::cuda
