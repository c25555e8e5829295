// The fuse pass and the fused CPU evaluator against the unfused reference, on every
// elementwise op and on random DAGs (values and gradients), and the shape of the result.
#include <doctest/doctest.h>

#include <omp.h>

#include <cstring>
#include <map>
#include <random>
#include <tuple>

#include "fusion/fuse.h"
#include "fusion/fused_group.h"
#include "fusion/strided_walk.h"
#include "graph/autograd.h"
#include "graph/op_table.h"
#include "graph/passes/dead_code.h"
#include "graph/passes/verify.h"
#include "models/lenet.h"
#include "graph/testing/lstm_step_graph.h"
#include "graph/testing/random_graph.h"
#include "tests/support.h"

namespace kiln {
namespace {

std::vector<Feed> random_feeds(const Graph& g, std::uint64_t seed) {
  std::vector<Feed> feeds;
  for (const Node& n : g.nodes())
    if (n.op->id == OpId::input)
      feeds.emplace_back(
          n.name, test::random_tensor(n.outputs[0].shape, n.outputs[0].dtype, seed++, -2, 2));
  return feeds;
}

// Runs g fused and unfused on the same random inputs and compares every output.
void check_fused_matches_unfused(const Graph& g, std::uint64_t seed, double tolerance = 1e-5) {
  const std::vector<Feed> feeds = random_feeds(g, seed);
  const Outputs reference = compile(g, {.fuse = false})->run(feeds);
  const Outputs fused = compile(g, {.fuse = true})->run(feeds);
  for (const auto& [name, tensor] : reference) {
    CAPTURE(name);
    CHECK(test::closeness(fused.at(name), tensor, tolerance, tolerance) <= 1.0);
  }
}

}  // namespace

TEST_CASE("every elementwise op fused alone and in a chain matches the unfused result") {
  for (const OpDef* op : all_ops()) {
    if (op->kind != OpKind::elementwise || op->alias || op->id == OpId::broadcast_to) continue;
    CAPTURE(op->name);
    Graph g;
    const Value a = g.input("a", {3, 5});
    const Value b = g.input("b", {5});
    const Value safe = a * a + 0.5;  // log and sqrt need positive inputs
    // cast rounds to bf16: the chain after it is bf16, fused with f32 loads and bf16 stores.
    const Attrs attrs = op->id == OpId::cast ? Attrs{{"dtype", std::string("bf16")}} : Attrs{};
    std::vector<Value> inputs = {safe, b};  // select: a mask of a, then the two values
    if (op->arity == 1) inputs = {op->id == OpId::log || op->id == OpId::sqrt ? safe : a};
    if (op->arity == 3) inputs = {greater(a, scalar_like(a, 0.0)), safe, b};
    const Value y = g.apply1(op->id, inputs, attrs);
    g.output("y", tanh(y) * 0.5 + y);
    check_fused_matches_unfused(g, 1);
  }
}

TEST_CASE("random elementwise DAGs: fused equals unfused, values and gradients") {
  int groups = 0;
  constexpr int kGraphs = 150;
  for (int s = 0; s < kGraphs; ++s) {
    CAPTURE(s);
    Graph g;
    testing::build_with_gradients(g, 1000 + static_cast<std::uint64_t>(s), 6 + s % 20);
    const Graph fused = fuse(eliminate_dead_code(g));
    CHECK_NOTHROW(verify(fused));
    for (const Node& n : fused.nodes()) groups += n.op->kind == OpKind::fused;
    check_fused_matches_unfused(g, 7 + static_cast<std::uint64_t>(s), 2e-5);
  }
  MESSAGE(kGraphs << " random graphs, " << groups
                  << " fused groups, all equal to the unfused reference");
}

TEST_CASE("a value used inside and outside a group is computed once and shared") {
  Graph g;
  const Value x = g.input("x", {4, 8});
  const Value t = tanh(x);
  const Value inside = t * 2.0 + 1.0;
  g.output("t", t);  // read outside the group
  g.output("y", inside);
  const Graph fused = fuse(eliminate_dead_code(g));
  int groups = 0;
  for (const Node& n : fused.nodes())
    if (n.op->kind == OpKind::fused) {
      ++groups;
      CHECK(n.outputs.size() == 2);
    }
  CHECK(groups == 1);
  check_fused_matches_unfused(g, 3);
}

TEST_CASE("fusion never creates a cycle through a node outside the group") {
  // a and c are independent; z = f(c, a) joins c's group; x = h(a, c) must not join a's
  // group, or {a, x} and {c, z} would each need the other first.
  Graph g;
  const Value in = g.input("in", {16});
  const Value a = tanh(in);
  const Value c =
      exp(matmul(reshape(in, {1, 16}), reshape(in, {16, 1})));  // not fusible into a's group
  const Value cz = reshape(c, {1});
  const Value z = broadcast_to(cz, {16}) * a;
  const Value x = a + broadcast_to(cz, {16});
  g.output("z", z);
  g.output("x", x);
  CHECK_NOTHROW(verify(fuse(eliminate_dead_code(g))));
  check_fused_matches_unfused(g, 5);
}

TEST_CASE("a reduction joins its producer's group as the tail") {
  Graph g;
  const Value x = g.input("x", {8, 4, 6});
  const Value b = g.input("b", {4, 1});
  g.output("s", sum(relu(x + b) * 3.0, {0, 2}));
  g.output("m", max(tanh(x), {1}, true));
  const Graph fused = fuse(eliminate_dead_code(g));
  int tails = 0;
  for (const Node& n : fused.nodes())
    if (n.body) tails += dynamic_cast<const FusedGroup&>(*n.body).reduction.has_value();
  CHECK(tails == 2);
  CHECK(test::count_kernels(fused) == 2);
  check_fused_matches_unfused(g, 9);
}

TEST_CASE(
    "relu's mask is computed in the backward's group from the stored output, not stored by the "
    "forward") {
  // y = relu(x w + b) is stored anyway (the next matmul reads it); the gradient's mask
  // greater(y, 0) moves to the group that multiplies it by dy, so no group outputs it.
  Graph g;
  const Value x = g.input("x", {6, 5}), w = g.input("w", {5, 7}), b = g.input("b", {7}),
              w2 = g.input("w2", {7, 3});
  const Value y = relu(matmul(x, w) + broadcast_to(b, {6, 7}));
  const Value loss = sum(tanh(matmul(y, w2)), {0, 1});
  const std::vector<Value> grads = grad(loss, {w, b});
  g.output("loss", loss);
  g.output("dw", grads[0]);
  g.output("db", grads[1]);
  const Graph fused = eliminate_dead_code(fuse(eliminate_dead_code(g)));
  int relu_groups = 0, mask_groups = 0;
  for (const Node& n : fused.nodes()) {
    if (!n.body) continue;
    bool relu = false, mask = false, mul = false;
    for (const FusedInstr& i : dynamic_cast<const FusedGroup&>(*n.body).instrs) {
      relu = relu || i.op->id == OpId::relu;
      mask = mask || i.op->id == OpId::greater;
      mul = mul || i.op->id == OpId::mul;
    }
    if (relu) {
      ++relu_groups;
      CHECK_FALSE(mask);
      CHECK(n.outputs.size() == 1);  // y alone
    }
    if (mask) {
      ++mask_groups;
      CHECK(mul);
    }
  }
  CHECK(relu_groups == 1);
  CHECK(mask_groups == 1);
  check_fused_matches_unfused(g, 15);
}

TEST_CASE(
    "slices feeding a group are read in place: LSTM gates cost no copies, fused equals unfused") {
  Graph g;
  testing::lstm_step_graph(g, 3, 5, 4, true);
  FusionReport report;
  const Graph fused = eliminate_dead_code(fuse(eliminate_dead_code(g), &report));
  int slices = 0, offset_inputs = 0;
  for (const Node& n : fused.nodes()) {
    slices += n.op->id == OpId::slice;
    if (n.body)
      for (const FusedInput& in : dynamic_cast<const FusedGroup&>(*n.body).inputs)
        offset_inputs += in.offset != 0;
  }
  CHECK(slices == 0);         // every slice is read by a group in place
  CHECK(offset_inputs >= 6);  // gates 1-3 of step 0, step 1's rows and its recurrent gates
  check_fused_matches_unfused(g, 12);
  Graph g64;
  testing::lstm_step_graph(g64, 3, 5, 4, true, DType::f64);
  check_fused_matches_unfused(g64, 13, 1e-12);
}

TEST_CASE("a slice read in place over a broadcast, and a group reading two slices of one value") {
  Graph g;
  const Value x = g.input("x", {6, 8});
  const Value b = g.input("b", {2, 10});
  const Value rows =
      slice(slice(x, 1, 4, 4), 0, 2, 3);  // [3, 4] at offset 2*8 + 4 (column slice first)
  const Value bias = slice(slice(b, 0, 1, 1), 1, 3, 4);  // [1, 4], broadcast over rows
  g.output("y", exp(rows) * bias + tanh(slice(slice(x, 0, 0, 3), 1, 1, 4)));
  const Graph fused = eliminate_dead_code(fuse(eliminate_dead_code(g)));
  CHECK(test::count_kernels(fused) == 1);
  check_fused_matches_unfused(g, 14, 1e-6);
}

TEST_CASE(
    "the LeNet training step: far fewer kernels after fusion, optimizer one group per parameter") {
  Philox rng(0);
  LeNet model(rng);
  Graph g;
  const Value loss =
      cross_entropy(model(g.input("x", {8, 1, 28, 28})), g.input("y", {8}, DType::i64));
  std::vector<Value> params;
  for (const VariablePtr& p : model.parameters()) params.push_back(g.variable(p));
  const std::vector<Value> grads = grad(loss, params);
  Adam adam({});
  adam.append_update(g, model.parameters(), grads);
  g.output("loss", loss);
  const Graph before = eliminate_dead_code(g);
  const Graph after = eliminate_dead_code(fuse(before));
  const int kernels_before = test::count_kernels(before),
            kernels_after = test::count_kernels(after);
  MESSAGE("LeNet + Adam step: " << kernels_before << " kernels unfused, " << kernels_after
                                << " fused");
  CHECK(kernels_after * 3 < kernels_before);
  // Every parameter's update (m, v and the parameter: three assignments) comes from one group.
  std::map<std::int32_t, int> assignments_per_node;
  for (const auto& [var, ref] : after.assignments()) ++assignments_per_node[ref.node];
  int update_groups = 0;
  for (const auto& [node, count] : assignments_per_node) update_groups += count >= 3;
  CHECK(update_groups == 8);
}

}  // namespace kiln

