// nn modules: buffers, train/eval mode, state updates chained within one step.
#include <doctest/doctest.h>

#include "graph/nn/functional.h"
#include "graph/nn/module.h"
#include "tests/support.h"

namespace kiln {
namespace {

// A layer with one parameter and one buffer that counts its applications.
class Counting : public nn::Layer {
 public:
  Counting() {
    weight_ = register_parameter("weight", Tensor::full({2}, 1.0, DType::f32));
    count_ = register_buffer("count", Tensor::zeros({}, DType::f32));
  }
  Value forward(Value x) override {
    Graph& g = x.graph();
    if (training()) g.assign_latest(count_, g.latest(count_) + 1.0);
    return x * g.variable(weight_);
  }

 private:
  VariablePtr weight_, count_;
};

class Pair : public nn::Layer {
 public:
  Pair() {
    register_module("a", a_);
    register_module("b", b_);
  }
  Value forward(Value x) override { return b_(a_(x)); }
  Counting a_, b_;
};

}  // namespace

TEST_CASE("buffers are named like parameters and are not trainable") {
  Pair model;
  const auto params = model.parameters();
  const auto buffers = model.buffers();
  REQUIRE(params.size() == 2);
  REQUIRE(buffers.size() == 2);
  CHECK(params[0]->name == "a.weight");
  CHECK(buffers[0]->name == "a.count");
  CHECK(buffers[1]->name == "b.count");
  CHECK(params[0]->trainable);
  CHECK_FALSE(buffers[0]->trainable);
  nn::Sequential seq;
  seq.add<Counting>();
  CHECK(seq.buffers()[0]->name == "0.count");
}

TEST_CASE("set_training reaches every child; a child registered later takes the parent's mode") {
  Pair model;
  CHECK(model.training());
  model.set_training(false);
  CHECK_FALSE(model.a_.training());
  CHECK_FALSE(model.b_.training());
  model.set_training(true);
  CHECK(model.b_.training());
  nn::Sequential seq;
  seq.set_training(false);
  CHECK_FALSE(seq.add<Counting>().training());
}

TEST_CASE("a layer applied twice in one step chains its buffer updates; eval mode records none") {
  Counting layer;
  Graph g;
  const Value x = g.input("x", {2});
  g.output("y", layer(layer(x)));
  CHECK(g.assignments().size() == 1);
  auto step = compile(g);
  step->run({{"x", Tensor::full({2}, 1.0, DType::f32)}});
  step->run({{"x", Tensor::full({2}, 1.0, DType::f32)}});
  CHECK(layer.buffers()[0]->value.item() == 4.0);

  layer.set_training(false);
  Graph eval;
  eval.output("y", layer(eval.input("x", {2})));
  CHECK(eval.assignments().empty());
}

TEST_CASE("assign_latest rejects a value of the wrong type") {
  Counting layer;
  Graph g;
  g.output("y", layer(g.input("x", {2})));
  const VariablePtr count = layer.buffers()[0];
  CHECK_THROWS_WITH_AS(g.assign_latest(count, g.fill(0.0, {3})), doctest::Contains("update of 'count'"), Error);
}

}  // namespace kiln
