// The autocast pass (graph/passes/autocast.h): which values of the lenet and char-lstm
// training steps get which dtype (golden), what it keeps fp32, and bf16/f16 steps on the CPU
// that train and stay close to fp32 (fused equal to unfused).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "backends/compile.h"
#include "backends/host_copy.h"
#include "core/philox.h"
#include "graph/autograd.h"
#include "graph/nn/functional.h"
#include "graph/op_table.h"
#include "graph/optim.h"
#include "graph/passes/autocast.h"
#include "graph/passes/dead_code.h"
#include "graph/passes/verify.h"
#include "graph/passes/weight_copies.h"
#include "models/char_lstm.h"
#include "models/lenet.h"
#include "tests/support.h"

namespace kiln {
namespace {

struct Step {
  Graph graph;
  std::vector<VariablePtr> params;
};

void lenet_step(Step& s, std::int64_t batch, std::uint64_t seed = 0) {
  Philox rng(seed);
  static std::map<std::uint64_t, std::unique_ptr<LeNet>> models;  // outlive the graphs
  auto& model = models[seed];
  model = std::make_unique<LeNet>(rng);
  Graph& g = s.graph;
  const Value loss =
      cross_entropy((*model)(g.input("x", {batch, 1, 28, 28})), g.input("y", {batch}, DType::i64));
  s.params = model->parameters();
  Sgd sgd({.lr = 0.05, .momentum = 0.9});
  std::vector<Value> ps;
  for (const VariablePtr& p : s.params) ps.push_back(g.variable(p));
  sgd.append_update(g, s.params, grad(loss, ps));
  g.output("loss", loss);
}

void char_lstm_step(Step& s) {
  Philox rng(1);
  static CharLstm model({.embedding = 16, .hidden = 32}, rng);
  Graph& g = s.graph;
  const Value tokens = g.input("tokens", {6, 4}, DType::i64);
  const Value targets = g.input("targets", {24}, DType::i64);
  const Value loss = cross_entropy(model.forward(tokens).logits, targets);
  s.params = model.parameters();
  Adam adam({.lr = 1e-3});
  std::vector<Value> ps;
  for (const VariablePtr& p : s.params) ps.push_back(g.variable(p));
  adam.append_update(g, s.params, grad(loss, ps));
  g.output("loss", loss);
}

// "op:dtype" of every node but sources and casts, in order: what the golden lists compare.
std::map<std::string, int> dtype_census(const Graph& g) {
  std::map<std::string, int> census;
  for (const Node& n : g.nodes()) {
    if (n.op->kind == OpKind::source || n.op->id == OpId::cast) continue;
    ++census[n.op->name + ":" + std::string(dtype_name(n.outputs[0].dtype))];
  }
  return census;
}

// The invariants every autocast step holds, whatever the model.
void check_step_invariants(const Graph& before, const Graph& after, DType low) {
  verify(after);
  for (const Node& n : after.nodes()) {
    CAPTURE(n.op->name);
    // State stays at full precision: f32, or f64 for Adam's exact step count.
    if (n.op->id == OpId::variable) CHECK(n.outputs[0].dtype != low);
    if (n.op->autocast == AutocastPolicy::low) {
      for (const ValueRef& in : n.inputs)
        if (is_floating(after.type(in).dtype)) CHECK(after.type(in).dtype == low);
      CHECK(n.outputs[0].dtype == low);
    }
    if (n.op->kind == OpKind::reduction) {
      CHECK(after.type(n.inputs[0]).dtype == DType::f32);
      CHECK(n.outputs[0].dtype == DType::f32);
    }
  }
  REQUIRE(after.assignments().size() == before.assignments().size());
  for (const auto& [var, ref] : after.assignments())
    CHECK(after.type(ref).dtype == var->value.dtype());
  for (const auto& [name, ref] : after.outputs())
    CHECK(after.type(ref) == before.type(before.output_ref(name)));
}

Tensor random_images(std::int64_t batch, std::uint64_t seed) {
  Philox rng(seed);
  Tensor t = Tensor::empty({batch, 1, 28, 28}, DType::f32);
  rng.fill_uniform(t, 0.0, 1.0);
  return t;
}

Tensor labels(std::int64_t batch) {
  Tensor t = Tensor::empty({batch}, DType::i64);
  for (std::int64_t i = 0; i < batch; ++i) t.data<std::int64_t>()[i] = (i * 7) % 10;
  return t;
}

}  // namespace

TEST_CASE("autocast golden: the lenet step's values and their dtypes in bf16") {
  Step s;
  lenet_step(s, 8);
  const Graph before = eliminate_dead_code(s.graph);
  const Graph after = autocast(before, DType::bf16);
  check_step_invariants(before, after, DType::bf16);
  const std::map<std::string, int> census = dtype_census(after);
  std::string text;
  for (const auto& [key, count] : census) text += key + "=" + std::to_string(count) + " ";
  // GEMMs and convolutions, forward and backward, bf16; activations and their gradients bf16
  // (relu, pooling, the masks); the loss (its row reductions, one_hot) and the SGD
  // updates (momentum, weights: the f32 add, mul and sub) fp32; every reduction fp32.
  CHECK(text ==
        "add:bf16=4 add:f32=10 broadcast_to:f32=3 conv2d:bf16=2 conv2d_grad_input:bf16=1 "
        "conv2d_grad_weight:bf16=2 detach:f32=1 div:f32=1 exp:bf16=1 greater:bf16=3 log:f32=1 "
        "matmul:bf16=6 max_pool2d:bf16=2 max_pool2d_grad:bf16=2 mul:bf16=4 mul:f32=20 neg:f32=1 "
        "one_hot:f32=1 reduce_max:f32=1 reduce_sum:f32=7 relu:bf16=3 reshape:bf16=2 "
        "reshape:f32=7 sub:bf16=1 sub:f32=9 ");
  CHECK(census.count("matmul:f32") == 0);
  // Each parameter's update: momentum = 0.9 m + g, then p - lr m, in fp32.
  CHECK(census.at("sub:f32") >= static_cast<int>(s.params.size()));
}

TEST_CASE("autocast golden: the char-lstm step (Adam): the LSTM 16-bit, the optimizer fp32") {
  Step s;
  char_lstm_step(s);
  const Graph before = eliminate_dead_code(s.graph);
  for (DType low : {DType::bf16, DType::f16}) {
    const Graph after = autocast(before, low);
    check_step_invariants(before, after, low);
    const std::map<std::string, int> census = dtype_census(after);
    const std::string l(dtype_name(low));
    // The LSTM's recurrence, its weight's gradient GEMM and the GEMMs of the embedding and
    // the head around it are 16-bit.
    CHECK(census.at("lstm_sequence:" + l) == 1);
    CHECK(census.at("lstm_sequence_grad:" + l) == 1);
    CHECK(census.count("lstm_sequence:f32") == 0);
    CHECK(census.count("lstm_sequence_grad:f32") == 0);
    CHECK(census.at("matmul:" + l) >= 3);
    CHECK(census.count("matmul:f32") == 0);
    CHECK(census.at("sqrt:f32") == static_cast<int>(s.params.size()));  // Adam's denominators
    CHECK(census.count("sqrt:" + l) == 0);
  }
}

TEST_CASE("autocast leaves f64 steps and fp32 casts where they are, and refuses f32 as low") {
  Graph g;
  const Value x = g.input("x", {4, 3}, DType::f64);
  const Value w = g.input("w", {3, 2}, DType::f64);
  g.output("y", relu(matmul(x, w)));
  const Graph after = autocast(g, DType::bf16);
  for (const Node& n : after.nodes())
    for (const TensorType& t : n.outputs) CHECK(t.dtype == DType::f64);
  CHECK_THROWS_WITH_AS(autocast(g, DType::f32), "autocast: f32 is not a 16-bit floating dtype",
                       Error);
}

TEST_CASE("lenet in bf16 and f16 on the CPU: the first loss near fp32's, and it learns") {
  const Tensor x = random_images(16, 3);
  const Tensor y = labels(16);
  std::map<Precision, std::vector<double>> losses;
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    Step s;
    lenet_step(s, 16, 7);  // the same initial weights for each precision
    auto program = compile(s.graph, {.precision = p});
    for (int step = 0; step < 25; ++step)
      losses[p].push_back(program->run({{"x", x}, {"y", y}}).at("loss").item());
    for (const VariablePtr& v : s.params) CHECK(v->value.dtype() == DType::f32);
  }
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    CAPTURE(precision_name(p));
    const auto& l = losses[p];
    CHECK(std::abs(l[0] - losses[Precision::fp32][0]) < 0.02 * losses[Precision::fp32][0]);
    CHECK(l.back() < 0.5 * l[0]);  // 16 fixed images: memorised
    for (double v : l) CHECK(std::isfinite(v));
  }
}