namespace kiln {

TEST_CASE(
    "regressions found by fuzz_compiler: these graphs fuse without cycles and agree exactly") {
  // 1004934: fuse pruned its cycle search at nodes older than the target group, missing a
  //   path through a group that also holds newer nodes.
  // 1081470: exp and tanh gave different last bits for a broadcast and a contiguous input,
  //   which flipped a tie in max's gradient between fused and unfused evaluation.
  for (std::uint64_t seed : {1004934ULL, 1081470ULL}) {
    CAPTURE(seed);
    Graph g;
    testing::build_with_gradients(g, seed, 3 + static_cast<int>(seed % 24));
    CHECK_NOTHROW(verify(fuse(eliminate_dead_code(g))));
    // fuzz_compiler's inputs: uniform in [-2, 2) from seed * 7 + 1, one stream per input
    std::vector<Feed> feeds;
    std::uint64_t s = seed * 7 + 1;
    for (const Node& n : g.nodes())
      if (n.op->id == OpId::input)
        feeds.emplace_back(n.name,
                           test::random_tensor(n.outputs[0].shape, n.outputs[0].dtype, s++, -2, 2));
    const Outputs reference = compile(g, {.fuse = false})->run(feeds);
    const Outputs fused = compile(g)->run(feeds);
    for (const auto& [name, tensor] : reference) {
      CAPTURE(name);
      CHECK(test::closeness(fused.at(name), tensor, 1e-6, 1e-6) <= 1.0);
    }
  }
}

// Batch norm's backward sums: sum(dy) and sum(dy * xhat) over (N, H, W), and a max over the
// same axes, join one group: one pass, three reduced outputs, dy and dy * xhat never stored;
// the values equal the unfused ones bit for bit (each reduction keeps its blocks and order),
// in f32 and with bf16 inputs. A sum over other axes stays a group of its own.
TEST_CASE("sibling reductions over the same axes share one fused group and its values") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    Graph g;
    test::add_sibling_sums(g, {4, 6, 9, 10}, dtype);
    g.output("row_sums", sum(g.input("other", {4, 6, 9, 10}) * 2.0, {3}));
    const Graph fused = fuse(g);
    int groups = 0, siblings = 0;
    for (const Node& n : fused.nodes()) {
      if (n.op->id != OpId::fused) continue;
      ++groups;
      const auto& body = static_cast<const FusedGroup&>(*n.body);
      if (body.more_reductions.size() == 2 && body.outputs.empty() && n.outputs.size() == 3)
        ++siblings;
    }
    CHECK(groups == 2);
    CHECK(siblings == 1);
    const std::vector<Feed> feeds = random_feeds(g, 5);
    const Outputs reference = compile(g, {.fuse = false})->run(feeds);
    const Outputs together = compile(g, {.fuse = true})->run(feeds);
    for (const auto& [name, tensor] : reference) {
      CAPTURE(name);
      CHECK(std::memcmp(together.at(name).raw(), tensor.raw(), tensor.nbytes()) == 0);
    }
  }
}

}  // namespace kiln

