// rematerialize_outputs (fusion/rematerialize.h): an output made again by its readers from what
// its group stores anyway, the same bits on the CPU and (through compile) the GPU.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "backends/compile.h"
#include "core/philox.h"
#include "fusion/channels_last_outputs.h"
#include "fusion/codegen.h"
#include "fusion/fuse.h"
#include "fusion/fused_group.h"
#include "fusion/rematerialize.h"
#include "fusion/stages.h"
#include "gpu/kernel_cache.h"
#include "graph/ops.h"
#include "graph/passes/dead_code.h"
#include "graph/passes/verify.h"
#include "graph/testing/random_graph.h"
#include "models/resnet.h"
#include "tests/support.h"

namespace kiln {
namespace {

// a = relu(x + y) (a graph output: stored), b = a * s (s per channel) and sum(b) in one group
// (the reduction ends it); b - sum(b) in another, which reads b. With `b_out`, b is an output too.
Graph scaled_sums(DType dtype, bool b_out) {
  Graph g;
  const Value x = g.input("x", {2, 8, 4, 4}, dtype);
  const Value y = g.input("y", {2, 8, 4, 4}, dtype);
  const Value s = g.input("s", {1, 8, 1, 1}, dtype);
  const Value a = relu(x + y);
  const Value b = a * s;
  g.output("a", a);
  g.output("centred", b - sum(b, {0, 2, 3}, true));
  if (b_out) g.output("b", b);
  return g;
}

// Batch norm's backward in small: a = y * s + b, g = dy * (a > t) and sum(g) in one group (the
// reduction ends it); (g - sum(g)) * y in another, which loads y anyway: it makes g again from
// dy, y and the per-channel values instead of loading it (one value fewer written and read,
// dy read instead of g).
Graph masked_sums(DType dtype) {
  Graph g;
  const Value dy = g.input("dy", {2, 8, 4, 4}, dtype);
  const Value y = g.input("y", {2, 8, 4, 4}, dtype);
  const Value s = g.input("s", {1, 8, 1, 1}, dtype);
  const Value b = g.input("b", {1, 8, 1, 1}, dtype);
  const Value t = g.input("t", {1, 8, 1, 1}, dtype);
  const Value grad = dy * greater(y * s + b, t);
  g.output("h", (grad - sum(grad, {0, 2, 3}, true)) * y);
  return g;
}

// p = x * s and q = p - t, and sum(q), in one group; (q - sum(q)) * p * y in another. Both p
// (from x) and q (from p, which the reader loads anyway) could be made again, not both: q
// saves more.
Graph chained(DType dtype) {
  Graph g;
  const Value x = g.input("x", {2, 8, 4, 4}, dtype);
  const Value y = g.input("y", {2, 8, 4, 4}, dtype);
  const Value s = g.input("s", {1, 8, 1, 1}, dtype);
  const Value t = g.input("t", {1, 8, 1, 1}, dtype);
  const Value p = x * s;
  const Value q = p - t;
  g.output("h", (q - sum(q, {0, 2, 3}, true)) * p * y);
  return g;
}

// a = relu(x * s) is a graph output (stored), and sum(a) ends its group; (a - sum(a)) * x in
// another group, which loads x anyway: it makes a from x and s instead of loading it.
Graph kept_output(DType dtype) {
  Graph g;
  const Value x = g.input("x", {2, 8, 4, 4}, dtype);
  const Value s = g.input("s", {1, 8, 1, 1}, dtype);
  const Value a = relu(x * s);
  g.output("a", a);
  g.output("h", (a - sum(a, {0, 2, 3}, true)) * x);
  return g;
}

std::vector<const FusedGroup*> groups(const Graph& g) {
  std::vector<const FusedGroup*> all;
  for (const Node& n : g.nodes())
    if (const FusedGroup* group = fused_group_of(n)) all.push_back(group);
  return all;
}

std::size_t full_outputs(const Graph& g) {
  std::size_t n = 0;
  for (const FusedGroup* group : groups(g)) n += group->outputs.size();
  return n;
}

std::int64_t group_bytes(const Graph& g) {
  std::int64_t n = 0;
  for (const FusedGroup* group : groups(g)) n += group->bytes_read() + group->bytes_written();
  return n;
}

void check_same_bits(const Graph& g, const Graph& remade) {
  const std::vector<Feed> feeds = test::random_feeds(g, 3);
  const Outputs want = test::run_once(g, feeds), got = test::run_once(remade, feeds);
  for (const auto& [name, tensor] : want) {
    CAPTURE(name);
    std::int64_t differ = 0;
    for (std::int64_t i = 0; i < tensor.numel(); ++i) differ += got.at(name).at(i) != tensor.at(i);
    CHECK(differ == 0);
  }
}

}  // namespace

TEST_CASE("an output one multiply from a stored one is made again by its reader: the same bits") {
  for (DType dtype : {DType::f32, DType::bf16})
    for (bool b_out : {false, true}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(b_out);
      const Graph g = scaled_sums(dtype, b_out);
      const Graph fused = eliminate_dead_code(fuse(g));
      const Graph remade = eliminate_dead_code(rematerialize_outputs(fused));
      CHECK_NOTHROW(verify(remade));
      // b stays stored where it is an output; else its group stores only a (and the sum).
      CHECK(full_outputs(remade) == full_outputs(fused) - (b_out ? 0 : 1));
      check_same_bits(g, remade);
      setenv("KILN_REMATERIALIZE", "0", 1);
      CHECK(full_outputs(rematerialize_outputs(fused)) == full_outputs(fused));
      unsetenv("KILN_REMATERIALIZE");
    }
}

TEST_CASE("an output of several instructions is made again where its reader moves fewer bytes") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    const auto size = static_cast<std::int64_t>(dtype_size(dtype));
    const std::int64_t value = 2 * 8 * 4 * 4 * size, row = 8 * size;
    {
      const Graph g = masked_sums(dtype);
      const Graph fused = eliminate_dead_code(fuse(g));
      const Graph remade = eliminate_dead_code(rematerialize_outputs(fused));
      CHECK_NOTHROW(verify(remade));
      CHECK(full_outputs(remade) == full_outputs(fused) - 1);  // g is not stored
      // g written and read no more, dy read in its place (and s, b, t): one value fewer.
      CHECK(group_bytes(remade) == group_bytes(fused) - value + 3 * row);
      check_same_bits(g, remade);
    }
    {
      const Graph g = chained(dtype);
      const Graph fused = eliminate_dead_code(fuse(g));
      const Graph remade = eliminate_dead_code(rematerialize_outputs(fused));
      CHECK_NOTHROW(verify(remade));
      CHECK(full_outputs(remade) == full_outputs(fused) - 1);
      // q made again from p and t (two values fewer), not p from x (one fewer)
      CHECK(group_bytes(remade) == group_bytes(fused) - 2 * value + row);
      check_same_bits(g, remade);
    }
  }
  // Where the reader would load as much more as is saved, the value stays stored: x * y made
  // again by a reader of dy alone would load x and y (two values more) for one written and one
  // read fewer.
  Graph g;
  const Value dy = g.input("dy", {2, 8, 4, 4}, DType::f32);
  const Value x = g.input("x", {2, 8, 4, 4}, DType::f32);
  const Value y = g.input("y", {2, 8, 4, 4}, DType::f32);
  const Value a = x * y;
  g.output("h", (a - sum(a, {0, 2, 3}, true)) * dy);
  const Graph fused = eliminate_dead_code(fuse(g));
  CHECK(full_outputs(eliminate_dead_code(rematerialize_outputs(fused))) == full_outputs(fused));
}

