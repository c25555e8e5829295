// The fused LSTM recurrence on the CPU (lstm_cpu.h). Hidden units are split into fixed
// blocks of kUnits and batch rows into fixed blocks of kRows; a task owns one block of units
// for one block of rows and all four gates, so each GEMM and each cell element depends on
// the blocks only, never on the thread count. The
// cell's exp and tanh are Eigen's SIMD functions, as in the elementwise ops.
#include "graph/kernels/lstm_cpu.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <oneapi/dnnl/dnnl.h>
#include <type_traits>
#include <vector>

#include "core/dispatch.h"

namespace kiln::kernels {
namespace {

template <class T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ConstMap = Eigen::Map<const Matrix<T>, 0, Eigen::OuterStride<>>;
template <class T>
using MutMap = Eigen::Map<Matrix<T>, 0, Eigen::OuterStride<>>;
template <class T>
using ArrayMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
using ConstArrayMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

constexpr int kUnits = 64;  // hidden units per task (the blocks depend on H only)
// Batch rows per task: H = 256 gives 4 unit blocks, so a batch of 64 in 32-row blocks keeps
// 8 threads busy (one block of all rows left half of 8 threads idle at every step).
constexpr std::int64_t kRows = 32;

struct Block {
  std::int64_t first, width;  // hidden units [first, first + width)
  std::int64_t row, rows;     // batch rows [row, row + rows)
};
std::int64_t row_blocks(const LstmDims& d) { return (d.batch + kRows - 1) / kRows; }
std::int64_t block_count(const LstmDims& d) {
  return (d.hidden + kUnits - 1) / kUnits * row_blocks(d);
}
// Task `index`: row blocks vary fastest, so a thread's static share of the tasks covers as few
// unit blocks as it can, and reads only their columns of u, which then stay in its cache from
// step to step (at 2 threads each reads half of u: 4-6 % off the forward's GEMMs).
Block task_block(std::int64_t index, const LstmDims& d) {
  const std::int64_t rows = row_blocks(d);
  const std::int64_t first = index / rows * kUnits, row = index % rows * kRows;
  return {first, std::min<std::int64_t>(kUnits, d.hidden - first), row,
          std::min(kRows, d.batch - row)};
}

// C [m, n] = A [m, k] B (B [k, n], or B^T for B [n, k]), row-major with leading dimensions:
// float through oneDNN's sgemm (about 20% faster than Eigen's here; inside the team it runs
// on the calling thread alone), double through Eigen.
template <class T>
void gemm(const T* a, std::int64_t lda, const T* b, std::int64_t ldb, bool b_transposed, T* c,
          std::int64_t ldc, std::int64_t m, std::int64_t n, std::int64_t k) {
  if constexpr (std::is_same_v<T, float>) {
    const dnnl_status_t status =
        dnnl_sgemm('N', b_transposed ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    KILN_CHECK(status == dnnl_success, "lstm: oneDNN's sgemm failed ({})",
               static_cast<int>(status));
  } else {
    const ConstMap<T> am(a, m, k, Eigen::OuterStride<>(lda));
    MutMap<T> cm(c, m, n, Eigen::OuterStride<>(ldc));
    if (b_transposed)
      cm.noalias() = am * ConstMap<T>(b, n, k, Eigen::OuterStride<>(ldb)).transpose();
    else
      cm.noalias() = am * ConstMap<T>(b, k, n, Eigen::OuterStride<>(ldb));
  }
}

// The time processed at step n of the processing order.
std::int64_t time_at(const LstmDims& d, std::int64_t n) { return d.reverse ? d.steps - 1 - n : n; }

// u [H, 4H] regrouped by unit block: block j's columns of gates i, f, g, o side by side in a
// matrix [H, 4w] of its own, stored at 4 * first * H, so that a task's four gate products are
// one GEMM (fewer, wider calls: each call packs its operands anew) whose right operand's rows
// are 4w apart, not 4H: rows 4 KiB apart (H = 256) fall into the same cache sets, and
// oneDNN's packing of them ran 12-15 % slower (the forward's GEMMs, 2 threads).
template <class T>
std::vector<T> gate_blocked(const T* u, const LstmDims& d) {
  const std::int64_t H = d.hidden, G = 4 * H;
  std::vector<T> out(static_cast<std::size_t>(H * G));
  for (std::int64_t first = 0; first < H; first += kUnits) {
    const std::int64_t w = std::min<std::int64_t>(kUnits, H - first);
    T* block = out.data() + 4 * first * H;
    for (std::int64_t r = 0; r < H; ++r)
      for (std::int64_t k = 0; k < 4; ++k)
        std::copy_n(u + r * G + k * H + first, w, block + r * 4 * w + k * w);
  }
  return out;
}

// u^T [4H, H] regrouped the same way: block j's columns [first, first + w) of u^T (its rows of
// u) as a matrix [4H, w] of its own at 4 * first * H, the right operand of the backward's dh
// product for the block. This writes row g of every block.
template <class T>
void transpose_blocked_row(const T* u, std::int64_t g, T* ut, const LstmDims& d) {
  const std::int64_t H = d.hidden, G = 4 * H;
  for (std::int64_t first = 0; first < H; first += kUnits) {
    const std::int64_t w = std::min<std::int64_t>(kUnits, H - first);
    T* row = ut + 4 * first * H + g * w;
    for (std::int64_t h = 0; h < w; ++h) row[h] = u[(first + h) * G + g];
  }
}

template <class T>
struct Forward {
  const T *projected, *u, *h0, *c0;
  T *hs, *cs, *acts;
  LstmDims d;

  // Step n for block b: z = h_prev u for the block's rows and columns of each gate
  // ([rows, 4w] in scratch, gates side by side), then the cell on projected + z.
  void step(std::int64_t n, Block b, T* scratch) const {
    const std::int64_t B = d.batch, H = d.hidden, G = 4 * H, w = b.width, t = time_at(d, n);
    const T* h_prev = n == 0 ? h0 : hs + time_at(d, n - 1) * B * H;
    const T* c_prev = n == 0 ? c0 : cs + time_at(d, n - 1) * B * H;
    // The block's columns of all four gates are one matrix [H, 4w] (see gate_blocked).
    gemm(h_prev + b.row * H, H, u + 4 * b.first * H, 4 * w, false, scratch, 4 * w, b.rows, 4 * w,
         H);
    for (std::int64_t r = b.row; r < b.row + b.rows; ++r) {
      const T* p = projected + (t * B + r) * G + b.first;
      const T* z = scratch + (r - b.row) * 4 * w;
      T* a = acts + (t * B + r) * G + b.first;
      const std::int64_t at = (t * B + r) * H + b.first;
      ArrayMap<T> i(a, w), f(a + H, w), g(a + 2 * H, w), o(a + 3 * H, w), c(cs + at, w);
      i = (T(1) + (-(ConstArrayMap<T>(p, w) + ConstArrayMap<T>(z, w))).exp()).inverse();
      f = (T(1) + (-(ConstArrayMap<T>(p + H, w) + ConstArrayMap<T>(z + w, w))).exp()).inverse();
      g = (ConstArrayMap<T>(p + 2 * H, w) + ConstArrayMap<T>(z + 2 * w, w)).tanh();
      o = (T(1) + (-(ConstArrayMap<T>(p + 3 * H, w) + ConstArrayMap<T>(z + 3 * w, w))).exp())
              .inverse();
      c = f * ConstArrayMap<T>(c_prev + r * H + b.first, w) + i * g;
      ArrayMap<T>(hs + at, w) = o * c.tanh();
    }
  }
};

template <class T>
void forward_typed(const Tensor& projected, const Tensor& u, const Tensor& h0, const Tensor& c0,
                   Tensor& hs, Tensor& cs, Tensor& acts, const LstmDims& d) {
  const std::vector<T> blocked = gate_blocked(u.data<T>(), d);
  const Forward<T> f{projected.data<T>(), blocked.data(), h0.data<T>(),   c0.data<T>(),
                     hs.data<T>(),        cs.data<T>(),   acts.data<T>(), d};
  const std::int64_t blocks = block_count(d);
  // Always a team (even for one block): Eigen then keeps each GEMM single-threaded.
#pragma omp parallel
  {
    std::vector<T> scratch(static_cast<std::size_t>(kRows * 4 * kUnits));
    for (std::int64_t n = 0; n < d.steps; ++n) {
#pragma omp for schedule(static)
      for (std::int64_t q = 0; q < blocks; ++q) f.step(n, task_block(q, d), scratch.data());
    }
  }
}

template <class T>
struct Backward {
  const T *d_hs, *d_cs, *ut, *c0, *cs, *acts;  // ut: u^T by unit block (transpose_blocked_row)
  T *d_projected, *dh, *dc;  // dh, dc [B, H]: the gradients flowing to the previous step
  LstmDims d;

  // Backward step k (k = 0: the last processed step) for block b: first dh = d_projected of
  // the step processed after this one, times u^T (zero for k = 0), then the cell's gradient.
  // k = steps only does the GEMM: dh = dh0.
  void step(std::int64_t k, Block b) const {
    const std::int64_t B = d.batch, H = d.hidden, G = 4 * H, n = d.steps - 1 - k;
    if (k > 0) {
      gemm(d_projected + (time_at(d, n + 1) * B + b.row) * G, G, ut + 4 * b.first * H, b.width,
           false, dh + b.row * H + b.first, H, b.rows, b.width, G);
    }
    if (n < 0) return;
    const std::int64_t t = time_at(d, n);
    const T* c_prev = n == 0 ? c0 : cs + time_at(d, n - 1) * B * H;
    for (std::int64_t r = b.row; r < b.row + b.rows; ++r)
      cell_gradient(t * B + r, r * H + b.first, c_prev + r * H + b.first, b);
  }

  // The cell's gradient for block b's units of `row` of the [T*B, .] tensors; `state` is
  // the offset of the same units in dh, dc [B, H], c_prev points to their c_prev.
  void cell_gradient(std::int64_t row, std::int64_t state, const T* c_prev, Block b) const {
    const std::int64_t H = d.hidden, G = 4 * H, first = b.first, w = b.width, at = row * H + first;
    const T* a = acts + row * G + first;
    T* da = d_projected + row * G + first;
    const ConstArrayMap<T> i(a, w), f(a + H, w), g(a + 2 * H, w), o(a + 3 * H, w);
    Eigen::Array<T, kUnits, 1> tc_buffer, dh_buffer, dc_buffer;
    auto tc = tc_buffer.head(w), dh_t = dh_buffer.head(w), dc_t = dc_buffer.head(w);
    ArrayMap<T> dc_next(dc + state, w);
    tc = ConstArrayMap<T>(cs + at, w).tanh();
    dh_t = ConstArrayMap<T>(d_hs + at, w) + ConstArrayMap<T>(dh + state, w);
    dc_t = ConstArrayMap<T>(d_cs + at, w) + dc_next + dh_t * o * (T(1) - tc * tc);
    ArrayMap<T>(da, w) = dc_t * g * i * (T(1) - i);
    ArrayMap<T>(da + H, w) = dc_t * ConstArrayMap<T>(c_prev, w) * f * (T(1) - f);
    ArrayMap<T>(da + 2 * H, w) = dc_t * i * (T(1) - g * g);
    ArrayMap<T>(da + 3 * H, w) = dh_t * tc * o * (T(1) - o);
    dc_next = dc_t * f;
  }
};

template <class T>
void backward_typed(const LstmGradInputs& in, Tensor& d_projected, Tensor& dh0, Tensor& dc0,
                    const LstmDims& d) {
  // dh0 and dc0 carry the running dh_next and dc_next; they start at zero.
  std::fill_n(dh0.data<T>(), dh0.numel(), T(0));
  std::fill_n(dc0.data<T>(), dc0.numel(), T(0));
  // u transposed once, so every step's dh GEMM reads its right operand untransposed (oneDNN's
  // sgemm was about 40% slower on the transposed one); a copy of 4H^2 values per sequence.
  const std::int64_t G = 4 * d.hidden;
  std::vector<T> ut(static_cast<std::size_t>(G * d.hidden));
  const T* u = in.u.data<T>();
  const Backward<T> bw{
      in.d_hs.data<T>(), in.d_cs.data<T>(),     ut.data(),     in.c0.data<T>(), in.cs.data<T>(),
      in.acts.data<T>(), d_projected.data<T>(), dh0.data<T>(), dc0.data<T>(),   d};
  const std::int64_t blocks = block_count(d);
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (std::int64_t g = 0; g < G; ++g) transpose_blocked_row(u, g, ut.data(), d);
    for (std::int64_t k = 0; k <= d.steps; ++k) {
#pragma omp for schedule(static)
      for (std::int64_t q = 0; q < blocks; ++q) bw.step(k, task_block(q, d));
    }
  }
}

}  // namespace

void lstm_forward(const Tensor& projected, const Tensor& u, const Tensor& h0, const Tensor& c0,
                  Tensor& hs, Tensor& cs, Tensor& acts, const LstmDims& d) {
  visit_floating(projected.dtype(), "lstm_sequence", [&](auto zero) {
    forward_typed<decltype(zero)>(projected, u, h0, c0, hs, cs, acts, d);
  });
}

void lstm_backward(const LstmGradInputs& in, Tensor& d_projected, Tensor& dh0, Tensor& dc0,
                   const LstmDims& d) {
  visit_floating(in.u.dtype(), "lstm_sequence_grad",
                 [&](auto zero) { backward_typed<decltype(zero)>(in, d_projected, dh0, dc0, d); });
}

}  // namespace kiln::kernels
