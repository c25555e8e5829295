// The blocked max pooling kernels (pool_blocked.h).
#include "graph/kernels/pool_blocked.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <vector>

#include "graph/kernels/block_transpose.h"
#include "graph/kernels/pool_max_rule.h"
#include "graph/op.h"

namespace kiln::kernels {
namespace {

constexpr std::int64_t kLanes = kBlockLanes;
using namespace max_rule;

// One [B, C, H, W] tensor a block at a time: in place where it is blocked, else its block's
// 16 NCHW planes transposed into or out of a buffer.
class Blocks {
 public:
  Blocks(const Tensor& t, bool blocked)
      : data_(const_cast<float*>(t.data<float>())),
        channels_(t.shape()[1]),
        cells_(t.shape()[2] * t.shape()[3]),
        blocked_(blocked) {}
  std::int64_t size() const { return cells_ * kLanes; }  // floats in a block
  // Block k (image k / (C / 16), its channels' block k % (C / 16)), read.
  const float* read(std::int64_t k, float* buf) const {
    if (blocked_) return data_ + k * size();
    planes_to_lanes(planes(k), cells_, cells_, buf);
    return buf;
  }
  // Where block k is computed (then `store`d).
  float* target(std::int64_t k, float* buf) const { return blocked_ ? data_ + k * size() : buf; }
  void store(std::int64_t k, const float* buf) const {
    if (!blocked_) lanes_to_planes(buf, cells_, planes(k), cells_);
  }