namespace kiln {

// The CPU evaluator's tiles along per-channel runs (fusion/cpu_fused.cpp): where every
// broadcast input is one value over an image's H x W elements (at least 256 of them), tiles are
// pieces of those runs and such inputs, and what is computed from them alone, are scalars over
// the tile. The elementwise outputs equal the unfused ones bit for bit, the sums within float
// rounding, for a run in one tile, a run cut in two and a run too short (gathered), in f32 and
// bf16, and the same bits on 1 and 3 threads.
// Runs of 256 and more are cut into tiles; runs of 16 to 63 (7 x 7, 4 x 4 images) make
// channel-major tiles of several images; 8 x 8, 15 x 15 and 1 x 1 keep gathered kTile tiles.
TEST_CASE("CPU fused tiles along per-channel runs and channel-major tiles: the unfused values") {
  for (const Shape& shape :
       {Shape{3, 4, 20, 20}, Shape{2, 3, 40, 36}, Shape{5, 2, 15, 15}, Shape{7, 5, 7, 7},
        Shape{9, 3, 8, 8}, Shape{33, 6, 4, 4}, Shape{70, 3, 4, 4}, Shape{4, 2, 1, 1}}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      CAPTURE(shape.str());
      CAPTURE(dtype_name(dtype));
      const std::int64_t c = shape[1];
      Graph g;
      const Value x = cast(g.input("x", shape, dtype), DType::f32);
      const Value s = g.input("s", {1, c, 1, 1});
      const Value k = slice(slice(slice(x, 0, 0, 1), 2, 0, 1), 3, 0, 1);  // x[0, c, 0, 0]
      const Value shift = broadcast_to(reshape(exp(s) * 2.0 - k, {1, c, 1, 1}), shape);
      const Value y = relu((x - k) * s + shift);
      g.output("y", cast(y, dtype));
      g.output("uniform", broadcast_to(s * s + 1.0, shape));  // one value per channel, stored
      g.output("sum_centered", sum(x - k, {0, 2, 3}));
      g.output("sum_yx", sum(y * x, {0, 2, 3}));
      const std::vector<Feed> feeds = random_feeds(g, 9);
      const Outputs reference = compile(g, {.fuse = false})->run(feeds);
      const int before = omp_get_max_threads();
      std::map<int, Outputs> fused;
      for (int threads : {1, 3}) {
        omp_set_num_threads(threads);
        fused.emplace(threads, compile(g, {.fuse = true})->run(feeds));
      }
      omp_set_num_threads(before);
      for (const auto& [name, tensor] : reference) {
        CAPTURE(name);
        const Tensor& one = fused.at(1).at(name);
        if (name.rfind("sum_", 0) == 0)
          CHECK(test::closeness(one, tensor, 1e-5, 1e-5) <= 1.0);
        else
          CHECK(std::memcmp(one.raw(), tensor.raw(), tensor.nbytes()) == 0);
        CHECK(std::memcmp(fused.at(3).at(name).raw(), one.raw(), one.nbytes()) == 0);
      }
    }
  }
}

