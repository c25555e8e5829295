// Embedding and the recurrent layers: the forward pass against the cell equations written
// out by hand, every parameter's gradient against central finite differences (f64, T = 3),
// and the mistakes they reject.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "graph/autograd.h"
#include "graph/nn/recurrent.h"
#include "graph/op.h"
#include "graph/ops.h"
#include "tests/support.h"

namespace kiln {
namespace {

void to_f64(const std::vector<VariablePtr>& params) {
  for (const VariablePtr& p : params) p->value = p->value.to(DType::f64);
}

// The LSTM or RNN of `layer` 0 (one direction) over x [T, B, F] by the definition, in double.
std::vector<double> reference_outputs(const nn::Recurrent& rnn, const Tensor& x, bool reverse) {
  const auto params = rnn.parameters();
  const std::size_t base = reverse ? 3 : 0;
  const Tensor &wi = params[base]->value, &wh = params[base + 1]->value,
               &b = params[base + 2]->value;
  const std::int64_t steps = x.shape()[0], batch = x.shape()[1], f = x.shape()[2];
  const std::int64_t h = rnn.options().hidden_size, gh = rnn.gates() * h;
  const bool lstm = rnn.options().cell == nn::CellKind::lstm;
  std::vector<double> hs(static_cast<std::size_t>(batch * h), 0.0),
      cs = hs, out(static_cast<std::size_t>(steps * batch * h));
  auto sigm = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  for (std::int64_t s = 0; s < steps; ++s) {
    const std::int64_t t = reverse ? steps - 1 - s : s;
    std::vector<double> next = hs;
    for (std::int64_t n = 0; n < batch; ++n) {
      std::vector<double> pre(static_cast<std::size_t>(gh));
      for (std::int64_t j = 0; j < gh; ++j) {
        double acc = b.at(j);
        for (std::int64_t k = 0; k < f; ++k)
          acc += x.at((t * batch + n) * f + k) * wi.at(k * gh + j);
        for (std::int64_t k = 0; k < h; ++k)
          acc += hs[static_cast<std::size_t>(n * h + k)] * wh.at(k * gh + j);
        pre[static_cast<std::size_t>(j)] = acc;
      }
      for (std::int64_t j = 0; j < h; ++j) {
        const auto at = static_cast<std::size_t>(n * h + j);
        if (!lstm) {
          next[at] = std::tanh(pre[static_cast<std::size_t>(j)]);
          continue;
        }
        const double i = sigm(pre[static_cast<std::size_t>(j)]),
                     fg = sigm(pre[static_cast<std::size_t>(h + j)]);
        const double g = std::tanh(pre[static_cast<std::size_t>(2 * h + j)]),
                     o = sigm(pre[static_cast<std::size_t>(3 * h + j)]);
        cs[at] = fg * cs[at] + i * g;
        next[at] = o * std::tanh(cs[at]);
      }
    }
    hs = next;
    std::copy(hs.begin(), hs.end(), out.begin() + t * batch * h);
  }
  return out;
}

// Every parameter and input entry of a loss over outputs and final state, against central
// differences.
void check_recurrent_gradients(const nn::RecurrentOptions& options, bool with_initial_state) {
  CAPTURE(options.layers);
  CAPTURE(options.bidirectional);
  CAPTURE(options.cell == nn::CellKind::lstm);
  Philox rng(3);
  nn::Recurrent rnn(options, rng);
  to_f64(rnn.parameters());
  Graph g;
  const std::int64_t steps = 3, batch = 2;
  const Value x = g.input("x", {batch, steps, options.input_size}, DType::f64);
  nn::RecurrentState initial;
  std::vector<Feed> feeds = {{"x", test::random_tensor(x.shape(), DType::f64, 4, -1.5, 1.5)}};
  const std::int64_t states = options.layers * (options.bidirectional ? 2 : 1);
  for (std::int64_t k = 0; with_initial_state && k < states; ++k)
    for (const char* kind : {"h", "c"}) {
      if (options.cell == nn::CellKind::rnn && kind[0] == 'c') continue;
      const std::string name = fmt::format("{}{}", kind, k);
      (kind[0] == 'h' ? initial.h : initial.c)
          .push_back(g.input(name, {batch, options.hidden_size}, DType::f64));
      feeds.emplace_back(name, test::random_tensor({batch, options.hidden_size}, DType::f64,
                                                   10 + static_cast<std::uint64_t>(k)));
    }
  const nn::RecurrentOutput out = rnn.forward(x, initial);
  Value loss =
      sum_all(out.outputs * g.constant(test::random_tensor(out.outputs.shape(), DType::f64, 5)));
  for (const Value& h : out.final_state.h) loss = loss + sum_all(h * h);
  for (const Value& c : out.final_state.c) loss = loss + sum_all(c) * 0.5;
  std::vector<Value> wrt = {x};
  for (const VariablePtr& p : rnn.parameters()) wrt.push_back(g.variable(p));
  const std::vector<Value> grads = grad(loss, wrt);
  g.output("loss", loss);
  for (std::size_t i = 0; i < grads.size(); ++i) g.output("g" + std::to_string(i), grads[i]);
  auto program = compile(g);
  const Outputs analytic = program->run(feeds);
  std::vector<Tensor*> values = {&feeds[0].tensor};
  for (const VariablePtr& p : rnn.parameters()) values.push_back(&p->value);
  for (std::size_t i = 0; i < values.size(); ++i) {
    CAPTURE(i);
    Tensor numeric = Tensor::empty(values[i]->shape(), DType::f64);
    for (std::int64_t k = 0; k < values[i]->numel(); ++k) {
      double& v = values[i]->data<double>()[k];
      const double saved = v;
      v = saved + 1e-6;
      const double up = program->run(feeds).at("loss").item();
      v = saved - 1e-6;
      const double down = program->run(feeds).at("loss").item();
      v = saved;
      numeric.data<double>()[k] = (up - down) / 2e-6;
    }
    CHECK(test::closeness(analytic.at("g" + std::to_string(i)), numeric, 1e-6, 1e-5) <= 1.0);
  }
}

}  // namespace

TEST_CASE("LSTM and RNN outputs follow the cell equations, both directions") {
  for (const nn::CellKind cell : {nn::CellKind::lstm, nn::CellKind::rnn}) {
    Philox rng(1);
    nn::Recurrent rnn(
        {.input_size = 3, .hidden_size = 4, .layers = 1, .bidirectional = true, .cell = cell}, rng);
    to_f64(rnn.parameters());
    for (const VariablePtr& p : rnn.parameters())
      if (p->name.ends_with("bias")) Philox(7).fill_uniform(p->value, -0.5, 0.5);
    Graph g;
    const Tensor xv = test::random_tensor({5, 2, 3}, DType::f64, 2, -2, 2);
    const nn::RecurrentOutput out = rnn.forward_time_major(g.input("x", {5, 2, 3}, DType::f64));
    g.output("y", out.outputs);
    const Tensor y = test::run_once(g, {{"x", xv}}).at("y");
    REQUIRE(y.shape() == Shape{5, 2, 8});
    const std::vector<double> fwd = reference_outputs(rnn, xv, false),
                              bwd = reference_outputs(rnn, xv, true);
    for (std::int64_t r = 0; r < 10; ++r)
      for (std::int64_t j = 0; j < 4; ++j) {
        CHECK(y.at(r * 8 + j) ==
              doctest::Approx(fwd[static_cast<std::size_t>(r * 4 + j)]).epsilon(1e-12));
        CHECK(y.at(r * 8 + 4 + j) ==
              doctest::Approx(bwd[static_cast<std::size_t>(r * 4 + j)]).epsilon(1e-12));
      }
  }
}

TEST_CASE("gradients of a tiny LSTM match finite differences (f64, T = 3)") {
  check_recurrent_gradients({.input_size = 3, .hidden_size = 2, .layers = 1}, false);
  check_recurrent_gradients({.input_size = 2, .hidden_size = 2, .layers = 2, .bidirectional = true},
                            false);
  check_recurrent_gradients({.input_size = 2, .hidden_size = 3, .layers = 1}, true);
}

TEST_CASE("gradients of a tiny tanh RNN match finite differences (f64, T = 3)") {
  check_recurrent_gradients(
      {.input_size = 3, .hidden_size = 2, .layers = 2, .cell = nn::CellKind::rnn}, false);
  check_recurrent_gradients({.input_size = 2,
                             .hidden_size = 3,
                             .layers = 1,
                             .bidirectional = true,
                             .cell = nn::CellKind::rnn},
                            true);
}

TEST_CASE(
    "an LSTM direction is one lstm_sequence op, and its weight gradients are one GEMM each reading "
    "the same d_projected") {
  Philox rng(4);
  nn::Recurrent lstm({.input_size = 3, .hidden_size = 4}, rng);
  Graph g;
  const nn::RecurrentOutput out = lstm.forward_time_major(g.input("x", {6, 2, 3}));
  const std::vector<VariablePtr> params = lstm.parameters();  // weight_ih, weight_hh, bias
  const std::vector<Value> grads =
      grad(sum_all(out.outputs * out.outputs), {g.variable(params[0]), g.variable(params[1])});
  auto count = [&](const std::string& op) {
    return std::count_if(g.nodes().begin(), g.nodes().end(),
                         [&](const Node& n) { return n.op->name == op; });
  };
  CHECK(count("lstm_sequence") == 1);
  CHECK(count("lstm_sequence_grad") == 1);
  CHECK(count("matmul") == 3);  // x W, and the two weight gradients
  const Node& d_input = g.node(grads[0].ref().node);
  const Node& d_recurrent = g.node(grads[1].ref().node);
  REQUIRE(d_input.op->id == OpId::matmul);
  REQUIRE(d_recurrent.op->id == OpId::matmul);
  CHECK(g.node(d_input.inputs[1].node).op->id == OpId::lstm_sequence_grad);
  CHECK(d_input.inputs[1].index == 0);                // d_projected [T*B, 4H]
  CHECK(d_recurrent.inputs[1] == d_input.inputs[1]);  // shared, not copied
}

TEST_CASE("Embedding rows are the weight's rows, and its gradient sums them per token") {
  Philox rng(2);
  nn::Embedding embed(5, 3, rng);
  Graph g;
  const Value tokens = g.input("t", {2, 2}, DType::i64);
  const Value y = embed(tokens);
  REQUIRE(y.shape() == Shape{2, 2, 3});
  const Value dw = grad(sum_all(y), {g.variable(embed.parameters()[0])})[0];
  g.output("y", y);
  g.output("dw", dw);
  const Outputs out =
      test::run_once(g, {{"t", Tensor::from_vector<std::int64_t>({2, 2}, {4, 0, 4, 2})}});
  const Tensor& w = embed.parameters()[0]->value;
  const std::vector<std::int64_t> ids = {4, 0, 4, 2};
  for (std::size_t i = 0; i < 4; ++i)
    for (std::int64_t j = 0; j < 3; ++j)
      CHECK(out.at("y").at(static_cast<std::int64_t>(i) * 3 + j) == w.at(ids[i] * 3 + j));
  const std::vector<double> counts = {1, 0, 1, 0, 2};
  for (std::int64_t r = 0; r < 5; ++r)
    for (std::int64_t j = 0; j < 3; ++j)
      CHECK(out.at("dw").at(r * 3 + j) == counts[static_cast<std::size_t>(r)]);
}

TEST_CASE("recurrent layers name the mistake") {
  Philox rng(0);
  nn::Recurrent lstm({.input_size = 3, .hidden_size = 2}, rng);
  Graph g;
  CHECK_THROWS_WITH_AS(
      lstm.forward(g.input("x", {2, 5, 4})),
      doctest::Contains("input is f32[5, 2, 4] but [T, B, 3] (time-major) was expected"), Error);
  CHECK_THROWS_WITH_AS(lstm.forward(g.input("y", {2, 5})),
                       doctest::Contains("[B, T, F] was expected"), Error);
  CHECK_THROWS_WITH_AS(lstm.forward(g.input("z", {2, 5, 3}), {.h = {g.input("h", {2, 2})}}),
                       doctest::Contains("initial cell states"), Error);
  CHECK_THROWS_WITH_AS(nn::cell_kind_from_name("gru"),
                       doctest::Contains("unknown recurrent cell 'gru' (lstm or rnn)"), Error);
  CHECK_THROWS_WITH_AS(nn::Embedding(0, 4, rng), doctest::Contains("vocabulary 0"), Error);
  nn::Embedding embed(4, 2, rng);
  CHECK_THROWS_WITH_AS(embed(g.input("f", {3})), doctest::Contains("tokens must be integers"),
                       Error);
}

}  // namespace kiln
