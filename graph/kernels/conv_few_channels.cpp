// Convolutions over one to three input channels (a network's first layer), forward and
// weight gradient, computed directly: each image's channels are split once into zero-padded
// phase planes (Phases), where every tap reads at a fixed offset from its output cell, and the
// output is computed 16 cells at a time with each cell's sums in registers over all taps (the
// forward: 4 output channels at once; the weight gradient: every tap's 16 partial sums).
// oneDNN ran LeNet's 1 -> 32 3x3 layer at about a sixth of the processor's rate (batch 64, 2
// threads: 0.45 ms forward), and im2col + GEMM, whose GEMM is [Cout, 784] x [784, 9], not much
// better. The sums go in a fixed order for any thread count.
#include "graph/kernels/conv_few_channels.h"

#include "graph/kernels/conv_epilogue.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/dispatch.h"

namespace kiln::kernels {
namespace {

// Image b's padded input split into stride x stride phase planes per channel: phase (r, q)
// holds the padded cells (s i + r, s j + q) at row i, column j, in rows of `columns` cells;
// zeros around and past the image. A tap (kh, kw) of output cell (oh, ow) reads padded cell
// (s oh + kh, s ow + kw): phase (kh % s, kw % s) at (oh + kh / s, ow + kw / s). So with the
// output laid out in rows of `columns` cells too ("wide": the cells past out_w are scratch),
// a tap reads the phase plane at a fixed offset from the output cell's index, and every tap
// is one loop over the whole plane, which vectorizes (a loop per output row of 7 to 28 cells
// left most of the work in scalar remainders).
struct Phases {
  std::int64_t stride, columns, rows, plane;  // plane: rows * columns
  explicit Phases(const ConvGeometry& g)
      : stride(g.stride),
        columns((g.width + 2 * g.padding + g.stride - 1) / g.stride),
        rows(g.out_h + (g.kernel_h - 1) / g.stride + 1),
        plane(rows * columns) {}
  std::int64_t wide_cells(const ConvGeometry& g) const { return g.out_h * columns; }
  std::int64_t size(const ConvGeometry& g) const { return g.in_channels * stride * stride * plane; }
  // Where tap (kh, kw) of channel c reads for the wide output cell 0.
  std::int64_t tap(std::int64_t c, std::int64_t kh, std::int64_t kw) const {
    return ((c * stride + kh % stride) * stride + kw % stride) * plane + kh / stride * columns +
           kw / stride;
  }
};

// A short row (7 to 32 cells here) by a loop: std::copy_n's call to memmove cost more than
// the copy.
template <class T>
inline void copy_row(const T* from, std::int64_t n, T* to) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) to[i] = from[i];
}

template <class T>
void split_image(const T* x, std::int64_t b, const ConvGeometry& g, const Phases& ph, T* out) {
  std::fill_n(out, ph.size(g), T(0));
  const std::int64_t s = ph.stride;
  for (std::int64_t c = 0; c < g.in_channels; ++c)
    for (std::int64_t h = 0; h < g.height; ++h) {
      const T* row = x + ((b * g.in_channels + c) * g.height + h) * g.width;
      const std::int64_t r = h + g.padding;
      if (r / s >= ph.rows) continue;  // below every window
      T* phase_row = out + (c * s + r % s) * s * ph.plane + r / s * ph.columns;
      if (s == 1) {
        copy_row(row, std::min(g.width, ph.columns - g.padding), phase_row + g.padding);
        continue;
      }
      // Padded column q goes to phase q % s, column q / s: counted, not divided.
      std::int64_t phase = g.padding % s, column = g.padding / s;
      for (std::int64_t w = 0; w < g.width && column < ph.columns; ++w) {
        phase_row[phase * ph.plane + column] = row[w];
        if (++phase == s) {
          phase = 0;
          ++column;
        }
      }
    }
}

constexpr std::int64_t kLanes = 16;   // cells a block: one vector of 16 floats
constexpr std::int64_t kOutputs = 4;  // output channels the forward computes together

// What both passes derive from the geometry: the phases, the taps (kK: the kernel's size
// where it is a template argument, else 0) and the wide planes' blocks of kLanes cells.
template <int kK>
struct Blocks {
  Phases ph;
  std::int64_t kw_n, taps, blocks;
  explicit Blocks(const ConvGeometry& g)
      : ph(g),
        kw_n(kK ? kK : g.kernel_w),
        taps((kK ? kK : g.kernel_h) * kw_n),
        blocks((ph.wide_cells(g) + kLanes - 1) / kLanes) {}
};

