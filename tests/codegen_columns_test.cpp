// The column body of generated reductions with sibling sums and row outputs: batch norm's
// statistics over a [B, H, W, C] value stored channels-last (graph/passes/
// channels_last_values.h) keep C innermost, so a warp takes 32 adjacent channels of a row.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <memory>

#include "backends/compile.h"
#include "fusion/codegen.h"
#include "fusion/fuse.h"
#include "fusion/fused_group.h"
#include "fusion/stages.h"
#include "gpu/cuda_runtime.h"
#include "gpu/nvrtc_compiler.h"
#include "graph/passes/dead_code.h"
#include "tests/support.h"

namespace kiln {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Batch norm's statistics over y [B, H, W, C] in `dtype`: the sums of y - k and (y - k)^2 over
// all but the channels, k = y[0, 0, 0, c], and the per-channel mean, variance and scale made
// from them (row outputs of the sums' group).
Graph channel_statistics(const Shape& shape, DType dtype) {
  Graph g;
  const Value y = g.input("y", shape, dtype);
  const Value w = g.input("w", {1, 1, 1, shape[3]});
  const Value k = slice(slice(slice(detach(y), 0, 0, 1), 1, 0, 1), 2, 0, 1);
  const Value d = cast(y - k, DType::f32);
  const double n = static_cast<double>(shape[0] * shape[1] * shape[2]);
  const Value s1 = sum(d, {0, 1, 2}, true), s2 = sum(d * d, {0, 1, 2}, true);
  const Value mean = s1 * (1.0 / n);
  const Value var = s2 * (1.0 / n) - mean * mean;
  g.output("mean", mean + cast(k, DType::f32));
  g.output("var", var);
  g.output("scale", w / sqrt(var + 1e-5));
  return g;
}

std::shared_ptr<const FusedGroup> reduction_group(const Graph& fused) {
  std::shared_ptr<const FusedGroup> found;
  for (const Node& n : fused.nodes())
    if (auto group = std::dynamic_pointer_cast<const FusedGroup>(n.body);
        group && group->reduction) {
      REQUIRE(!found);
      found = group;
    }
  REQUIRE(found);
  return found;
}

}  // namespace

TEST_CASE("golden: channel statistics over [B, H, W, C] take the column body, rows finished") {
  {  // (only while the channels-last values are asked for, until run on a GPU)
    const Graph fused =
        stage_reductions(fuse(eliminate_dead_code(channel_statistics({32, 8, 8, 64}, DType::bf16))),
                         cuda_stage_options());
    CHECK(!contains(generate_cuda(*reduction_group(fused)).source, "(job / splits) * 32 + lane;"));
  }
  setenv("KILN_CHANNELS_LAST_VALUES", "1", 1);
  setenv("KILN_COLUMN_VECTORS", "0", 1);  // the scalar form; the vector form's case is below
  // As the GPU's policy groups them: the per-channel math becomes the sums' row outputs.
  const Graph fused =
      stage_reductions(fuse(eliminate_dead_code(channel_statistics({32, 8, 8, 64}, DType::bf16))),
                       cuda_stage_options());
  const std::shared_ptr<const FusedGroup> group = reduction_group(fused);
  CHECK(group->reductions().size() == 2);
  CHECK(!group->row_outputs.empty());
  const CudaKernelSource k = generate_cuda(*group);
  CAPTURE(k.source);
  // 2 tiles of 32 channels, the 2048 rows split, at least in two: the finisher computes the
  // row outputs once the sums are whole.
  CHECK(k.splits >= 2);
  CHECK(k.work_items == 2 * k.splits);
  CHECK(contains(k.source, "const long long o = (job / splits) * 32 + lane;"));
  CHECK(contains(k.source, "const long long i = r * n_out + o;"));
  CHECK(contains(k.source, "__shared__ T warp_acc1[32][33];"));
  CHECK(contains(k.source, "reduced1[o * splits + job % splits] = acc1;"));
  CHECK(k.finish_name == k.name + "_finish");
  CHECK(contains(k.source, "row_out0[o] = "));
#ifdef KILN_HAVE_CUDA
  CHECK(gpu::compile_to_cubin({k.name, k.source, {}}, {.sm = 90}).size() > 4);
#endif
  unsetenv("KILN_COLUMN_VECTORS");
  unsetenv("KILN_CHANNELS_LAST_VALUES");
}

