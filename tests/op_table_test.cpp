// The op table's identities and reduction rules: every OpId has exactly one entry under its
// own name, and every reduction's rule agrees with its CPU kernel, NaN rule included.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <set>

#include "backends/compile.h"
#include "core/philox.h"
#include "fusion/fuse.h"
#include "graph/op_table.h"
#include "graph/ops.h"

namespace kiln {

TEST_CASE("every op id has one entry, found by id and by its name") {
  std::set<std::string> names;
  for (int i = 0; i < kOpIdCount; ++i) {
    const auto id = static_cast<OpId>(i);
    const OpDef& op = op_def(id);
    CHECK(op.id == id);
    CHECK(op.name == op_id_name(id));
    CHECK(&op_def(op.name) == &op);
    names.insert(op.name);
  }
  CHECK(names.size() == static_cast<std::size_t>(kOpIdCount));
  CHECK(all_ops().size() == static_cast<std::size_t>(kOpIdCount));
  CHECK_THROWS_WITH_AS(op_def("reduce_mean"), "unknown op 'reduce_mean'", Error);
}

// The FLOPs a trace shows for each launch (OpDef::flops, Graph::node_flops): two a
// multiply-add, every pass of one convolution alike, a product's K from its (transposed) a;
// ops that do not multiply count none.
TEST_CASE("node_flops: convolutions and products count two a multiply-add, other ops none") {
  Graph g;
  const Value x = g.input("x", Shape{2, 3, 8, 9});
  const Value w = g.input("w", Shape{4, 3, 3, 2});
  const Value y = conv2d(x, w, 2, 1);  // [2, 4, 4, 5]
  REQUIRE(y.shape() == Shape{2, 4, 4, 5});
  const double conv = 2.0 * (2 * 4 * 4 * 5) * (3 * 3 * 2);
  CHECK(g.node_flops(y.ref().node) == conv);
  const Value dy = g.input("dy", y.shape());
  CHECK(g.node_flops(conv2d_grad_input(dy, w, x.shape(), 2, 1).ref().node) == conv);
  CHECK(g.node_flops(conv2d_grad_weight(x, dy, w.shape(), 2, 1).ref().node) == conv);
  const Value a = g.input("a", Shape{7, 5});
  const Value b = g.input("b", Shape{7, 3});
  CHECK(g.node_flops(matmul(a, b, true).ref().node) == 2.0 * 5 * 3 * 7);  // aT: K = 7
  CHECK(g.node_flops(matmul(b, g.input("c", Shape{3, 6})).ref().node) == 2.0 * 7 * 6 * 3);
  CHECK(g.node_flops(relu(x).ref().node) == 0.0);
  CHECK(g.node_flops(x.ref().node) == 0.0);  // an input
}

// The bytes a trace shows for each launch (Graph::node_bytes): its distinct inputs once and its
// outputs; a fused group's values outside it only, however many members read them.
TEST_CASE("node_bytes: a launch's distinct operands and outputs, a fused group's outside values") {
  Graph g;
  const Value x = g.input("x", Shape{2, 3});  // 24 bytes
  const Value y = g.input("y", Shape{2, 3}, DType::f64);
  CHECK(g.node_bytes(x.ref().node) == 0.0);                   // an input
  CHECK(g.node_bytes((x + x).ref().node) == 24.0 + 24.0);     // x read once
  CHECK(g.node_bytes(reshape(x, {3, 2}).ref().node) == 0.0);  // a view
  CHECK(g.node_bytes(cast(y, DType::f32).ref().node) == 48.0 + 24.0);
  Graph h;  // one group of four members: reads a and b, writes z
  const Value a = h.input("a", Shape{2, 3}), b = h.input("b", Shape{2, 3});
  h.output("z", relu(a * 2.0 + b) - a);
  const Graph fused = fuse(h);
  int groups = 0;
  for (std::size_t id = 0; id < fused.nodes().size(); ++id)
    if (fused.nodes()[id].body) {
      ++groups;
      CHECK(fused.node_bytes(static_cast<std::int32_t>(id)) == 24.0 + 24.0 + 24.0);
    }
  CHECK(groups == 1);
}

// Runs reduction `id` over axis 1 of x: [3, 5] on the CPU: the op's own kernel if `direct`,
// else a compiled program (where it becomes a fused group's tail, run by the fused evaluator).
Tensor reduce_on_cpu(OpId id, const Tensor& x, bool direct) {
  const Attrs attrs{{"axes", std::vector<std::int64_t>{1}}, {"keepdims", std::int64_t{0}}};
  if (direct) {
    const Node node{.op = &op_def(id), .attrs = attrs};
    Tensor out = Tensor::empty({3}, DType::f32);
    const Tensor in[] = {x};
    op_def(id).cpu({.node = node, .inputs = in, .outputs = std::span(&out, 1)});
    return out;
  }
  Graph g;
  Value in = g.input("x", x.shape());
  g.output("y", g.apply1(id, {in}, attrs));
  return compile(g, {})->run({{in, x}}).at("y");
}

TEST_CASE("each reduction's rule: identity, combine, folds and the NaN rule agree") {
  Philox rng(7);
  for (const OpDef* op : all_ops()) {
    if (op->kind != OpKind::reduction) continue;
    CAPTURE(op->name);
    const ReductionRule& r = op->reduction;
    REQUIRE(static_cast<bool>(r.combine));
    REQUIRE_FALSE(r.cuda_combine.empty());
    Tensor x = Tensor::empty({3, 5}, DType::f32);
    float* p = x.data<float>();
    rng.fill_uniform(x, -2.0, 2.0);
    // combine(identity, v) == v: the identity really is one.
    for (int i = 0; i < 15; ++i) CHECK(r.combine(r.identity, p[i]) == doctest::Approx(p[i]));
    // The table's fold gives what the op's CPU kernel and the fused evaluator give.
    const Tensor y = reduce_on_cpu(op->id, x, true), y_fused = reduce_on_cpu(op->id, x, false);
    for (int row = 0; row < 3; ++row) {
      const double folded = r.fold_f32(r.identity, p + row * 5, 5, 1);
      CHECK(y.data<float>()[row] == static_cast<float>(folded));
      CHECK(y_fused.data<float>()[row] == static_cast<float>(folded));
      double accumulated = r.identity;
      r.accumulate_f32(&accumulated, 0, p + row * 5, 5, 1);
      CHECK(accumulated == folded);
    }
    // A NaN anywhere in a row makes that row's result NaN, for every rule.
    p[7] = std::numeric_limits<float>::quiet_NaN();
    for (bool direct : {true, false}) {
      const Tensor z = reduce_on_cpu(op->id, x, direct);
      CHECK(std::isnan(z.data<float>()[1]));
      CHECK_FALSE(std::isnan(z.data<float>()[0]));
    }
  }
}

}  // namespace kiln