// y[b, o] = sum over (c, kh, kw), in that order, of w[o, c, kh, kw] times the tap's cells,
// kLanes cells at a time, their sums in registers over all taps. Threads split the batch. kK:
// the kernel's size where it is square and 3, 4 or 5 (the taps unrolled), else 0 (any: each
// tap in turn over the whole plane, the sums in memory).
// The epilogue (conv2d_bias's) is applied to each output row as it is copied out.
template <int kK, class T>
void forward_typed(const T* x, const T* w, T* y, const ConvGeometry& g, const ConvEpilogue& e) {
  const Blocks<kK> bl(g);
  const Phases& ph = bl.ph;
  const std::int64_t kw_n = bl.kw_n, taps = bl.taps, blocks = bl.blocks;
  const std::int64_t stride = blocks * kLanes;  // of the wide output planes
#pragma omp parallel
  {
    // kLanes cells of slack: the last block reads past the planes.
    std::vector<T> phases(static_cast<std::size_t>(ph.size(g) + kLanes));
    // The wide planes of kOutputs channels, copied out to y after each group.
    std::vector<T> wide(static_cast<std::size_t>(kOutputs * stride));
    std::vector<std::int64_t> offsets(static_cast<std::size_t>(g.in_channels * taps));
    for (std::int64_t c = 0; c < g.in_channels; ++c)
      for (std::int64_t t = 0; t < taps; ++t)
        offsets[static_cast<std::size_t>(c * taps + t)] = ph.tap(c, t / kw_n, t % kw_n);
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < g.batch; ++b) {
      split_image(x, b, g, ph, phases.data());
      for (std::int64_t o0 = 0; o0 < g.out_channels; o0 += kOutputs) {
        const std::int64_t count = std::min(kOutputs, g.out_channels - o0);
        if constexpr (kK == 0) {  // taps in turn over the whole plane (their count unknown)
          for (std::int64_t q = 0; q < count; ++q) {
            T* sum = wide.data() + q * stride;
            std::fill_n(sum, stride, T(0));
            for (std::int64_t i = 0; i < g.in_channels * taps; ++i) {
              const T weight = w[(o0 + q) * g.in_channels * taps + i];
              const T* cells = phases.data() + offsets[static_cast<std::size_t>(i)];
#pragma omp simd
              for (std::int64_t j = 0; j < stride; ++j) sum[j] += weight * cells[j];
            }
          }
        } else {
          // kOutputs channels at a time: each tap's cells are loaded once for all of them, and
          // their sums are independent chains of FMAs (one channel's nine were one chain, which
          // waited on each FMA's latency).
          for (std::int64_t block = 0; block < blocks; ++block) {
            T sum[kOutputs][kLanes] = {};
            for (std::int64_t c = 0; c < g.in_channels; ++c) {
              const std::int64_t* off = offsets.data() + c * taps;
              const T* in = phases.data() + block * kLanes;
              // Unrolled, so that GCC vectorizes each tap's cells, not the taps by gathers.
#pragma GCC unroll 32
              for (std::int64_t t = 0; t < kK * kK; ++t) {
                const T* cells = in + off[t];
#pragma GCC unroll 8
                for (std::int64_t q = 0; q < kOutputs; ++q) {
                  const T weight = q < count ? w[((o0 + q) * g.in_channels + c) * taps + t] : T(0);
#pragma omp simd
                  for (std::int64_t l = 0; l < kLanes; ++l) sum[q][l] += weight * cells[l];
                }
              }
            }
            for (std::int64_t q = 0; q < count; ++q)
              std::copy_n(sum[q], kLanes, wide.data() + q * stride + block * kLanes);
          }
        }
        for (std::int64_t q = 0; q < count; ++q) {
          T* plane = y + (b * g.out_channels + o0 + q) * g.out_h * g.out_w;
          for (std::int64_t oh = 0; oh < g.out_h; ++oh)
            copy_row(wide.data() + q * stride + oh * ph.columns, g.out_w, plane + oh * g.out_w);
          apply_conv_epilogue(plane, g.out_h * g.out_w, e, o0 + q);
        }
      }
    }
  }
}

