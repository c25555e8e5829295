// verify, dead-code elimination, the memory plan and Program input checking.
#include <doctest/doctest.h>

#include "backends/in_place.h"
#include "backends/lowering.h"
#include "backends/plan.h"
#include "fusion/fuse.h"
#include "graph/autograd.h"
#include "graph/op.h"
#include "graph/op_table.h"
#include "graph/ops.h"
#include "graph/optim.h"
#include "fusion/fused_group.h"
#include "backends/compile.h"
#include "graph/passes/dead_code.h"
#include "graph/passes/fold_constants.h"
#include "graph/passes/pool_grad_masks.h"
#include "graph/passes/verify.h"
#include "tests/support.h"

namespace kiln {

TEST_CASE("verify accepts recorded graphs and rejects a node whose type disagrees with its rule") {
  Graph g;
  const Value x = g.input("x", {2, 3});
  g.output("y", relu(x) + 1.0);
  CHECK_NOTHROW(verify(g));
  Node bad{.op = &op_def("relu"), .inputs = {x.ref()}, .outputs = {{Shape{3, 2}, DType::f32}}};
  g.add_node(bad);
  CHECK_THROWS_WITH_AS(verify(g), doctest::Contains("type rule gives f32[2, 3]"), InternalError);
}

TEST_CASE("eliminate_dead_code keeps what outputs need, and inputs") {
  Graph g;
  const Value x = g.input("x", {4});
  const Value unused_input = g.input("z", {2});
  const Value live = exp(x);
  (void)tanh(x);  // dead
  (void)unused_input;
  g.output("y", live);
  const Graph out = eliminate_dead_code(g);
  std::vector<std::string> ops;
  for (const Node& n : out.nodes()) ops.push_back(n.op->name);
  CHECK(ops == std::vector<std::string>{"input", "input", "exp"});
  CHECK_NOTHROW(verify(out));
}

TEST_CASE("the memory plan reuses buffers along a chain and the result stays right") {
  Graph g;
  Value v = g.input("x", {1000});
  for (int i = 0; i < 12; ++i) v = tanh(v) * 0.5 + 0.1;
  g.output("y", v);
  const Graph compiled = eliminate_dead_code(g);
  const MemoryPlan plan = plan_memory(compiled);
  CHECK(plan.slot_bytes.size() == 36);
  CHECK(plan.arena_bytes <= 3 * 4096);  // 36 kernel outputs of 4000 bytes in at most 3 places
  const Tensor x = test::random_tensor({1000}, DType::f32, 1);
  const Tensor y = test::run_once(g, {{"x", x}}).at("y");
  for (std::int64_t i = 0; i < 1000; i += 37) {
    double r = x.at(i);
    for (int k = 0; k < 12; ++k) r = std::tanh(r) * 0.5 + 0.1;
    CHECK(y.at(i) == doctest::Approx(r).epsilon(1e-5));
  }
}

TEST_CASE("run names the input when a feed is missing, misshapen or unknown") {
  Graph g;
  g.output("y", g.input("x", {64, 10}) * 2.0);
  auto p = compile(g);
  CHECK_THROWS_WITH_AS(p->run({}), doctest::Contains("input 'x' (f32[64, 10]) was not fed"), Error);
  CHECK_THROWS_WITH_AS(p->run({{"x", Tensor::zeros({32, 10}, DType::f32)}}),
                       doctest::Contains("input 'x' expects f32[64, 10] but was fed f32[32, 10]"),
                       Error);
  CHECK_THROWS_WITH_AS(p->run({{"w", Tensor::zeros({1}, DType::f32)}}),
                       doctest::Contains("'w' is not an input"), Error);
}

TEST_CASE("ops reject wrong shapes with both shapes and the op in the message") {
  Graph g;
  const Value x = g.input("x", {8, 3, 28, 28});
  const Value w = g.input("w", {32, 1, 3, 3});
  CHECK_THROWS_WITH_AS(
      conv2d(x, w),
      doctest::Contains("conv2d: input has 3 channels but weight [32, 1, 3, 3] expects 1"), Error);
  CHECK_THROWS_WITH_AS(g.input("a", {3, 4}) + g.input("b", {5}),
                       doctest::Contains("add: shapes [3, 4] and [5]"), Error);
}

}  // namespace kiln