 private:
  float* planes(std::int64_t k) const {
    const std::int64_t blocks = channels_ / kLanes;
    return data_ + ((k / blocks) * channels_ + k % blocks * kLanes) * cells_;
  }
  float* data_;
  std::int64_t channels_, cells_;
  bool blocked_;
};

bool bit(std::uint32_t bits, std::uint32_t i) { return (bits >> i & 1u) != 0; }

// Calls visit(window, at, value) for each window of block x ([H][W][16]) in window order:
// per channel, the cell of its first maximum (a NaN wins) and that maximum.
template <class Visit>
void block_windows(const float* x, const PoolGeometry& g, Visit visit) {
  std::int64_t window = 0;
  for (std::int64_t oh = 0; oh < g.out_h; ++oh) {
    const PoolSpan rows = pool_span(oh, g.height, g);
    for (std::int64_t ow = 0; ow < g.out_w; ++ow, ++window) {
      const PoolSpan cols = pool_span(ow, g.width, g);
      const std::int32_t corner = static_cast<std::int32_t>(rows.lo * g.width + cols.lo);
      float value[kLanes];
      std::int32_t at[kLanes];
      for (std::int64_t l = 0; l < kLanes; ++l) {
        value[l] = x[corner * kLanes + l];
        at[l] = corner;
      }
      // The corner again: only a NaN takes it, and it is already there.
      for (std::int64_t r = rows.lo; r < rows.hi; ++r)
        for (std::int64_t c = cols.lo; c < cols.hi; ++c) {
          const auto cell = static_cast<std::int32_t>(r * g.width + c);
          const float* v = x + cell * kLanes;
#pragma omp simd
          for (std::int64_t l = 0; l < kLanes; ++l) {
            const bool take = (v[l] > value[l]) | (v[l] != v[l]);
            value[l] = take ? v[l] : value[l];
            at[l] = take ? cell : at[l];
          }
        }
      visit(window, at, value);
    }
  }
}

// Unpadded 2x2 windows at stride 2 (VGG's and LeNet's pools): calls visit(window, cells) with
// the offsets of the window's four cells' channels in row-major order; each window's
// channels then take their first maximum (max_rule::first_max_of_2x2) in one vector of selects,
// without the general loop's bookkeeping (which made VGG's gradient pass 2-3x slower).
bool is_2x2(const PoolGeometry& g) { return g.kernel == 2 && g.stride == 2 && g.padding == 0; }
template <class Visit>
void windows_2x2(const PoolGeometry& g, Visit visit) {
  for (std::int64_t oh = 0; oh < g.out_h; ++oh)
    for (std::int64_t ow = 0; ow < g.out_w; ++ow) {
      const std::int64_t top = (2 * oh * g.width + 2 * ow) * kLanes;
      const std::int64_t below = top + g.width * kLanes;
      visit(oh * g.out_w + ow,
            std::array<std::int64_t, 4>{top, top + kLanes, below, below + kLanes});
    }
}

// Runs pass(k, inputs' blocks, output block) over the blocks, threads sharing them out.
template <class Pass>
void for_each_block(const std::vector<Blocks>& in, const Blocks& out, std::int64_t blocks,
                    Pass pass) {
  const bool parallel = blocks * out.size() > 4096;
#pragma omp parallel if (parallel)
  {
    std::vector<std::vector<float>> bufs;
    for (const Blocks& b : in) bufs.emplace_back(static_cast<std::size_t>(b.size()));
    std::vector<float> out_buf(static_cast<std::size_t>(out.size()));
    std::vector<const float*> read(in.size());
#pragma omp for schedule(static)
    for (std::int64_t k = 0; k < blocks; ++k) {
      for (std::size_t i = 0; i < in.size(); ++i) read[i] = in[i].read(k, bufs[i].data());
      float* target = out.target(k, out_buf.data());
      pass(read, target);
      out.store(k, target);
    }
  }
}

std::int64_t block_count(const Tensor& x) { return x.shape()[0] * x.shape()[1] / kLanes; }

}  // namespace

void max_pool2d_forward_blocked(const Tensor& x, Tensor& y, const PoolGeometry& g,
                                std::uint32_t blocked) {
  for_each_block(
      {Blocks(x, bit(blocked, 0))}, Blocks(y, bit(blocked, kBlockedOutputs)), block_count(x),
      [&](const std::vector<const float*>& in, float* out) {
        if (is_2x2(g))
          return windows_2x2(g, [&](std::int64_t w, const std::array<std::int64_t, 4>& at) {
            const float* x0 = in[0];
            float* y = out + w * kLanes;
#pragma omp simd
            for (std::int64_t l = 0; l < kLanes; ++l)
              y[l] = first_max_of_2x2(x0[at[0] + l], x0[at[1] + l], x0[at[2] + l], x0[at[3] + l])
                         .value;
          });
        block_windows(in[0], g, [&](std::int64_t w, const std::int32_t*, const float* value) {
          std::copy_n(value, kLanes, out + w * kLanes);
        });
      });
}

void max_pool2d_backward_blocked(const Tensor& x, const Tensor& dy, Tensor& dx,
                                 const PoolGeometry& g, std::uint32_t blocked, bool relu) {
  const Blocks out(dx, bit(blocked, kBlockedOutputs));
  // Disjoint windows (VGG's and LeNet's 2x2 at stride 2) write each of their cells once, 0 +
  // dy at the first maximum (the sum of the general path) and 0 elsewhere: no clearing first,
  // unless cells past the last window take none.
  const bool disjoint = g.stride == g.kernel && g.padding == 0;
  const bool clear = !disjoint || g.out_h * g.kernel != g.height || g.out_w * g.kernel != g.width;
  for_each_block(
      {Blocks(x, bit(blocked, 0)), Blocks(dy, bit(blocked, 1))}, out, block_count(x),
      [&](const std::vector<const float*>& in, float* dx_block) {
        if (clear) std::fill_n(dx_block, out.size(), 0.0f);
        const float* grad = in[1];
        if (is_2x2(g))
          return windows_2x2(g, [&](std::int64_t w, const std::array<std::int64_t, 4>& at) {
            const float* x0 = in[0];
            const float* dy_w = grad + w * kLanes;
            float *d0 = dx_block + at[0], *d1 = dx_block + at[1], *d2 = dx_block + at[2],
                  *d3 = dx_block + at[3];
#pragma omp simd
            for (std::int64_t l = 0; l < kLanes; ++l) {
              const Max2x2<float> m =
                  first_max_of_2x2(x0[at[0] + l], x0[at[1] + l], x0[at[2] + l], x0[at[3] + l]);
              const float routed = 0.0f + relu_routed(dy_w[l], m.value, relu);
              d0[l] = masked(routed, m.wins[0]);
              d1[l] = masked(routed, m.wins[1]);
              d2[l] = masked(routed, m.wins[2]);
              d3[l] = masked(routed, m.wins[3]);
            }
          });
        block_windows(in[0], g, [&](std::int64_t w, const std::int32_t* at, const float* max) {
          float dy_w[kLanes];
          for (std::int64_t l = 0; l < kLanes; ++l)
            dy_w[l] = relu_routed(grad[w * kLanes + l], max[l], relu);
          if (!disjoint) {
            for (std::int64_t l = 0; l < kLanes; ++l) dx_block[at[l] * kLanes + l] += dy_w[l];
            return;
          }
          const std::int64_t top = w / g.out_w * g.kernel, left = w % g.out_w * g.kernel;
          for (std::int64_t r = top; r < top + g.kernel; ++r)
            for (std::int64_t c = left; c < left + g.kernel; ++c) {
              const auto cell = static_cast<std::int32_t>(r * g.width + c);
              float* d = dx_block + cell * kLanes;
#pragma omp simd
              for (std::int64_t l = 0; l < kLanes; ++l)
                d[l] = at[l] == cell ? 0.0f + dy_w[l] : 0.0f;
            }
        });
      });
}

void max_pool2d_select_blocked(const Tensor& x, const Tensor& g_in, Tensor& out,
                               const PoolGeometry& g, std::uint32_t blocked) {
  for_each_block(
      {Blocks(x, bit(blocked, 0)), Blocks(g_in, bit(blocked, 1))},
      Blocks(out, bit(blocked, kBlockedOutputs)), block_count(x),
      [&](const std::vector<const float*>& in, float* selected) {
        const float* src = in[1];
        if (is_2x2(g))
          return windows_2x2(g, [&](std::int64_t w, const std::array<std::int64_t, 4>& at) {
            const float* x0 = in[0];
            float* out_w = selected + w * kLanes;
#pragma omp simd
            for (std::int64_t l = 0; l < kLanes; ++l) {
              const Max2x2<float> m =
                  first_max_of_2x2(x0[at[0] + l], x0[at[1] + l], x0[at[2] + l], x0[at[3] + l]);
              out_w[l] = std::bit_cast<float>(
                  std::bit_cast<std::uint32_t>(masked(src[at[0] + l], m.wins[0])) |
                  std::bit_cast<std::uint32_t>(masked(src[at[1] + l], m.wins[1])) |
                  std::bit_cast<std::uint32_t>(masked(src[at[2] + l], m.wins[2])) |
                  std::bit_cast<std::uint32_t>(masked(src[at[3] + l], m.wins[3])));
            }
          });
        block_windows(in[0], g, [&](std::int64_t w, const std::int32_t* at, const float*) {
          for (std::int64_t l = 0; l < kLanes; ++l)
            selected[w * kLanes + l] = src[at[l] * kLanes + l];
        });
      });
}

}  // namespace kiln::kernels