// dw[o, c, kh, kw] = sum over images and output cells of dy times the cell the tap reads. The
// batch is cut into 8 fixed chunks (fewer for a smaller batch); a chunk keeps kLanes partial
// sums per weight (wide cell i adds into lane i % kLanes; dy is 0 in the scratch cells): for
// each (o, c), the taps' lanes stay in registers over the image's blocks and are then added
// into the chunk's, images in order; the lanes are folded in order at the chunk's end and the
// chunks added in order.
template <int kK, class T>
void backward_weight_typed(const T* x, const T* dy, T* dw, const ConvGeometry& g) {
  const Blocks<kK> bl(g);
  const Phases& ph = bl.ph;
  const std::int64_t kw_n = bl.kw_n, taps = bl.taps, blocks = bl.blocks;
  const std::int64_t weights = g.out_channels * g.in_channels * taps;
  const std::int64_t chunks = std::min<std::int64_t>(g.batch, 8);
  constexpr std::int64_t kMaxTaps = kK ? kK * kK : 1;
  std::vector<T> partials(static_cast<std::size_t>(chunks * weights));
#pragma omp parallel
  {
    std::vector<T> phases(static_cast<std::size_t>(ph.size(g) + kLanes));
    std::vector<T> grad(static_cast<std::size_t>(blocks * kLanes), T(0));
    std::vector<T> lanes(static_cast<std::size_t>(weights * kLanes));
#pragma omp for schedule(static)
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
      std::fill(lanes.begin(), lanes.end(), T(0));
      for (std::int64_t b = chunk * g.batch / chunks; b < (chunk + 1) * g.batch / chunks; ++b) {
        split_image(x, b, g, ph, phases.data());
        for (std::int64_t o = 0; o < g.out_channels; ++o) {
          const T* d = dy + (b * g.out_channels + o) * g.out_h * g.out_w;
          for (std::int64_t oh = 0; oh < g.out_h; ++oh)
            copy_row(d + oh * g.out_w, g.out_w, grad.data() + oh * ph.columns);
          for (std::int64_t c = 0; c < g.in_channels; ++c) {
            T* into = lanes.data() + (o * g.in_channels + c) * taps * kLanes;
            if constexpr (kK != 0) {
              T sum[kMaxTaps][kLanes] = {};
              for (std::int64_t block = 0; block < blocks; ++block) {
                const T* gb = grad.data() + block * kLanes;
#pragma GCC unroll 32
                for (std::int64_t t = 0; t < kMaxTaps; ++t) {
                  const T* cells = phases.data() + ph.tap(c, t / kK, t % kK) + block * kLanes;
#pragma omp simd
                  for (std::int64_t l = 0; l < kLanes; ++l) sum[t][l] += gb[l] * cells[l];
                }
              }
              for (std::int64_t t = 0; t < kMaxTaps; ++t)
                for (std::int64_t l = 0; l < kLanes; ++l) into[t * kLanes + l] += sum[t][l];
            } else {
              for (std::int64_t t = 0; t < taps; ++t) {
                const T* cells = phases.data() + ph.tap(c, t / kw_n, t % kw_n);
                for (std::int64_t block = 0; block < blocks; ++block)
#pragma omp simd
                  for (std::int64_t l = 0; l < kLanes; ++l)
                    into[t * kLanes + l] += grad[block * kLanes + l] * cells[block * kLanes + l];
              }
            }
          }
        }
      }
      T* partial = partials.data() + chunk * weights;
      for (std::int64_t i = 0; i < weights; ++i) {
        T total = T(0);
        for (std::int64_t l = 0; l < kLanes; ++l) total += lanes[i * kLanes + l];
        partial[i] = total;
      }
    }
  }
  std::fill_n(dw, weights, T(0));
  for (std::int64_t chunk = 0; chunk < chunks; ++chunk)
    for (std::int64_t i = 0; i < weights; ++i) dw[i] += partials[chunk * weights + i];
}

// The kernel size as a template argument where it is square and 3, 4 or 5.
template <class Run>
void by_kernel_size(const ConvGeometry& g, Run run) {
  if (g.kernel_h == g.kernel_w && g.kernel_h == 3) return run(std::integral_constant<int, 3>{});
  if (g.kernel_h == g.kernel_w && g.kernel_h == 4) return run(std::integral_constant<int, 4>{});
  if (g.kernel_h == g.kernel_w && g.kernel_h == 5) return run(std::integral_constant<int, 5>{});
  run(std::integral_constant<int, 0>{});
}

}  // namespace

bool few_channels_fits(const ConvGeometry& g) {
  return g.in_channels >= 1 && g.in_channels <= 3 && g.batch >= 1 && g.out_h >= 1 && g.out_w >= 1 &&
         g.out_channels >= 1;
}

void few_channels_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g,
                          const ConvEpilogue& epilogue) {
  visit_floating(x.dtype(), "conv2d", [&](auto zero) {
    using T = decltype(zero);
    by_kernel_size(g, [&](auto k) {
      forward_typed<k.value>(x.data<T>(), w.data<T>(), y.data<T>(), g, epilogue);
    });
  });
}

void few_channels_backward_weight(const Tensor& x, const Tensor& dy, Tensor& dw,
                                  const ConvGeometry& g) {
  visit_floating(x.dtype(), "conv2d_grad_weight", [&](auto zero) {
    using T = decltype(zero);
    by_kernel_size(g, [&](auto k) {
      backward_weight_typed<k.value>(x.data<T>(), dy.data<T>(), dw.data<T>(), g);
    });
  });
}

}  // namespace kiln::kernels
