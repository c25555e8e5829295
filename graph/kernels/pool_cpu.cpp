// Pooling on the CPU: the reference that the CUDA kernels (backends/cuda/pool*.cpp) match.
// Note [padded pooling]: a window is clipped to the plane, so padded cells never win a max
// and are not counted in an average (PyTorch's count_include_pad=false). padding <= kernel/2
// (checked by the ops) keeps at least one real cell in every window.
#include "graph/kernels/pool_cpu.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dispatch.h"
#include "graph/kernels/pool_max_rule.h"

namespace kiln::kernels {
namespace {

using namespace max_rule;

// The windows containing input row (or column) i: [lo, hi], empty when lo > hi.
std::pair<std::int64_t, std::int64_t> windows_over(std::int64_t i, std::int64_t out,
                                                   const PoolGeometry& g) {
  const std::int64_t shifted = i + g.padding;
  const std::int64_t lo = shifted >= g.kernel ? (shifted - g.kernel + g.stride) / g.stride : 0;
  return {lo, std::min(shifted / g.stride, out - 1)};
}

bool parallel_worth_it(const PoolGeometry& g) { return g.planes * g.out_h * g.out_w > 4096; }

// Calls visit(window_output_index, offset_of_first_max, max) for every pooling window, in window
// order within a plane; threads share out whole planes, so visits that write to x's
// positions (the gradient) never collide and sum in the same order for any thread count.
// Unpadded windows all have kernel x kernel cells: that loop-invariant trip count makes
// LeNet's 2x2 pools about a third faster than the clipped loop, hence kPadded.
template <bool kPadded, class T, class Visit>
void windows_max(const T* x, const PoolGeometry& g, Visit visit) {
#pragma omp parallel for schedule(static) if (parallel_worth_it(g))
  for (std::int64_t plane = 0; plane < g.planes; ++plane) {
    const std::int64_t base = plane * g.height * g.width;
    std::int64_t i = plane * g.out_h * g.out_w;
    for (std::int64_t oh = 0; oh < g.out_h; ++oh) {
      const PoolSpan rows = pool_span(oh, g.height, g);
      const std::int64_t row_cells = kPadded ? rows.cells() : g.kernel;
      for (std::int64_t ow = 0; ow < g.out_w; ++ow, ++i) {
        const PoolSpan cols = pool_span(ow, g.width, g);
        const std::int64_t col_cells = kPadded ? cols.cells() : g.kernel;
        const std::int64_t corner = base + rows.lo * g.width + cols.lo;
        std::int64_t best = corner;
        T best_value = x[corner];
        for (std::int64_t r = 0; r < row_cells; ++r)
          for (std::int64_t c = 0; c < col_cells; ++c) {
            const std::int64_t at = corner + r * g.width + c;
            const T v = x[at];
            const bool take = (v > best_value) | is_nan(v);  // NaN propagates
            best = take ? at : best;
            best_value = take ? v : best_value;
          }
        visit(i, best, best_value);
      }
    }
  }
}

// The first maximum of the kKernel x kKernel window at `corner` (rows `width` apart), in
// registers: its value and its offset from the corner. Cells in row-major order, as
// windows_max takes them, so the same maximum wins.
template <int kKernel, class T>
inline void window_max(const T* corner, std::int64_t width, std::int64_t& best, T& best_value) {
  best = 0;
  best_value = corner[0];
  for (int r = 0; r < kKernel; ++r)
    for (int c = 0; c < kKernel; ++c) {
      if (r == 0 && c == 0) continue;
      const std::int64_t at = r * width + c;
      const T v = corner[at];
      const bool take = (v > best_value) | is_nan(v);  // NaN propagates
      best = take ? at : best;
      best_value = take ? v : best_value;
    }
}

// Unpadded kKernel x kKernel windows at stride kStride: the window's loops have compile-time
// trip counts and its maximum stays in registers. (A first form compared each cell offset
// across a row of windows held in arrays: vgg's 14-, 7- and 3-window rows left it at about
// 2 GB/s, a fifth of vgg's CPU step in pooling.)
template <int kKernel, int kStride, class T, class Visit>
void fixed_windows_max(const T* x, const PoolGeometry& g, Visit visit) {
#pragma omp parallel for schedule(static) if (parallel_worth_it(g))
  for (std::int64_t plane = 0; plane < g.planes; ++plane) {
    const std::int64_t base = plane * g.height * g.width;
    for (std::int64_t oh = 0; oh < g.out_h; ++oh) {
      const std::int64_t top = base + oh * kStride * g.width;
      const std::int64_t first = (plane * g.out_h + oh) * g.out_w;
      for (std::int64_t ow = 0; ow < g.out_w; ++ow) {
        std::int64_t best;
        T best_value;
        window_max<kKernel>(x + top + ow * kStride, g.width, best, best_value);
        visit(first + ow, top + ow * kStride + best, best_value);
      }
    }
  }
}

// The first maximum of the cells a, b, c (in that order) by window_max's rule: the value, and
// which cell (0, 1, 2); without jumps, so that the loops around it vectorize.
template <class T>
inline void first_max_of_3(T a, T b, T c, T& value, std::int32_t& which) {
  const bool take_b = (b > a) | is_nan(b);
  const T ab = take_b ? b : a;
  const bool take_c = (c > ab) | is_nan(c);
  value = take_c ? c : ab;
  which = take_c ? 2 : static_cast<std::int32_t>(take_b);
}

// The same for two cells a, b: which is 0 or 1.
template <class T>
inline void first_max_of_2(T a, T b, T& value, std::int32_t& which) {
  const bool take_b = (b > a) | is_nan(b);
  value = take_b ? b : a;
  which = static_cast<std::int32_t>(take_b);
}

// Unpadded 2x2 windows at stride 2 (LeNet's and VGG's pools): row(top, first) for each row of
// windows, `top` the offset of its top-left cell in x, `first` its first window's index. The
// forward, the gradient and the select each run a row as one loop over its windows without
// jumps, vectorized four windows at a time (simdlen(4): LeNet's and VGG's rows of 14 and 7
// windows are shorter than 16 lanes, which left every window to the scalar remainder). Window
// by window, with scalar bit masks, LeNet's four pooling passes took 30 % of its CPU step
// (2.5 ns a window at 2 threads); now a quarter of that. Threads share out whole planes.
template <class Row>
void for_each_2x2_row(const PoolGeometry& g, Row row) {
#pragma omp parallel for schedule(static) if (parallel_worth_it(g))
  for (std::int64_t plane = 0; plane < g.planes; ++plane)
    for (std::int64_t oh = 0; oh < g.out_h; ++oh)
      row(plane * g.height * g.width + 2 * oh * g.width, (plane * g.out_h + oh) * g.out_w);
}

// Padded 3x3 windows, padding 1, at stride 1 or 2 (Inception's and AlexNet's pools), by rows
// then columns: each row's first maximum over the three columns around every cell, then the
// first of the three rows' around it (strictly greater, or a NaN, takes it: the same winner as
// the row-major scan of the window's cells, so the same bits), for the window centred on every
// cell; stride 2's windows are those centred on even rows and columns. Each pass is one loop
// over the whole plane without jumps, which vectorizes even on 7-cell rows (short loops a row
// left most of the work in scalar tails; a load under a condition kept GCC from vectorizing).
// The loops compute the cells at the plane's edges wrongly (a neighbouring row's cells) and
// the edges are redone after them, clipped to two cells, also without jumps. Each plane's
// windows are visited in window order, as windows_max does (the gradient's sums keep their
// order). (Through windows_max, Inception's pools took half of its CPU step, about 7 ns a
// window.)
template <int kStride, class T, class Visit>
void pool3_padded_max(const T* x, const PoolGeometry& g, Visit visit) {
  const std::int64_t width = g.width, height = g.height, cells = height * width;
  // Planes are taken several at a time, as one plane of their rows stacked (at least
  // kBatchCells cells): the passes' loops then run long enough to pay for themselves on 7 x 7
  // and 14 x 14 planes (a plane at a time, Inception's 7 x 7 pools took about 10 cycles a
  // cell). A plane's first and last rows, which the stacked column pass takes from its
  // neighbours, are redone like the edges.
  constexpr std::int64_t kBatchCells = 1024;
  const std::int64_t per_batch = std::max<std::int64_t>(1, kBatchCells / cells);
  const std::int64_t batches = (g.planes + per_batch - 1) / per_batch;
#pragma omp parallel if (parallel_worth_it(g))
  {
    // Per cell: the row's first maximum around it, and its offset in the batch; then the
    // maximum of the 3x3 window centred on it.
    const auto batch_cells = static_cast<std::size_t>(per_batch * cells);
    std::vector<T> row_value(batch_cells), value(batch_cells);
    std::vector<std::int32_t> row_best(batch_cells), best(batch_cells);
#pragma omp for schedule(static)
    for (std::int64_t batch = 0; batch < batches; ++batch) {
      const std::int64_t first_plane = batch * per_batch;
      const std::int64_t planes = std::min(per_batch, g.planes - first_plane);
      const std::int64_t n = planes * cells, rows = planes * height;
      const T* in = x + first_plane * cells;
      T* v = row_value.data();
      std::int32_t* at = row_best.data();
#pragma omp simd
      for (std::int64_t j = 1; j < n - 1; ++j) {
        std::int32_t which;
        first_max_of_3(in[j - 1], in[j], in[j + 1], v[j], which);
        at[j] = static_cast<std::int32_t>(j - 1) + which;
      }
#pragma omp simd
      for (std::int64_t h = 0; h < rows; ++h) {  // the clipped runs: 2 cells at each edge
        const std::int64_t left = h * width, right = left + width - 1;
        std::int32_t which;
        first_max_of_2(in[left], in[left + 1], v[left], which);
        at[left] = static_cast<std::int32_t>(left) + which;
        first_max_of_2(in[right - 1], in[right], v[right], which);
        at[right] = static_cast<std::int32_t>(right - 1) + which;
      }
      T* out_value = value.data();
      std::int32_t* out_best = best.data();
#pragma omp simd
      for (std::int64_t j = width; j < n - width; ++j) {  // the inner rows in one loop
        std::int32_t r;
        first_max_of_3(v[j - width], v[j], v[j + width], out_value[j], r);
        const std::int32_t top = at[j - width], middle = at[j], bottom = at[j + width];
        out_best[j] = r == 0 ? top : r == 1 ? middle : bottom;  // loaded first: no jumps
      }
      for (std::int64_t plane = 0; plane < planes; ++plane)
        for (const std::int64_t row : {std::int64_t{0}, height - 1}) {  // 2 rows at its edges
          const std::int64_t first_row = plane * height + (row == 0 ? 0 : row - 1);
          const std::int64_t out_row = plane * height + row;
          const T* v0 = v + first_row * width;
          const std::int32_t* a0 = at + first_row * width;
#pragma omp simd
          for (std::int64_t c = 0; c < width; ++c) {
            std::int32_t r;
            first_max_of_2(v0[c], v0[c + width], out_value[out_row * width + c], r);
            const std::int32_t top = a0[c], bottom = a0[c + width];
            out_best[out_row * width + c] = r == 0 ? top : bottom;
          }
        }
      const std::int64_t base = first_plane * cells;
      for (std::int64_t plane = 0; plane < planes; ++plane) {
        const std::int64_t first = (first_plane + plane) * g.out_h * g.out_w;
        for (std::int64_t oh = 0; oh < g.out_h; ++oh)
          for (std::int64_t ow = 0; ow < g.out_w; ++ow) {
            const std::int64_t at_window = plane * cells + (oh * width + ow) * kStride;  // centre
            visit(first + oh * g.out_w + ow, base + out_best[at_window], out_value[at_window]);
          }
      }
    }
  }
}

template <class T, class Visit>
void for_each_window_max(const T* x, const PoolGeometry& g, Visit visit) {
  // pool3_padded_max keeps offsets within a batch of planes (1024 cells, or one plane) in 32
  // bits.
  if (g.kernel == 3 && g.padding == 1 && g.height >= 2 && g.width >= 2 &&
      g.height * g.width <= std::numeric_limits<std::int32_t>::max()) {
    if (g.stride == 1) return pool3_padded_max<1>(x, g, visit);
    if (g.stride == 2) return pool3_padded_max<2>(x, g, visit);
  }
  if (g.padding > 0) return windows_max<true>(x, g, visit);
  if (g.kernel == 3 && g.stride == 2) return fixed_windows_max<3, 2>(x, g, visit);
  windows_max<false>(x, g, visit);
}

// The gradient of unpadded 2x2 windows at stride 2 (disjoint: an x cell is in one window at
// most): each window writes its four cells of dx, 0 + dy at the first maximum (the sum the
// general path makes) and 0 elsewhere, and the cells in no window (an odd last row or
// column) get 0; no first pass zeroing dx, no read-modify-write of it.
template <class T>
void max_backward_2x2(const T* x, const T* dy, T* dx, const PoolGeometry& g, bool relu) {
  for_each_2x2_row(g, [&](std::int64_t top, std::int64_t first) {
    // Locals, not the captures: a store to dx might change those for all GCC knows.
    const std::int64_t w = g.width, windows = g.out_w;
    const T* in = x + top;
    const T* grad = dy + first;
    T* out = dx + top;
#pragma omp simd simdlen(4)
    for (std::int64_t ow = 0; ow < windows; ++ow) {
      const Max2x2<T> m =
          first_max_of_2x2(in[2 * ow], in[2 * ow + 1], in[w + 2 * ow], in[w + 2 * ow + 1]);
      const T routed = T(0) + relu_routed(grad[ow], m.value, relu);
      out[2 * ow] = masked(routed, m.wins[0]);
      out[2 * ow + 1] = masked(routed, m.wins[1]);
      out[w + 2 * ow] = masked(routed, m.wins[2]);
      out[w + 2 * ow + 1] = masked(routed, m.wins[3]);
    }
    if (w % 2 == 1) out[w - 1] = out[2 * w - 1] = T(0);
  });
  if (g.height % 2 == 1)  // an odd last row
    for (std::int64_t plane = 0; plane < g.planes; ++plane)
      std::fill_n(dx + (plane * g.height + g.height - 1) * g.width, g.width, T(0));
}

// y = the sum of the window's cells in row-major order from 0, divided by their count.
template <class T>
void avg_forward_typed(const T* x, T* y, const PoolGeometry& g) {
#pragma omp parallel for schedule(static) if (parallel_worth_it(g))
  for (std::int64_t plane = 0; plane < g.planes; ++plane) {
    const T* in = x + plane * g.height * g.width;
    T* out = y + plane * g.out_h * g.out_w;
    for (std::int64_t oh = 0; oh < g.out_h; ++oh) {
      const PoolSpan rows = pool_span(oh, g.height, g);
      for (std::int64_t ow = 0; ow < g.out_w; ++ow) {
        const PoolSpan cols = pool_span(ow, g.width, g);
        T sum = T(0);
        for (std::int64_t h = rows.lo; h < rows.hi; ++h)
          for (std::int64_t c = cols.lo; c < cols.hi; ++c) sum += in[h * g.width + c];
        out[oh * g.out_w + ow] = sum / static_cast<T>(rows.cells() * cols.cells());
      }
    }
  }
}

// A gather per input element (windows in row-major order), as the CUDA kernel does.
template <class T>
void avg_backward_typed(const T* dy, T* dx, const PoolGeometry& g) {
#pragma omp parallel for schedule(static) if (parallel_worth_it(g))
  for (std::int64_t plane = 0; plane < g.planes; ++plane) {
    const T* grad = dy + plane * g.out_h * g.out_w;
    T* out = dx + plane * g.height * g.width;
    for (std::int64_t ih = 0; ih < g.height; ++ih) {
      const auto [oh_lo, oh_hi] = windows_over(ih, g.out_h, g);
      for (std::int64_t iw = 0; iw < g.width; ++iw) {
        const auto [ow_lo, ow_hi] = windows_over(iw, g.out_w, g);
        T sum = T(0);
        for (std::int64_t oh = oh_lo; oh <= oh_hi; ++oh)
          for (std::int64_t ow = ow_lo; ow <= ow_hi; ++ow)
            sum += grad[oh * g.out_w + ow] / static_cast<T>(pool_span(oh, g.height, g).cells() *
                                                            pool_span(ow, g.width, g).cells());
        out[ih * g.width + iw] = sum;
      }
    }
  }
}

// Unpadded 2x2 windows at stride 2 (for_each_2x2_row).
bool disjoint_2x2(const PoolGeometry& g) {
  return g.kernel == 2 && g.stride == 2 && g.padding == 0 && g.out_h > 0 && g.out_w > 0;
}

}  // namespace

PoolGeometry pool_geometry(const Shape& x, std::int64_t kernel, std::int64_t stride,
                           std::int64_t padding) {
  PoolGeometry g{x[0] * x[1], x[2], x[3], kernel, stride, padding, 0, 0};
  g.out_h = (g.height + 2 * padding - kernel) / stride + 1;
  g.out_w = (g.width + 2 * padding - kernel) / stride + 1;
  return g;
}

void max_pool2d_forward(const Tensor& x, Tensor& y, const PoolGeometry& g) {
  visit_floating(x.dtype(), "max_pool2d", [&](auto zero) {
    using T = decltype(zero);
    const T* in = x.data<T>();
    T* out = y.data<T>();
    if (disjoint_2x2(g))
      return for_each_2x2_row(g, [&](std::int64_t top, std::int64_t first) {
        const std::int64_t w = g.width, windows = g.out_w;  // locals (max_backward_2x2)
        const T *x0 = in + top, *x1 = x0 + w;
        T* out_row = out + first;
#pragma omp simd simdlen(4)
        for (std::int64_t ow = 0; ow < windows; ++ow) {
          out_row[ow] =
              first_max_of_2x2(x0[2 * ow], x0[2 * ow + 1], x1[2 * ow], x1[2 * ow + 1]).value;
        }
      });
    for_each_window_max(in, g, [&](std::int64_t i, std::int64_t, T value) { out[i] = value; });
  });
}

void max_pool2d_backward(const Tensor& x, const Tensor& dy, Tensor& dx, const PoolGeometry& g,
                         bool relu) {
  visit_floating(x.dtype(), "max_pool2d_grad", [&](auto zero) {
    using T = decltype(zero);
    const T* grad = dy.data<T>();
    T* out = dx.data<T>();
    if (disjoint_2x2(g)) return max_backward_2x2(x.data<T>(), grad, out, g, relu);
    const std::int64_t plane_size = g.height * g.width;
#pragma omp parallel for schedule(static) if (parallel_worth_it(g))
    for (std::int64_t plane = 0; plane < g.planes; ++plane)
      std::fill_n(out + plane * plane_size, plane_size, T(0));
    for_each_window_max(x.data<T>(), g, [&](std::int64_t i, std::int64_t best, T max) {
      out[best] += relu_routed(grad[i], max, relu);
    });
  });
}

void max_pool2d_select(const Tensor& x, const Tensor& g_in, Tensor& out, const PoolGeometry& g) {
  visit_floating(x.dtype(), "max_pool2d_select", [&](auto zero) {
    using T = decltype(zero);
    const T* src = g_in.data<T>();
    T* dst = out.data<T>();
    const T* in = x.data<T>();
    if (disjoint_2x2(g))
      return for_each_2x2_row(g, [&](std::int64_t top, std::int64_t first) {
        const std::int64_t w = g.width, windows = g.out_w;  // locals (max_backward_2x2)
        const T *x0 = in + top, *x1 = x0 + w, *s0 = src + top, *s1 = s0 + w;
        T* out_row = dst + first;
#pragma omp simd simdlen(4)
        for (std::int64_t ow = 0; ow < windows; ++ow) {
          const Max2x2<T> m =
              first_max_of_2x2(x0[2 * ow], x0[2 * ow + 1], x1[2 * ow], x1[2 * ow + 1]);
          const MaxBits<T> picked = std::bit_cast<MaxBits<T>>(masked(s0[2 * ow], m.wins[0])) |
                                    std::bit_cast<MaxBits<T>>(masked(s0[2 * ow + 1], m.wins[1])) |
                                    std::bit_cast<MaxBits<T>>(masked(s1[2 * ow], m.wins[2])) |
                                    std::bit_cast<MaxBits<T>>(masked(s1[2 * ow + 1], m.wins[3]));
          out_row[ow] = std::bit_cast<T>(picked);
        }
      });
    for_each_window_max(x.data<T>(), g,
                        [&](std::int64_t i, std::int64_t best, T) { dst[i] = src[best]; });
  });
}

void avg_pool2d_forward(const Tensor& x, Tensor& y, const PoolGeometry& g) {
  visit_floating(x.dtype(), "avg_pool2d", [&](auto zero) {
    using T = decltype(zero);
    avg_forward_typed<T>(x.data<T>(), y.data<T>(), g);
  });
}

void avg_pool2d_backward(const Tensor& dy, Tensor& dx, const PoolGeometry& g) {
  visit_floating(dy.dtype(), "avg_pool2d_grad", [&](auto zero) {
    using T = decltype(zero);
    avg_backward_typed<T>(dy.data<T>(), dx.data<T>(), g);
  });
}

}  // namespace kiln::kernels