TEST_CASE("an output that stays stored is made again by a reader that loads its leaves anyway") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    const Graph g = kept_output(dtype);
    const Graph fused = eliminate_dead_code(fuse(g));
    const Graph remade = eliminate_dead_code(rematerialize_outputs(fused));
    CHECK_NOTHROW(verify(remade));
    CHECK(full_outputs(remade) == full_outputs(fused));  // a is still stored
    // The reader loads x and s (8 values) instead of x and a.
    const std::int64_t a_bytes = 2 * 8 * 4 * 4 * static_cast<std::int64_t>(dtype_size(dtype));
    CHECK(group_bytes(remade) ==
          group_bytes(fused) - a_bytes + 8 * static_cast<std::int64_t>(dtype_size(dtype)));
    check_same_bits(g, remade);
    setenv("KILN_REMATERIALIZE_LOCAL", "0", 1);
    CHECK(group_bytes(eliminate_dead_code(rematerialize_outputs(fused))) == group_bytes(fused));
    unsetenv("KILN_REMATERIALIZE_LOCAL");
  }
}

TEST_CASE("random DAGs with their gradients: the outputs made again keep every bit") {
  int remade_graphs = 0, local_graphs = 0;
  for (std::uint64_t seed = 0; seed < 1000; ++seed) {
    CAPTURE(seed);
    const DType dtype = seed % 3 == 0 ? DType::bf16 : DType::f32;
    Graph g;
    testing::build_with_gradients(g, 900 + seed, 10 + static_cast<int>(seed % 7), dtype);
    const Graph fused =
        eliminate_dead_code(stage_reductions(fuse(eliminate_dead_code(g)), cuda_stage_options()));
    const Graph remade = eliminate_dead_code(rematerialize_outputs(fused));
    // (Made again where outputs are dropped, or where a reader makes one that stays stored.)
    if (full_outputs(remade) == full_outputs(fused) && group_bytes(remade) == group_bytes(fused))
      continue;
    ++remade_graphs;
    setenv("KILN_REMATERIALIZE_LOCAL", "0", 1);
    local_graphs += group_bytes(remade) < group_bytes(rematerialize_outputs(fused));
    unsetenv("KILN_REMATERIALIZE_LOCAL");
    CHECK_NOTHROW(verify(remade));
    CHECK(group_bytes(remade) < group_bytes(fused));
    const std::vector<Feed> feeds = test::random_feeds(g, seed);
    const Outputs want = test::run_once(fused, feeds), got = test::run_once(remade, feeds);
    for (const auto& [name, tensor] : want) {
      CAPTURE(name);
      std::int64_t differ = 0;
      for (std::int64_t i = 0; i < tensor.numel(); ++i) {
        const double a = got.at(name).at(i), b = tensor.at(i);
        differ += a != b && !(std::isnan(a) && std::isnan(b));
      }
      CHECK(differ == 0);
    }
  }
  MESSAGE(remade_graphs << " of 1000 graphs had outputs made again, " << local_graphs
                        << " of them some that stay stored");
  CHECK(remade_graphs >= 60);
  CHECK(local_graphs >= 5);
}