TEST_CASE("golden: the column body's vector form takes 8 channels a lane, 16-byte loads") {
  setenv("KILN_CHANNELS_LAST_VALUES", "1", 1);
  struct Case {
    Shape shape;
    DType dtype;
    int lanes, groups;
  };
  // 64 bf16 channels: a tile of 8 lanes x 8 channels, 4 rows a warp; 40: 5 tiles of one lane's
  // 8, 32 rows a warp; f32: float4s, 16 lanes x 4 channels.
  for (const Case& c :
       {Case{{32, 8, 8, 64}, DType::bf16, 8, 8}, Case{{32, 8, 8, 40}, DType::bf16, 8, 1},
        Case{{32, 8, 8, 64}, DType::f32, 4, 16}}) {
    CAPTURE(c.shape.str());
    CAPTURE(dtype_name(c.dtype));
    const Graph fused = stage_reductions(
        fuse(eliminate_dead_code(channel_statistics(c.shape, c.dtype))), cuda_stage_options());
    const CudaKernelSource k = generate_cuda(*reduction_group(fused));
    CAPTURE(k.source);
    const int tile = c.lanes * c.groups;
    CHECK(k.work_items == c.shape[3] / tile * k.splits);
    CHECK(contains(k.source, fmt::format("__shared__ T warp_acc[32][{}];", tile)));
    CHECK(
        contains(k.source, fmt::format("group = lane % {0}u, row_lane = lane / {0}u;", c.groups)));
    CHECK(contains(k.source, fmt::format("const long long c = (job / splits) * {} + group * {};",
                                         tile, c.lanes)));
    CHECK(contains(k.source, fmt::format("T acc1[{}];", c.lanes)));
    CHECK(contains(k.source, c.dtype == DType::bf16 ? "reinterpret_cast<const uint4*>"
                                                    : "reinterpret_cast<const float4*>"));
    CHECK(contains(k.source, "__shfl_xor_sync") == (c.groups < 32));
    CHECK(contains(k.source, "} else {"));  // the scalar loop for operands not 16-byte aligned
    CHECK(contains(k.source, "row_out0[o] = "));
#ifdef KILN_HAVE_CUDA
    CHECK(gpu::compile_to_cubin({k.name, k.source, {}}, {.sm = 90}).size() > 4);
#endif
  }
  unsetenv("KILN_CHANNELS_LAST_VALUES");
}

TEST_CASE("GPU: channel statistics over [B, H, W, C] in the column body match the CPU") {
  if (!test::have_gpu()) return;
  setenv("KILN_CHANNELS_LAST_VALUES", "1", 1);  // the column body (and the row body, after)
  for (const char* vectors : {"0", "1"})
    for (DType dtype : {DType::f32, DType::bf16}) {
      setenv("KILN_COLUMN_VECTORS", vectors, 1);
      CAPTURE(vectors);
      CAPTURE(dtype_name(dtype));
      for (const Shape& shape : {Shape{32, 8, 8, 64}, Shape{7, 9, 11, 40}, Shape{64, 4, 4, 512},
                                 Shape{9, 8, 8, 24}, Shape{4, 16, 16, 96}}) {
        CAPTURE(shape.str());
        const Graph g = channel_statistics(shape, dtype);
        const std::vector<Feed> feeds = test::random_feeds(g, 3);
        const Outputs gpu = compile(g, {.device = Device::cuda()})->run(feeds);
        const Outputs cpu = compile(g)->run(feeds);
        for (const auto& [name, tensor] : cpu) {
          CAPTURE(name);
          CHECK(test::closeness(gpu.at(name), tensor, 1e-4, 1e-3) <= 1.0);
        }
      }
    }
  unsetenv("KILN_COLUMN_VECTORS");
  unsetenv("KILN_CHANNELS_LAST_VALUES");
}

}  // namespace kiln
