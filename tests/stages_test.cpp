// The stage pass (fusion/stages.h) and the staged groups' evaluators: softmax with its loss,
// batch norm forward and backward, against the unfused ops on fresh random inputs, on the CPU
// (short rows, long rows, several tiles a row, thread counts) and on the GPU.
#include <doctest/doctest.h>
#include <omp.h>

#include <cstring>
#include <limits>
#include <tuple>

#include "fusion/codegen.h"
#include "fusion/fuse.h"
#include "fusion/fused_group.h"
#include "fusion/stages.h"
#include "graph/autograd.h"
#include "graph/nn/batch_norm.h"
#include "graph/nn/functional.h"
#include "graph/passes/dead_code.h"
#include "graph/passes/verify.h"
#include "tests/support.h"

#ifdef KILN_HAVE_CUDA
#include "gpu/nvrtc_compiler.h"
#endif

namespace kiln {
namespace {

using test::random_feeds;

// Softmax cross-entropy over [rows, classes] logits against soft targets (a graph input, so the
// loss's sum may join the softmax's group: fusion/stages.h) and its gradient.
Graph softmax_loss(std::int64_t rows, std::int64_t classes = 13) {
  Graph g;
  const Value logits = g.input("logits", {rows, classes});
  const Value targets = g.input("targets", {rows, classes});
  const Value loss = mean_all(-sum(targets * log_softmax(logits * 1.5), {1}));
  g.output("loss", loss);
  g.output("dlogits", grad(loss, {logits})[0]);
  return g;
}

// cross_entropy's loss and gradient over [rows, classes] logits against labels (in [0, 10)), in
// its row form (`rowwise`) or written over the log-softmax, as it was.
Graph cross_entropy_step(std::int64_t rows, std::int64_t classes, double smoothing, bool rowwise) {
  Graph g;
  const Value logits = g.input("logits", {rows, classes});
  const Value labels = g.input("labels", {rows}, DType::i64);
  Value loss;
  if (rowwise) {
    loss = cross_entropy(logits * 1.5, labels, smoothing);
  } else {
    const Value t = one_hot(labels, classes, DType::f32) * (1.0 - smoothing) +
                    smoothing / static_cast<double>(classes);
    loss = -mean_all(sum(t * log_softmax(logits * 1.5, 1), {1}));
  }
  g.output("loss", loss);
  g.output("dlogits", grad(loss, {logits})[0]);
  return g;
}

// Batch norm in training mode over `shape` (NCHW) and the gradients of sum(y * w).
Graph batch_norm_step(const Shape& shape) {
  Graph g;
  const Value x = g.input("x", shape);
  const Value gamma = g.input("gamma", {shape[1]});
  const Value beta = g.input("beta", {shape[1]});
  const Value w = g.input("w", shape);
  const BatchNormResult bn = batch_norm_training(x, gamma, beta, 1e-5);
  const Value loss = sum_all(relu(bn.y) * w);
  g.output("y", bn.y);
  g.output("mean", bn.mean);
  g.output("var", bn.var);
  const std::vector<Value> grads = grad(loss, {x, gamma, beta});
  g.output("dx", grads[0]);
  g.output("dgamma", grads[1]);
  g.output("dbeta", grads[2]);
  return g;
}

struct Staged {
  Graph graph;
  int staged_groups = 0;
  int most_stages = 0;
};

Staged stage(const Graph& g, const StageOptions& options) {
  Staged s{stage_reductions(fuse(eliminate_dead_code(g)), options)};
  verify(s.graph);
  for (const Node& n : s.graph.nodes()) {
    const auto* body = n.body ? dynamic_cast<const FusedGroup*>(n.body.get()) : nullptr;
    if (body == nullptr || !body->staged()) continue;
    ++s.staged_groups;
    s.most_stages = std::max(s.most_stages, body->stage_count());
  }
  return s;
}

const StageOptions kAnyRow{.max_row_elements = std::numeric_limits<std::int64_t>::max()};

void check_close(const Outputs& got, const Outputs& want, double tolerance) {
  for (const auto& [name, tensor] : want) {
    CAPTURE(name);
    CHECK(test::closeness(got.at(name), tensor, tolerance, tolerance) <= 1.0);
  }
}

}  // namespace

TEST_CASE("softmax, its loss and its gradient run as staged groups equal to the unfused ops") {
  for (std::int64_t rows : {1, 37, 300}) {
    CAPTURE(rows);
    const Graph g = softmax_loss(rows);
    const Staged s = stage(g, kAnyRow);
    CHECK(s.staged_groups >= 1);
    CHECK(s.most_stages >= 3);  // max, then the sum of exponentials, then the loss
    const std::vector<Feed> feeds = random_feeds(g, 11 + static_cast<std::uint64_t>(rows));
    const Outputs reference = compile(g, {.fuse = false})->run(feeds);
    check_close(compile(s.graph, {.fuse = false})->run(feeds), reference, 1e-5);
    check_close(compile(g)->run(feeds), reference, 1e-5);  // the CPU's own policy
  }
}

// cross_entropy (graph/nn/functional.cpp) in its row form: log(sum(exp(x - m))) + m - sum(t * x)
// a row, never the log-softmax over [N, C]. Its loss and gradient equal those of the log-softmax
// form on fresh random logits, with and without label smoothing; under the GPU's policy its rows
// (the maximum, the sum of exponentials with the targets' dot product, their combine) and the
// gradient fuse into one staged group: one kernel fewer than the log-softmax form's.
TEST_CASE(
    "cross-entropy in its row form: the log-softmax form's values, its rows one staged group") {
  for (const auto& [rows, classes, smoothing] :
       {std::tuple{1L, 10L, 0.0}, std::tuple{37L, 10L, 0.1}, std::tuple{300L, 1000L, 0.0}}) {
    CAPTURE(rows);
    CAPTURE(classes);
    const Graph rowwise = cross_entropy_step(rows, classes, smoothing, true);
    const Graph full = cross_entropy_step(rows, classes, smoothing, false);
    const std::vector<Feed> feeds = random_feeds(full, 5 + static_cast<std::uint64_t>(rows));
    const Outputs reference = compile(full, {.fuse = false})->run(feeds);
    check_close(compile(rowwise, {.fuse = false})->run(feeds), reference, 1e-5);
    check_close(compile(rowwise)->run(feeds), reference, 1e-5);
    // The GPU's policy: the rows and the gradient in one group of two stages, then the mean.
    const Staged rows_staged = stage(simplify_for_fusion(rowwise), cuda_stage_options());
    const Staged full_staged = stage(simplify_for_fusion(full), cuda_stage_options());
    check_close(compile(rows_staged.graph, {.fuse = false})->run(feeds), reference, 1e-5);
    CHECK(rows_staged.staged_groups >= 1);
    CHECK(rows_staged.most_stages >= 2);  // the maximum; the sum of exponentials, the dot, dx
    CHECK(test::count_kernels(rows_staged.graph) < test::count_kernels(full_staged.graph));
  }
}

TEST_CASE("batch norm's statistics, normalisation and backward as staged groups, any row length") {
  // Rows of 126 elements (several rows a tile), 2304 (three tiles a row), odd channel counts,
  // batch 1.
  for (const Shape& shape : {Shape{6, 5, 3, 7}, Shape{16, 3, 12, 12}, Shape{1, 7, 5, 5}}) {
    CAPTURE(shape.str());
    const Graph g = batch_norm_step(shape);
    const Staged s = stage(g, kAnyRow);
    CHECK(s.staged_groups >= 1);  // the forward and the backward may become one
    const Staged fewer = stage(g, {.max_row_elements = 100});
    CHECK(fewer.graph.nodes().size() >= s.graph.nodes().size());
    const std::vector<Feed> feeds = random_feeds(g, 3);
    const Outputs reference = compile(g, {.fuse = false})->run(feeds);
    check_close(compile(s.graph, {.fuse = false})->run(feeds), reference, 2e-5);
  }
}

// Rows past the stage pass's length (cuda_stage_options: 1024) take row outputs only where
// nothing else reads the reductions, and the group stays one pass over the rows whose
// finisher computes them (8192 elements a row here: a split reduction on the GPU).
TEST_CASE("batch norm's per-channel values join its long rows' statistics as row outputs") {
  const Graph g = batch_norm_step({8, 3, 32, 32});
  const Staged s = stage(g, cuda_stage_options());
  int late = 0;
  for (const Node& n : s.graph.nodes()) {
    const FusedGroup* body = fused_group_of(n);
    if (body == nullptr || !body->reduction) continue;
    CHECK(body->stage_count() == 1);  // no pass over a long row reads a statistic
    if (!body->row_outputs.empty()) {
      CHECK(body->rows_finish_only());
      CHECK(!body->row_output_instrs().empty());
      ++late;
    }
  }
  CHECK(late >= 2);                        // the forward's mean and variance, the backward's sums
  for (const Node& n : s.graph.nodes()) {  // the GPU's kernels: a finisher with the row outputs
    const FusedGroup* body = fused_group_of(n);
    if (body == nullptr || body->row_outputs.empty()) continue;
    const CudaKernelSource k = generate_cuda(*body);
    CAPTURE(k.source);
    CHECK(!k.warp_jobs);
    CHECK(k.splits > 1);
    CHECK(k.row_outputs == static_cast<int>(body->row_outputs.size()));
    CHECK(k.source.find("row_out0[o] = ") > k.source.find(k.finish_name + "("));
#ifdef KILN_HAVE_CUDA
    CHECK(gpu::compile_to_cubin({k.name, k.source, {}}, {.sm = 90}).size() > 4);
#endif
    // KILN_LAST_BLOCK_FINISH=1: no finisher; the block that counts an output's last split in
    // stores its reduced outputs and row outputs.
    setenv("KILN_LAST_BLOCK_FINISH", "1", 1);
    const CudaKernelSource in_kernel = generate_cuda(*body);
    unsetenv("KILN_LAST_BLOCK_FINISH");
    CAPTURE(in_kernel.source);
    CHECK(in_kernel.finish_in_kernel);
    CHECK(in_kernel.finish_name.empty());
    CHECK(in_kernel.splits == k.splits);
    CHECK(in_kernel.source.find("_finish(") == std::string::npos);
    CHECK(in_kernel.source.find("row_out0[o] = ") > in_kernel.source.find("atomicAdd(arrivals"));
    CHECK(in_kernel.source.find("result[o] = ") != std::string::npos);
    CHECK(in_kernel.source.find("arrivals[o] = 0u;") != std::string::npos);
#ifdef KILN_HAVE_CUDA
    CHECK(gpu::compile_to_cubin({in_kernel.name, in_kernel.source, {}}, {.sm = 90}).size() > 4);
#endif
    // KILN_REDUCTION_THREADS=N: blocks of N threads whatever the occupancy (a multiple of 32).
    setenv("KILN_REDUCTION_THREADS", "64", 1);
    const CudaKernelSource narrow_blocks = generate_cuda(*body);
    CHECK(narrow_blocks.block_threads == 64);
    CHECK(narrow_blocks.block_forced);
    CHECK(narrow_blocks.source == k.source);  // the same kernel, launched otherwise
    setenv("KILN_REDUCTION_THREADS", "48", 1);
    CHECK_THROWS_WITH_AS(generate_cuda(*body), doctest::Contains("a multiple of 32"), Error);
    unsetenv("KILN_REDUCTION_THREADS");
  }
  StageOptions no_rows = cuda_stage_options();
  no_rows.finish_row_outputs = false;
  CHECK(stage(g, no_rows).graph.nodes().size() >= s.graph.nodes().size() + 2);
  const std::vector<Feed> feeds = random_feeds(g, 41);
  check_close(compile(s.graph, {.fuse = false})->run(feeds),
              compile(g, {.fuse = false})->run(feeds), 2e-5);
}

// A group over the reduced shape that updates no variable merges into the reductions' group
// (batch norm's weight gradient, the division of sum(dy * (x - k)) by the deviation: a kernel
// fewer a layer); one that updates a variable (gamma -= lr * dgamma) stays apart, in the
// optimizer's horizontal launch. The staged step equals the unfused one.
TEST_CASE("batch norm's weight gradient joins the backward's sums, the weight's update does not") {
  const Shape shape{8, 3, 32, 32};
  Graph g;
  const Value x = g.input("x", shape);
  const Value w = g.input("w", shape);
  const VariablePtr gamma =
      make_variable("gamma", test::random_tensor({3}, DType::f32, 5, 0.5, 1.5));
  const VariablePtr beta = make_variable("beta", test::random_tensor({3}, DType::f32, 6));
  const Value gv = g.variable(gamma), bv = g.variable(beta);
  const BatchNormResult bn = batch_norm_training(x, gv, bv, 1e-5);
  const Value loss = sum_all(relu(bn.y) * w);
  const std::vector<Value> grads = grad(loss, {x, gv, bv});
  g.output("loss", loss);
  g.output("dx", grads[0]);
  g.assign(gamma, gv - grads[1] * 0.1);
  g.assign(beta, bv - grads[2] * 0.1);
  const Staged s = stage(g, cuda_stage_options());
  CHECK(s.graph.assignments().size() == 2);
  for (const auto& [var, ref] : s.graph.assignments()) {
    CAPTURE(var->name);
    const Node& update = s.graph.node(ref.node);
    const FusedGroup* body = fused_group_of(update);
    REQUIRE(body != nullptr);
    CHECK(!body->reduction);  // the update stays a group of its own
    int from_sums = 0;        // its gradient comes straight from the reductions' group
    for (const ValueRef& in : update.inputs) {
      const FusedGroup* producer = fused_group_of(s.graph.node(alias_root(s.graph, in).node));
      from_sums += producer != nullptr && producer->reduction.has_value();
    }
    CHECK(from_sums == 1);
  }
  // Each step from the same weights, then the updated weights compared too.
  const std::vector<Feed> feeds = random_feeds(g, 43);
  const Tensor gamma0 = gamma->value.clone(), beta0 = beta->value.clone();
  Outputs staged = compile(s.graph, {.fuse = false})->run(feeds);
  staged.emplace("gamma", gamma->value.clone());
  staged.emplace("beta", beta->value.clone());
  gamma->value = gamma0.clone();
  beta->value = beta0.clone();
  Outputs unfused = compile(g, {.fuse = false})->run(feeds);
  unfused.emplace("gamma", gamma->value.clone());
  unfused.emplace("beta", beta->value.clone());
  CHECK(test::closeness(unfused.at("gamma"), gamma0, 0, 0) > 1.0);  // the step moved it
  check_close(staged, unfused, 2e-5);
}

// rows_finish_only is what lets a long row take row outputs: never where a later pass or an
// elementwise output reads a reduction (softmax's stages), and the CPU's policy never asks.
TEST_CASE("row outputs on long rows only where nothing but them reads the reductions") {
  const Staged softmax = stage(softmax_loss(37), kAnyRow);
  int multi_stage = 0;
  for (const Node& n : softmax.graph.nodes()) {
    const FusedGroup* body = fused_group_of(n);
    if (body == nullptr || body->stage_count() < 2) continue;
    ++multi_stage;
    CHECK(!body->rows_finish_only());
  }
  CHECK(multi_stage >= 1);
  const Staged cpu = stage(batch_norm_step({8, 3, 32, 32}), cpu_stage_options());
  for (const Node& n : cpu.graph.nodes()) {
    const FusedGroup* body = fused_group_of(n);
    if (body == nullptr || !body->reduction) continue;
    const bool long_rows = body->shape.numel() / body->reduction->type.shape.numel() > 1024;
    CHECK((!long_rows || body->row_outputs.empty()));
  }
}

TEST_CASE("a staged group gives the same bits for any number of threads") {
  const Graph g = batch_norm_step({8, 6, 9, 9});
  const Staged s = stage(g, kAnyRow);
  REQUIRE(s.staged_groups >= 1);
  const std::vector<Feed> feeds = random_feeds(g, 5);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const Outputs one = compile(s.graph, {.fuse = false})->run(feeds);
  omp_set_num_threads(3);
  const Outputs three = compile(s.graph, {.fuse = false})->run(feeds);
  omp_set_num_threads(threads);
  for (const auto& [name, tensor] : one) {
    CAPTURE(name);
    CHECK(std::memcmp(three.at(name).raw(), tensor.raw(), tensor.nbytes()) == 0);
  }
}

TEST_CASE("a group whose other input depends on the reduction's group is not merged into it") {
  // C = exp(x - s) * (a @ w) reads P's row sum s, and a @ w reads P's a: merging C into P
  // would make P wait for a GEMM of its own output.
  Graph g;
  const Value x = g.input("x", {4, 6});
  const Value w = g.input("w", {6, 6});
  const Value a = tanh(x);
  const Value s = sum(a, {1}, true);
  g.output("c", exp(x - s) * matmul(a, w));
  const Staged staged = stage(g, kAnyRow);
  const std::vector<Feed> feeds = random_feeds(g, 9);
  check_close(compile(staged.graph, {.fuse = false})->run(feeds),
              compile(g, {.fuse = false})->run(feeds), 1e-5);
}

TEST_CASE("staged groups in bf16 round where the unfused ops store") {
  const Graph g = batch_norm_step({4, 3, 5, 5});
  const std::vector<Feed> feeds = random_feeds(g, 21);
  const Outputs reference = compile(g, {.fuse = false, .precision = Precision::bf16})->run(feeds);
  check_close(compile(g, {.precision = Precision::bf16})->run(feeds), reference, 2e-2);
  const Graph loss = softmax_loss(29);
  const std::vector<Feed> loss_feeds = random_feeds(loss, 23);
  check_close(compile(loss, {.precision = Precision::bf16})->run(loss_feeds),
              compile(loss, {.fuse = false, .precision = Precision::bf16})->run(loss_feeds), 2e-2);
}

// The bf16 vector bodies compute their lanes in pairs, each rounding of the two one
// cvt.rn.bf16x2 (Writer::compute_pair); one lane at a time (KILN_PAIRED_ROUNDING=0) must give
// the same bits, a NaN, infinities and values that round to ties planted in x, and both the
// CPU's values on clean inputs.
TEST_CASE("GPU: bf16 lanes rounded in pairs give the bits of one lane at a time") {
  if (!test::have_gpu()) return;
  auto run = [](const Graph& g, const std::vector<Feed>& feeds, const char* paired) {
    setenv("KILN_PAIRED_ROUNDING", paired, 1);
    Outputs out = compile(g, {.device = Device::cuda(), .precision = Precision::bf16})->run(feeds);
    unsetenv("KILN_PAIRED_ROUNDING");
    return out;
  };
  // The row-by-row body at 8 lanes (split), at 4 (4 x 4 planes), the elementwise groups.
  for (const Shape& shape : {Shape{16, 8, 32, 32}, Shape{64, 16, 4, 4}, Shape{6, 5, 3, 8}}) {
    CAPTURE(shape.str());
    const Graph g = batch_norm_step(shape);
    const std::vector<Feed> clean = random_feeds(g, 41);
    const Outputs cpu = compile(g, {.precision = Precision::bf16})->run(clean);
    const Outputs gpu = run(g, clean, "1");
    for (const auto& [name, tensor] : cpu) {
      CAPTURE(name);
      CHECK(test::closeness(gpu.at(name), tensor, 2e-2, 2e-2) <= 1.0);
    }
    std::vector<Feed> feeds = random_feeds(g, 42);
    for (Feed& f : feeds) {
      if (f.name != "x") continue;
      float* x = f.tensor.data<float>();
      const std::int64_t plane = shape[2] * shape[3];
      x[3] = std::numeric_limits<float>::quiet_NaN();  // channel 0's statistics NaN
      x[plane + 1] = std::numeric_limits<float>::infinity();
      x[2 * plane + 2] = -std::numeric_limits<float>::infinity();
      for (std::int64_t i = 3 * plane; i < 4 * plane; ++i)  // halfway between bf16 values
        x[i] = 1.0f + static_cast<float>(i % 16) / 128.0f + 1.0f / 256.0f;
    }
    const Outputs paired = run(g, feeds, "1"), single = run(g, feeds, "0");
    for (const auto& [name, tensor] : single) {
      CAPTURE(name);
      const Tensor& p = paired.at(name);
      REQUIRE(p.nbytes() == tensor.nbytes());
      CHECK(std::memcmp(p.raw(), tensor.raw(), tensor.nbytes()) == 0);
    }
  }
}

TEST_CASE(
    "GPU: staged groups match the CPU: softmax with its loss, cross-entropy, batch norm both "
    "ways") {
  if (!test::have_gpu()) return;
  // Rows of 1 to 65 classes: 1 to 32 lanes a row (codegen_stages.cpp, row_lanes), the rows a
  // warp's last rows past the end, a lane's last elements past the row.
  for (std::int64_t classes : {1, 3, 13, 16, 33, 64, 65})
    for (std::int64_t rows : {1, 37, 300}) {
      CAPTURE(classes);
      CAPTURE(rows);
      const Graph g = softmax_loss(rows, classes);
      test::check_gpu_matches_cpu(g, random_feeds(g, 31), 1e-4);
      const Graph ce = cross_entropy_step(rows, std::max<std::int64_t>(classes, 10), 0.1, true);
      test::check_gpu_matches_cpu(ce, random_feeds(ce, 32), 1e-4);
    }
  // Short rows (a warp a row, or rows a warp: 3, 8 and 64 elements), then long ones whose
  // finisher computes the row outputs: split (8 x 32 x 32 = 8192 elements a row) and not (2048
  // rows of 1089: one block a row); then long rows of small planes, whose per-channel inputs a
  // job loads once (4 lanes over 4 x 4 and 2 x 2 planes, one over 3 x 3), split and not.
  for (const Shape& shape :
       {Shape{6, 5, 3, 7}, Shape{3, 5, 1, 1}, Shape{2, 9, 2, 2}, Shape{4, 6, 4, 4},
        Shape{2, 3, 16, 16}, Shape{1, 7, 5, 5}, Shape{8, 3, 32, 32}, Shape{1, 2048, 33, 33},
        Shape{128, 16, 4, 4}, Shape{512, 8, 2, 2}, Shape{200, 4, 3, 3}, Shape{80, 600, 4, 4}}) {
    CAPTURE(shape.str());
    const Graph g = batch_norm_step(shape);
    test::check_gpu_matches_cpu(g, random_feeds(g, 37), 1e-4);
    // The split ones again with their last block finishing each output (three runs of the
    // program: the counts go back to 0 between launches).
    setenv("KILN_LAST_BLOCK_FINISH", "1", 1);
    test::check_gpu_matches_cpu(g, random_feeds(g, 38), 1e-4);
    unsetenv("KILN_LAST_BLOCK_FINISH");
    // And the row-by-row body in blocks of 64 threads, more vectors a thread.
    setenv("KILN_REDUCTION_THREADS", "64", 1);
    test::check_gpu_matches_cpu(g, random_feeds(g, 39), 1e-4);
    unsetenv("KILN_REDUCTION_THREADS");
  }
}

}  // namespace kiln
