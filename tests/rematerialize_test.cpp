// rematerialize_outputs (fusion/rematerialize.h): an output made again by its readers from what
// its group stores anyway, the same bits on the CPU and (through compile) the GPU.
#include <doctest/doctest.h>

#include <cstdlib>

#include "backends/compile.h"
#include "fusion/fuse.h"
#include "fusion/fused_group.h"
#include "fusion/rematerialize.h"
#include "graph/ops.h"
#include "graph/passes/dead_code.h"
#include "graph/passes/verify.h"
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
      const std::vector<Feed> feeds = test::random_feeds(g, 3);
      const Outputs want = test::run_once(g, feeds), got = test::run_once(remade, feeds);
      for (const auto& [name, tensor] : want) {
        CAPTURE(name);
        std::int64_t differ = 0;
        for (std::int64_t i = 0; i < tensor.numel(); ++i)
          differ += got.at(name).at(i) != tensor.at(i);
        CHECK(differ == 0);
      }
      setenv("KILN_REMATERIALIZE", "0", 1);
      CHECK(full_outputs(rematerialize_outputs(fused)) == full_outputs(fused));
      unsetenv("KILN_REMATERIALIZE");
    }
}

#ifdef KILN_HAVE_CUDA
TEST_CASE("GPU: an output made again by its reader matches the CPU") {
  if (!test::have_gpu()) return;
  for (DType dtype : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dtype));
    const Graph g = scaled_sums(dtype, false);
    // Within a sum's rounding: the GPU sums in another order.
    test::check_gpu_matches_cpu(g, test::random_feeds(g, 11), 4 * test::dtype_tolerance(dtype));
  }
}
#endif

}  // namespace kiln
