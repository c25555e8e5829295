// lstm_sequence and its gradient (lstm_sequence_grad + one GEMM) against the unrolled graph
// of graph ops that Recurrent used before (per step a GEMM and the cell), values and
// gradients, both directions; the same bits for any thread count; the mistakes rejected.
#include <doctest/doctest.h>
#include <omp.h>

#include <cstring>

#include "graph/autograd.h"
#include "graph/nn/functional.h"
#include "graph/ops.h"
#include "tests/support.h"

namespace kiln {
namespace {

struct LstmCase {
  std::int64_t steps, batch, hidden;
  bool reverse;
  DType dtype = DType::f64;
};

struct Result {
  Value hs, final_c;
};

// The direction unrolled in graph ops: per step h U, the gate slices, the cell.
Result unrolled(Value projected, Value u, Value h, Value c, const LstmCase& k) {
  std::vector<Value> outputs(static_cast<std::size_t>(k.steps));
  const std::int64_t b = k.batch, hd = k.hidden;
  for (std::int64_t s = 0; s < k.steps; ++s) {
    const std::int64_t t = k.reverse ? k.steps - 1 - s : s;
    const Value rows = slice(projected, 0, t * b, b), recurrent = matmul(h, u);
    auto gate = [&](std::int64_t j) {
      return slice(rows, 1, j * hd, hd) + slice(recurrent, 1, j * hd, hd);
    };
    const Value in = sigmoid(gate(0)), forget = sigmoid(gate(1)), cell = tanh(gate(2)),
                out = sigmoid(gate(3));
    c = forget * c + in * cell;
    h = out * tanh(c);
    outputs[static_cast<std::size_t>(t)] = h;
  }
  return {concat(outputs, 0), c};
}

Result fused(Value projected, Value u, Value h, Value c, const LstmCase& k) {
  const LstmSequence s = lstm_sequence(projected, u, h, c, k.steps, k.reverse);
  return {s.hs, slice(s.cs, 0, (k.reverse ? 0 : k.steps - 1) * k.batch, k.batch)};
}

// hs, the final c and the gradients of a random weighting of both with respect to the
// four inputs, from either builder.
Outputs run_lstm(const LstmCase& k, Result (*build)(Value, Value, Value, Value, const LstmCase&)) {
  const std::int64_t n = k.steps * k.batch, h = k.hidden;
  const std::vector<Shape> shapes = {{n, 4 * h}, {h, 4 * h}, {k.batch, h}, {k.batch, h}};
  Graph g;
  std::vector<Value> in;
  std::vector<Feed> feeds;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const std::string name = "in" + std::to_string(i);
    in.push_back(g.input(name, shapes[i], k.dtype));
    feeds.emplace_back(name, test::random_tensor(shapes[i], k.dtype, 40 + i, i == 0 ? -2.0 : -1.0,
                                                 i == 0 ? 2.0 : 1.0));
  }
  const Result r = build(in[0], in[1], in[2], in[3], k);
  const Value loss =
      sum_all(r.hs * g.constant(test::random_tensor({n, h}, k.dtype, 50))) +
      sum_all(r.final_c * g.constant(test::random_tensor({k.batch, h}, k.dtype, 51)));
  const std::vector<Value> grads = grad(loss, in);
  g.output("hs", r.hs);
  g.output("final_c", r.final_c);
  for (std::size_t i = 0; i < grads.size(); ++i) g.output("grad" + std::to_string(i), grads[i]);
  return test::run_once(g, feeds);
}

void check_against_unrolled(const LstmCase& k, double tolerance) {
  CAPTURE(k.steps);
  CAPTURE(k.batch);
  CAPTURE(k.hidden);
  CAPTURE(k.reverse);
  const Outputs want = run_lstm(k, unrolled), got = run_lstm(k, fused);
  for (const char* name : {"hs", "final_c", "grad0", "grad1", "grad2", "grad3"}) {
    CAPTURE(name);
    CHECK(test::closeness(got.at(name), want.at(name), tolerance, tolerance) <= 1.0);
  }
}

}  // namespace