namespace kiln {

TEST_CASE(
    "in_place_updates: an optimizer update writes into its variable, a value read elsewhere does "
    "not") {
  VariablePtr p = make_variable("p", Tensor::zeros({4}, DType::f32));
  VariablePtr q = make_variable("q", Tensor::zeros({4}, DType::f32));
  Graph g;
  const Value x = g.input("x", {4});
  const Value pv = g.variable(p), qv = g.variable(q);
  const Value loss = sum_all(tanh(pv * x) + qv);
  g.output("loss", loss);
  g.assign(p, pv - grad(loss, {pv})[0] *
                       0.1);  // after every other reader of p: the gradient needs tanh(p x)
  const Value q_new = qv + 1.0;
  g.assign(q, q_new);
  g.output("q_new", q_new);  // read outside the step: must stay a separate buffer
  g.assign(make_variable("r", Tensor::zeros({4}, DType::f32)),
           x * 2.0);  // a variable nothing reads
  const Graph fused = fuse(eliminate_dead_code(g));
  const std::vector<InPlaceUpdate> in_place = in_place_updates(fused);
  REQUIRE(in_place.size() == 3);
  CHECK(in_place[0].in_place);
  CHECK(in_place[0].after.empty());
  CHECK_FALSE(in_place[1].in_place);
  CHECK(in_place[2].in_place);
}

TEST_CASE(
    "in_place_updates: other readers of the old value run first, or the update is not in place") {
  auto build = [](bool read_after_update) {
    VariablePtr w = make_variable("w", test::random_tensor({3, 3}, DType::f32, 1));
    Graph g;
    const Value x = g.input("x", {2, 3});
    const Value wv = g.variable(w);
    const Value other =
        matmul(g.input("z", {2, 3}), wv);  // reads w, and the update does not need it
    g.output("other", other);
    const Value loss = sum_all(matmul(x, wv));
    g.output("loss", loss);
    const Value w_new = wv - grad(loss, {wv})[0] * 0.1;
    g.assign(w, w_new);
    if (read_after_update)
      g.output("late", matmul(reshape(w_new, {3, 3}) * 1.0, wv));  // needs old w after the update
    return fuse(eliminate_dead_code(g));
  };
  const Graph early = build(false);
  const std::vector<InPlaceUpdate> u = in_place_updates(early);
  REQUIRE(u.size() == 1);
  CHECK(u[0].in_place);
  REQUIRE(u[0].after.size() ==
          2);  // `other`, and the forward matmul (the gradient of a sum does not need it)
  for (std::int32_t reader : u[0].after) CHECK(early.node(reader).op->id == OpId::matmul);
  CHECK(in_place_updates(build(true))[0].in_place == false);
}

}  // namespace kiln