TEST_CASE("a bf16 step fused equals the same step unfused on the CPU") {
  const Tensor x = random_images(8, 5);
  const Tensor y = labels(8);
  std::vector<double> loss[2];
  std::vector<Tensor> weights[2];
  for (int fused = 0; fused < 2; ++fused) {
    Step s;
    lenet_step(s, 8, 11);
    auto program = compile(s.graph, {.fuse = fused == 1, .precision = Precision::bf16});
    for (int step = 0; step < 3; ++step)
      loss[fused].push_back(program->run({{"x", x}, {"y", y}}).at("loss").item());
    for (const VariablePtr& v : s.params) weights[fused].push_back(v->value.clone());
  }
  for (int step = 0; step < 3; ++step)
    CHECK(loss[1][step] == doctest::Approx(loss[0][step]).epsilon(1e-4));
  for (std::size_t i = 0; i < weights[0].size(); ++i)
    CHECK(test::closeness(weights[1][i], weights[0][i], 1e-4, 1e-4) <= 1.0);
}

}  // namespace kiln

namespace kiln {
namespace {

// The weights, every value bitwise.
void check_same_bits(const std::vector<VariablePtr>& a, const std::vector<VariablePtr>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(a[i]->name);
    const Tensor x = to_host(a[i]->value), y = to_host(b[i]->value);
    REQUIRE(x.nbytes() == y.nbytes());
    CHECK(std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0);
  }
}

// lenet in bf16 with the weight copies (compile's default) against the same step with a cast of
// each weight every step (autocast alone, compiled as it is): the same losses and weights to the
// bit, also after every weight is assigned from outside (as a loaded checkpoint is), which the
// copies must be rounded from again.
void check_copies_equal_casts(Device device) {
  const Tensor x = random_images(8, 21);
  const Tensor y = labels(8);
  Step with_copies, with_casts;
  lenet_step(with_copies, 8, 31);
  lenet_step(with_casts, 8, 32);
  for (std::size_t i = 0; i < with_casts.params.size(); ++i)
    with_casts.params[i]->value = with_copies.params[i]->value.clone();  // the same start
  auto copies = compile(with_copies.graph, {.device = device, .precision = Precision::bf16});
  const Graph cast_graph = autocast(eliminate_dead_code(with_casts.graph), DType::bf16);
  auto casts = compile(cast_graph, {.device = device});
  int copy_variables = 0;
  for (const Node& n : copies->graph().nodes()) {
    if (n.op->id != OpId::variable || !n.variable->copy_of) continue;
    ++copy_variables;
    CHECK(n.outputs[0].dtype == DType::bf16);
    CHECK(n.variable->name == n.variable->copy_of->name + "@bf16");
  }
  CHECK(copy_variables == 6);  // conv1, conv2, fc1, fc2 weights, fc1, fc2 biases (added in bf16)
  for (int step = 0; step < 6; ++step) {
    CAPTURE(step);
    if (step == 3)  // every weight replaced from outside, in both
      for (std::size_t i = 0; i < with_casts.params.size(); ++i) {
        const VariablePtr& p = with_copies.params[i];
        p->value = test::random_tensor(p->value.shape(), DType::f32, 100 + i, -0.2, 0.2);
        with_casts.params[i]->value = p->value.clone();
      }
    const double a = copies->run({{"x", x}, {"y", y}}).at("loss").item();
    const double b = casts->run({{"x", x}, {"y", y}}).at("loss").item();
    CHECK(a == b);
  }
  check_same_bits(with_copies.params, with_casts.params);
}

}  // namespace