TEST_CASE("lstm_sequence gives the unrolled graph's values and gradients, forward and reverse") {
  for (bool reverse : {false, true}) {
    check_against_unrolled({5, 3, 37, reverse},
                           1e-12);  // two blocks of hidden units, the second partial
    check_against_unrolled({1, 2, 4, reverse}, 1e-12);
    check_against_unrolled({7, 4, 64, reverse, DType::f32}, 2e-5);
  }
}

TEST_CASE("lstm_sequence and its gradient are the same bits for any thread count") {
  const LstmCase k{6, 5, 70, true, DType::f32};  // three blocks of hidden units
  omp_set_num_threads(1);
  const Outputs serial = run_lstm(k, fused);
  for (int threads : {2, 3}) {
    CAPTURE(threads);
    omp_set_num_threads(threads);
    const Outputs threaded = run_lstm(k, fused);
    for (const char* name : {"hs", "final_c", "grad0", "grad1", "grad2", "grad3"}) {
      CAPTURE(name);
      CHECK(std::memcmp(threaded.at(name).raw(), serial.at(name).raw(), serial.at(name).nbytes()) ==
            0);
    }
  }
  omp_set_num_threads(omp_get_num_procs());
}

TEST_CASE("lstm_sequence and lstm_sequence_grad reject wrong shapes and dtypes") {
  Graph g;
  const Value p = g.input("p", {6, 8}), u = g.input("u", {2, 8}), h = g.input("h", {2, 2}),
              c = g.input("c", {2, 2});
  CHECK_NOTHROW(lstm_sequence(p, u, h, c, 3, false));
  CHECK_THROWS_WITH_AS(lstm_sequence(p, u, h, c, 4, false),
                       doctest::Contains("6 rows (T*B) are not a multiple of steps 4"), Error);
  CHECK_THROWS_WITH_AS(lstm_sequence(p, g.input("u3", {3, 8}), h, c, 3, false),
                       doctest::Contains("u is f32[3, 8] but [H, 4H]"), Error);
  CHECK_THROWS_WITH_AS(lstm_sequence(g.input("p2", {6, 12}), u, h, c, 3, false),
                       doctest::Contains("projected is f32[6, 12] but [6, 8] was expected"), Error);
  CHECK_THROWS_WITH_AS(lstm_sequence(p, u, g.input("h3", {3, 2}), c, 3, false),
                       doctest::Contains("h0 is f32[3, 2] but [2, 2]"), Error);
  CHECK_THROWS_WITH_AS(lstm_sequence(p, u, h, g.input("c1", {2}), 3, false),
                       doctest::Contains("c0 must have rank 2"), Error);
  CHECK_THROWS_WITH_AS(lstm_sequence(p, u, h, g.input("c64", {2, 2}, DType::f64), 3, false),
                       doctest::Contains("dtypes must match"), Error);
  CHECK_THROWS_WITH_AS(lstm_sequence(p, u, h, c, 0, false), doctest::Contains("steps is 0"), Error);
  const Value hs = g.input("hs", {6, 2}), acts = g.input("acts", {6, 8});
  CHECK_NOTHROW(lstm_sequence_grad(hs, hs, u, c, hs, acts, 3, true));
  CHECK_THROWS_WITH_AS(
      lstm_sequence_grad(hs, hs, u, c, hs, g.input("a2", {6, 4}), 3, true),
      doctest::Contains("lstm_sequence_grad: acts is f32[6, 4] but [6, 8] was expected"), Error);
  const Value ints = g.input("i", {6, 2}, DType::i32);
  CHECK_THROWS_WITH_AS(lstm_sequence_grad(ints, ints, u, c, hs, acts, 3, true),
                       doctest::Contains("floating dtype"), Error);
}

TEST_CASE("the saved gates of lstm_sequence have no gradient") {
  Graph g;
  const Value p = g.input("p", {6, 8}), u = g.input("u", {2, 8}), h = g.input("h", {2, 2}),
              c = g.input("c", {2, 2});
  const LstmSequence s = lstm_sequence(p, u, h, c, 3, false);
  CHECK_THROWS_WITH_AS(grad(sum_all(s.acts), {p}),
                       doctest::Contains("the saved gates (output 2) have no gradient"), Error);
  CHECK_NOTHROW(grad(sum_all(s.hs), {p, u, h, c}));  // cs gets zeros
}

}  // namespace kiln