TEST_CASE(
    "ResNet-18's bf16 step under the GPU's passes: the outputs made again keep every bit, and "
    "the kernels they change compile with NVRTC") {
  Philox rng(5);
  ResNet18 model(rng);
  Graph g;
  test::add_classifier_step(g, model, {2, 3, 32, 32});
  const Graph step = eliminate_dead_code(apply_precision(g, Precision::bf16));
  // As compile() and dump prepare a GPU step, up to the pass under test.
  const Graph before = eliminate_dead_code(fold_channels_last_outputs(stage_reductions(
      fuse(apply_channels_last(simplify_for_fusion(step))), cuda_stage_options())));
  const Graph remade = eliminate_dead_code(rematerialize_outputs(before));
  CHECK_NOTHROW(verify(remade));
  // Each batch norm's backward over rows longer than a staged group takes (stage 1's 2 x 32 x
  // 32) stops storing its masked gradient, and the residual blocks' g times a scale: fewer
  // values, fewer bytes.
  CHECK(full_outputs(remade) + 4 <= full_outputs(before));
  CHECK(group_bytes(remade) < group_bytes(before));
  // And the downsampling blocks' backward sums make the block's output again from its two
  // convolutions' outputs, which they load anyway, where it stays stored for the next block.
  setenv("KILN_REMATERIALIZE_LOCAL", "0", 1);
  CHECK(group_bytes(remade) < group_bytes(eliminate_dead_code(rematerialize_outputs(before))));
  unsetenv("KILN_REMATERIALIZE_LOCAL");
  // The values saved in the variables (the running statistics) are restored before the second
  // run, so that both see the same ones.
  std::map<VariablePtr, Tensor> saved;
  for (const auto& [var, ref] : before.assignments()) saved[var] = var->value.clone();
  const std::vector<Feed> feeds = test::random_feeds(step, 17);
  const Outputs want = test::run_once(before, feeds);
  for (auto& [var, value] : saved) var->value.copy_from(value);
  const Outputs got = test::run_once(remade, feeds);
  for (const auto& [name, tensor] : want) {
    CAPTURE(name);
    std::int64_t differ = 0;
    for (std::int64_t i = 0; i < tensor.numel(); ++i) differ += got.at(name).at(i) != tensor.at(i);
    CHECK(differ == 0);
  }
  std::set<std::string> old_sources;
  for (const FusedGroup* group : groups(before)) old_sources.insert(generate_cuda(*group).source);
  std::vector<gpu::KernelSource> sources;
  for (const FusedGroup* group : groups(remade)) {
    const CudaKernelSource k = generate_cuda(*group);
    if (!old_sources.count(k.source)) sources.push_back({k.name, k.source, {}});
  }
  CHECK(sources.size() >= 4);
  const auto dir =
      std::filesystem::temp_directory_path() / ("kiln-rematerialize-" + std::to_string(::getpid()));
  gpu::KernelCache cache(dir);
  const auto compiled = cache.get_or_compile(sources, {.sm = 90});  // NVRTC, no GPU needed
  REQUIRE(compiled.size() == sources.size());
  for (const auto& k : compiled) CHECK(k.cubin.size() > 4);
  std::filesystem::remove_all(dir);
  const std::size_t made_again = full_outputs(before) - full_outputs(remade);
  MESSAGE(made_again << " outputs made again; " << sources.size()
                     << " changed kernels compiled for sm_90");
}

#ifdef KILN_HAVE_CUDA
TEST_CASE("GPU: outputs made again by their readers match the CPU") {
  if (!test::have_gpu()) return;
  for (DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    // Within a sum's rounding: the GPU sums in another order.
    for (const Graph& g : {scaled_sums(dtype, false), masked_sums(dtype), chained(dtype)})
      test::check_gpu_matches_cpu(g, test::random_feeds(g, 11), 4 * test::dtype_tolerance(dtype));
  }
}
#endif

}  // namespace kiln