namespace kiln {

TEST_CASE(
    "fold_constants: small all-constant ops become fills or tensor constants, the results do not "
    "change") {
  Graph g;
  const Value x = g.input("x", {4, 8});
  const Value seed = -(g.fill(1.0, {}) / 64.0);  // a mean loss's gradient seed: uniform
  const Value spread = broadcast_to(reshape(seed, {1, 1}), {4, 8});  // still uniform, 32 elements
  const Value ramp = exp(g.constant(test::random_tensor({8}, DType::f32, 3)));  // not uniform
  const Value big = g.fill(2.0, {kMaxFoldedElements + 1}) * 3.0;                // too large to fold
  g.output("y", x * spread + ramp);
  g.output("big", big);
  const Graph folded = eliminate_dead_code(fold_constants(eliminate_dead_code(g)));
  verify(folded);
  int ops = 0, fills = 0, constants = 0;
  for (const Node& n : folded.nodes()) {
    if (n.op->kind != OpKind::source) ++ops;
    fills += n.op->id == OpId::fill;
    constants += n.op->id == OpId::tensor_constant;
  }
  CHECK(ops == 3);        // x * spread, + ramp, and the big product
  CHECK(fills == 3);      // spread (folded), and the big product's two operands
  CHECK(constants == 1);  // ramp, evaluated
  const Tensor xs = test::random_tensor({4, 8}, DType::f32, 4);
  const Outputs want = compile(g, {.fuse = false})->run({{"x", xs}});
  const Outputs got = compile(folded, {.fuse = false})->run({{"x", xs}});
  for (const char* name : {"y", "big"}) {
    CAPTURE(name);
    REQUIRE(want.at(name).numel() == got.at(name).numel());
    for (std::int64_t i = 0; i < want.at(name).numel(); ++i)
      CHECK(want.at(name).at(i) == got.at(name).at(i));  // bitwise
  }
}

TEST_CASE(
    "apply_masks_before_pool_grads: relu's mask and the bias sum move to the pooled gradient, "
    "values unchanged") {
  struct Window {
    std::int64_t kernel, stride, padding;
  };
  std::uint64_t seed = 40;
  for (const Window w : {Window{2, 2, 0}, Window{3, 1, 0}, Window{3, 2, 1}, Window{2, 1, 0}}) {
    CAPTURE(w.kernel);
    CAPTURE(w.stride);
    CAPTURE(w.padding);
    Graph g;
    const Value x = g.input("x", {2, 3, 7, 7}), b = g.input("b", {3});
    const Value y = relu(x + broadcast_to(reshape(b, {1, 3, 1, 1}), {2, 3, 7, 7}));
    const Value p = max_pool2d(y, w.kernel, w.stride, w.padding);
    const Value scale = g.input("scale", p.type().shape);
    const Value loss = sum(tanh(p) * scale, {0, 1, 2, 3});
    const std::vector<Value> grads = grad(loss, {x, b});
    g.output("loss", loss);
    g.output("dx", grads[0]);
    g.output("db", grads[1]);
    const Graph before = eliminate_dead_code(g);
    const Graph after = eliminate_dead_code(apply_masks_before_pool_grads(before));
    verify(after);
    const Shape big = y.type().shape, pooled = p.type().shape;
    int big_muls = 0, pooled_sums = 0, relu_pool_grads = 0;
    for (const Node& n : after.nodes()) {
      big_muls += n.op->id == OpId::mul && n.outputs[0].shape == big;
      pooled_sums += n.op->id == OpId::reduce_sum && after.type(n.inputs[0]).shape == pooled;
      if (n.op->id != OpId::max_pool2d_grad) continue;
      // ReLU's mask applied by the pool gradient as it routes dy, not by a mul before it
      relu_pool_grads += n.attrs.has("relu") && n.attrs.integer("relu") == 1;
      const Node& dy = after.node(n.inputs[1].node);  // tanh's gradient times scale, unmasked
      if (dy.op->id == OpId::mul)
        for (const ValueRef& factor : dy.inputs)
          CHECK(after.node(factor.node).op->id != OpId::greater);
    }
    CHECK(big_muls == 0);
    CHECK(pooled_sums == 2);  // the loss, and db summing the masked pooled gradient
    CHECK(relu_pool_grads == 1);
    const std::vector<Feed> feeds = {{"x", test::random_tensor({2, 3, 7, 7}, DType::f32, seed++)},
                                     {"b", test::random_tensor({3}, DType::f32, seed++)},
                                     {"scale", test::random_tensor(pooled, DType::f32, seed++)}};
    const Outputs want = compile(before, {.fuse = false})->run(feeds);
    const Outputs got = compile(after, {.fuse = false})->run(feeds);
    for (const char* name : {"loss", "dx"}) {  // the same products, routed the same way: bitwise
      CAPTURE(name);
      for (std::int64_t i = 0; i < want.at(name).numel(); ++i)
        CHECK(want.at(name).at(i) == got.at(name).at(i));
    }
    for (std::int64_t i = 0; i < 3; ++i)  // the same terms summed in another order
      CHECK(got.at("db").at(i) == doctest::Approx(want.at("db").at(i)).epsilon(1e-5));
  }
}

TEST_CASE(
    "apply_masks_before_pool_grads: a mask other than ReLU's (y > 0.5) multiplies the pooled "
    "gradient, values unchanged") {
  Graph g;
  const Value y = g.input("y", {2, 3, 6, 6});
  const Value dy = g.input("dy", {2, 3, 3, 3});
  g.output("pooled", max_pool2d(y, 2));
  g.output("masked", max_pool2d_grad(y, dy, 2, 2, 0) * greater(y, g.fill(0.5)));
  const Graph before = eliminate_dead_code(g);
  const Graph after = eliminate_dead_code(apply_masks_before_pool_grads(before));
  verify(after);
  int masked_grads = 0;
  for (const Node& n : after.nodes())
    if (n.op->id == OpId::max_pool2d_grad) {
      CHECK_FALSE(n.attrs.has("relu"));
      masked_grads += after.node(n.inputs[1].node).op->id == OpId::mul;
    }
  CHECK(masked_grads == 1);
  const std::vector<Feed> feeds = {{"y", test::random_tensor({2, 3, 6, 6}, DType::f32, 3)},
                                   {"dy", test::random_tensor({2, 3, 3, 3}, DType::f32, 4)}};
  const Tensor want = compile(before, {.fuse = false})->run(feeds).at("masked");
  const Tensor got = compile(after, {.fuse = false})->run(feeds).at("masked");
  for (std::int64_t i = 0; i < want.numel(); ++i)  // equal (a masked maximum's 0 may lose its sign)
    CHECK(want.at(i) == got.at(i));
}

TEST_CASE(
    "apply_masks_before_pool_grads leaves a pool gradient that is read twice, and its values, "
    "alone") {
  Graph g;
  const Value x = g.input("x", {1, 2, 4, 4});
  const Value y = relu(x);
  const Value dy = g.input("dy", {1, 2, 2, 2});
  const Value routed = max_pool2d_grad(y, dy, 2, 2, 0);
  (void)max_pool2d(y, 2);
  g.output("routed", routed);  // a second reader
  g.output("masked", routed * greater(y, g.fill(0.0)));
  const Graph before = eliminate_dead_code(g);
  const Graph after = eliminate_dead_code(apply_masks_before_pool_grads(before));
  int muls = 0;
  for (const Node& n : after.nodes())
    muls += n.op->id == OpId::mul && n.outputs[0].shape == Shape{1, 2, 4, 4};
  CHECK(muls == 1);
}

namespace {

// A two-layer MLP's SGD step, fused: weight gradients go to the side stream, updates in place.
Graph mlp_step() {
  Graph g;
  const Value x = g.input("x", {8, 6});
  VariablePtr w1 = make_variable("w1", test::random_tensor({6, 5}, DType::f32, 2));
  VariablePtr w2 = make_variable("w2", test::random_tensor({5, 3}, DType::f32, 3));
  const Value v1 = g.variable(w1), v2 = g.variable(w2);
  const Value loss = sum_all(tanh(matmul(tanh(matmul(x, v1)), v2)));
  g.output("loss", loss);
  const std::vector<Value> grads = grad(loss, {v1, v2});
  g.assign(w1, v1 - grads[0] * 0.1);
  g.assign(w2, v2 - grads[1] * 0.1);
  return fuse(eliminate_dead_code(g));
}

void no_dump(const char*, const Graph&, const Lowering&) {}

}  // namespace

TEST_CASE("lowering steps: streams, arena offsets, in-place updates and the launch list agree") {
  const Graph g = mlp_step();
  std::vector<std::string> steps;
  static std::vector<std::string>* seen = nullptr;
  seen = &steps;
  const Lowering l = lower_for_device(
      g, 2, [](const char* step, const Graph&, const Lowering&) { seen->push_back(step); });
  CHECK(steps == std::vector<std::string>{"assign_streams", "in_place_updates", "merge_horizontal",
                                          "plan_memory", "launch_list"});
  // plan_memory: aligned slots inside the arena, those live at one node on distinct bytes.
  const std::size_t slots = l.plan.slot_bytes.size();
  for (std::size_t s = 0; s < slots; ++s) {
    CHECK(l.plan.slot_offset[s] % kArenaAlign == 0);
    CHECK(l.plan.slot_offset[s] + l.plan.slot_bytes[s] <= l.plan.arena_bytes);
    for (std::size_t t = s + 1; t < slots; ++t)
      if (l.plan.slot_first[s] <= l.plan.slot_last[t] &&
          l.plan.slot_first[t] <= l.plan.slot_last[s])
        CHECK_FALSE(l.plan.share_bytes(static_cast<std::int32_t>(s), static_cast<std::int32_t>(t)));
  }
  // launch_list: every kernel once, in node order, on its stream; each wait on an event that an
  // earlier launch on another stream recorded; then the updates not done in place.
  std::vector<int> recorded_on(static_cast<std::size_t>(l.launches.events), -1);
  std::int32_t previous = -1;
  int kernels = 0, side = 0;
  for (std::size_t k = 0; k < l.launches.steps.size(); ++k) {
    const LaunchStep& s = l.launches.steps[k];
    if (k >= l.launches.first_update) {
      CHECK(s.node == -1);
      CHECK_FALSE(l.in_place[static_cast<std::size_t>(s.assignment)].in_place);
      continue;
    }
    CHECK(s.node > previous);
    previous = s.node;
    CHECK(s.stream == l.stream_of[static_cast<std::size_t>(s.node)]);
    kernels += s.merged.empty() ? 0 : static_cast<int>(s.merged.size()) - 1;
    for (int e : s.waits) {
      REQUIRE(recorded_on[static_cast<std::size_t>(e)] >= 0);
      CHECK(recorded_on[static_cast<std::size_t>(e)] != s.stream);
    }
    if (s.record >= 0) recorded_on[static_cast<std::size_t>(s.record)] = s.stream;
    ++kernels;
    side += s.stream != 0;
  }
  CHECK(kernels == test::count_kernels(g));
  CHECK(side > 0);  // weight gradients run beside the critical path
  CHECK(l.launches.events > 0);
  REQUIRE(l.in_place.size() == 2);
  CHECK(l.in_place[0].in_place);
  CHECK(l.in_place[1].in_place);
  CHECK(l.launches.first_update == l.launches.steps.size());  // no copies left
  // One stream: no events at all.
  const Lowering one = lower_for_device(g, 1, no_dump);
  CHECK(one.launches.events == 0);
  for (const LaunchStep& s : one.launches.steps) CHECK(s.stream == 0);
  CHECK(lowering_text("launch_list", g, l).find("records event 0") != std::string::npos);
  CHECK(lowering_text("plan_memory", g, l).find("at offset 0") != std::string::npos);
}

namespace {

// Adam over four weights of different sizes on one stream: the four update groups are of one
// kind, and what they read is planned while other kernels run between them.
Graph adam_step(std::vector<VariablePtr>& weights) {
  Graph g;
  Value h = g.input("x", {8, 6});
  std::vector<Value> vars;
  const std::vector<std::int64_t> widths = {6, 7, 5, 9, 3};
  for (std::size_t k = 0; k + 1 < widths.size(); ++k) {
    weights.push_back(
        make_variable("w" + std::to_string(k),
                      test::random_tensor({widths[k], widths[k + 1]}, DType::f32, 10 + k)));
    vars.push_back(g.variable(weights.back()));
    h = tanh(matmul(h, vars.back()));
  }
  const Value loss = sum_all(h);
  g.output("loss", loss);
  static Adam adam({.lr = 1e-3});
  adam.append_update(g, weights, grad(loss, vars));
  return fuse(eliminate_dead_code(g));
}

}  // namespace

TEST_CASE(
    "merge_horizontal: an optimizer's update groups of one kind become one launch at the last "
    "one, which waits for all their inputs, and nothing they read is reused before it runs") {
  std::vector<VariablePtr> weights;
  const Graph g = adam_step(weights);
  const Lowering l = lower_for_device(g, 1, no_dump);  // on two streams, below
  REQUIRE(l.horizontal.size() >= 1);
  const HorizontalLaunch* updates = nullptr;
  for (const HorizontalLaunch& h : l.horizontal)
    if (h.nodes.size() == weights.size()) updates = &h;
  REQUIRE(updates != nullptr);  // the four weights' updates (m, v and the weight each)
  const std::optional<std::string> kind =
      horizontal_kind(dynamic_cast<const FusedGroup&>(*g.node(updates->nodes[0]).body));
  REQUIRE(kind.has_value());
  for (std::int32_t m : updates->nodes)
    CHECK(horizontal_kind(dynamic_cast<const FusedGroup&>(*g.node(m).body)) == kind);
  // One launch for the four, at the last member, in node order.
  int launches_of_members = 0;
  for (const LaunchStep& s : l.launches.steps) {
    for (std::int32_t m : updates->nodes) launches_of_members += s.node == m;
    if (s.merged == updates->nodes) CHECK(s.node == updates->nodes.back());
  }
  CHECK(launches_of_members == 1);
  // On two streams, the groups of a kind on each stream merge apart.
  const Lowering two = lower_for_device(g, 2, no_dump);
  std::size_t merged_on_two = 0;
  for (const HorizontalLaunch& h : two.horizontal)
    for (std::int32_t m : h.nodes) {
      CHECK(two.stream_of[static_cast<std::size_t>(m)] ==
            two.stream_of[static_cast<std::size_t>(h.nodes.back())]);
      merged_on_two += horizontal_kind(dynamic_cast<const FusedGroup&>(*g.node(m).body)) == kind;
    }
  CHECK(merged_on_two >= 2);
  // On one stream, the bytes of every value a member reads hold nothing else that is written
  // before the launch runs.
  const Lowering& one = l;
  const std::int32_t at = updates->nodes.back();
  for (std::int32_t m : updates->nodes)
    for (const ValueRef& in : g.node(m).inputs) {
      const ValueRef root = alias_root(g, in);
      const std::int32_t slot =
          one.plan.slot[static_cast<std::size_t>(root.node)][static_cast<std::size_t>(root.index)];
      if (slot < 0) continue;  // a variable or an input
      for (std::int32_t id = root.node + 1; id <= at; ++id)
        for (std::int32_t o : one.plan.slot[static_cast<std::size_t>(id)])
          CHECK((o < 0 || !one.plan.share_bytes(o, slot)));
    }
  CHECK(lowering_text("merge_horizontal", g, l).find("one launch of 4 groups") !=
        std::string::npos);
  CHECK(lowering_text("launch_list", g, l).find("horizontal x4") != std::string::npos);
  // Off: every group launches on its own.
  setenv("KILN_HORIZONTAL", "0", 1);
  const Lowering off = lower_for_device(g, 1, no_dump);
  unsetenv("KILN_HORIZONTAL");
  CHECK(off.horizontal.empty());
  CHECK(off.launches.steps.size() > l.launches.steps.size());
  // --check-numerics lowers without merging.
  CHECK(lower_for_device(g, 1, no_dump, false).horizontal.empty());
}

}  // namespace kiln