TEST_CASE("a strided walk from a cursor visits the runs a walk from the start visits") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::int64_t> dims, strides;
    const int rank = 1 + static_cast<int>(rng() % 4);
    for (int d = 0; d < rank; ++d) {
      dims.push_back(1 + static_cast<std::int64_t>(rng() % 6));
      strides.push_back(rng() % 3 == 0 ? 0 : 1 + static_cast<std::int64_t>(rng() % 40));
    }
    const Shape shape(dims);
    const StridedWalk walk(shape, strides);
    const std::int64_t n = shape.numel();
    using Visit = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>;
    auto record = [](std::vector<Visit>& into) {
      return [&into](std::int64_t pos, std::int64_t length, std::int64_t offset,
                     std::int64_t step) { into.emplace_back(pos, length, offset, step); };
    };
    // Pieces one after another (the cursor steps on) and, every third, a jump (it seeks).
    StridedWalk::Cursor cursor;
    std::int64_t start = 0;
    for (int piece = 0; piece < 100 && start < n; ++piece) {
      const std::int64_t count = std::min<std::int64_t>(n - start, 1 + rng() % 9);
      std::vector<Visit> stepped, fresh;
      walk.runs(start, count, cursor, record(stepped));
      walk.runs(start, count, record(fresh));
      CAPTURE(shape.str());
      CAPTURE(start);
      CHECK(stepped == fresh);
      start = rng() % 3 == 0 ? static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n))
                             : start + count;
    }
  }
}

}  // namespace kiln