TEST_CASE("weight copies: the optimizer writes each cast weight's bf16 copy, no cast remains") {
  Step s;
  lenet_step(s, 8);
  const Graph cast = autocast(eliminate_dead_code(s.graph), DType::bf16);
  const Graph copied = eliminate_dead_code(add_weight_copies(cast));
  verify(copied);
  std::map<const Variable*, const Node*> variables;
  for (const Node& n : copied.nodes()) {
    if (n.op->id == OpId::variable) variables[n.variable.get()] = &n;
    if (n.op->id == OpId::cast && is_low_precision(n.outputs[0].dtype))
      CHECK(copied.node(n.inputs[0].node).op->id != OpId::variable);
  }
  int copies = 0;
  for (const auto& [var, ref] : copied.assignments()) {
    if (!var->copy_of) continue;
    ++copies;
    const Node& update = copied.node(ref.node);  // cast(the weight's new value)
    CHECK(update.op->id == OpId::cast);
    CHECK(copied.type(ref).dtype == DType::bf16);
    CHECK(variables.count(var.get()) == 1);
    const auto source = std::find_if(copied.assignments().begin(), copied.assignments().end(),
                                     [&](const auto& a) { return a.first == var->copy_of; });
    REQUIRE(source != copied.assignments().end());
    CHECK(update.inputs[0] == source->second);
  }
  CHECK(copies == 6);  // the four weights and the two fc biases, added to bf16 GEMM outputs
  CHECK(copied.assignments().size() == cast.assignments().size() + 6);
  CHECK(copied.outputs() == cast.outputs());
}

TEST_CASE("weight copies on the CPU: bitwise the step with casts, also after outside writes") {
  check_copies_equal_casts(Device::cpu());
}

TEST_CASE("GPU: weight copies bitwise the step with casts, also after outside writes") {
  if (!test::have_gpu()) return;
  check_copies_equal_casts(Device::cuda());
}

}  // namespace kiln
