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

// A global average pool over y [B, H, W, C] after a batch norm's scale, shift and ReLU (a
// ResNet's last block, channels-last): per (b, c) the mean over H W rows of C columns.
Graph pooled_columns(const Shape& shape, DType dtype) {
  Graph g;
  const Value y = g.input("y", shape, dtype);
  const Value scale = g.input("scale", {1, 1, 1, shape[3]});
  const Value shift = g.input("shift", {1, 1, 1, shape[3]});
  const Value a = relu(cast(y, DType::f32) * scale + shift);
  g.output("pooled", sum(a, {1, 2}) * (1.0 / static_cast<double>(shape[1] * shape[2])));
  return g;
}

// Batch norm's backward terms over y, dy [B, H, W, C]: five per-channel values read in every
// row (hoisted: 40 registers at 8 lanes), the input gradient stored and two sums taken.
Graph gradient_columns(const Shape& shape, DType dtype) {
  Graph g;
  const Value y = g.input("y", shape, dtype), dy = g.input("dy", shape, dtype);
  const Shape per{1, 1, 1, shape[3]};
  const Value mean = g.input("mean", per), scale = g.input("scale", per);
  const Value a = g.input("a", per), b = g.input("b", per), c = g.input("c", per);
  const Value yhat = (cast(y, DType::f32) - mean) * scale + c;
  const Value d = cast(dy, DType::f32) * a + b;
  g.output("dx", cast(d - yhat * c, dtype));
  g.output("sum_d", sum(d, {0, 1, 2}, true));
  g.output("sum_dyhat", sum(d * yhat, {0, 1, 2}, true));
  return g;
}

}  // namespace

TEST_CASE("golden: a 16-bit column body that hoists many per-channel inputs takes 4 lanes") {
  setenv("KILN_CHANNELS_LAST_VALUES", "1", 1);
  const Graph fused =
      stage_reductions(fuse(eliminate_dead_code(gradient_columns({64, 16, 16, 64}, DType::bf16))),
                       cuda_stage_options());
  struct Case {
    const char* lanes;  // KILN_COLUMN_LANES
    int expected;
  };
  for (const Case& c : {Case{"", 4}, Case{"8", 8}, Case{"4", 4}}) {
    setenv("KILN_COLUMN_LANES", c.lanes, 1);
    CAPTURE(c.lanes);
    const CudaKernelSource k = generate_cuda(*reduction_group(fused));
    CAPTURE(k.source);
    // 64 channels a tile: 16 groups of 4 lanes (2 rows a warp) or 8 of 8 (4 rows).
    CHECK(contains(k.source, fmt::format("T acc[{}];", c.expected)));
    CHECK(contains(k.source,
                   fmt::format("group = lane % {0}u, row_lane = lane / {0}u;", 64 / c.expected)));
    CHECK(contains(k.source, c.expected == 4 ? "reinterpret_cast<const uint2*>"
                                             : "reinterpret_cast<const uint4*>"));
#ifdef KILN_HAVE_CUDA
    CHECK(gpu::compile_to_cubin({k.name, k.source, {}}, {.sm = 90}).size() > 4);
#endif
  }
  setenv("KILN_COLUMN_LANES", "6", 1);
  CHECK_THROWS_WITH_AS(generate_cuda(*reduction_group(fused)),
                       doctest::Contains("KILN_COLUMN_LANES='6': expected 4 or 8"), Error);
  unsetenv("KILN_COLUMN_LANES");
  {  // without hoisting, the per-channel values are loaded every row: 8 lanes
    setenv("KILN_COLUMN_HOIST", "0", 1);
    CHECK(contains(generate_cuda(*reduction_group(fused)).source, "T acc[8];"));
    unsetenv("KILN_COLUMN_HOIST");
  }
  unsetenv("KILN_CHANNELS_LAST_VALUES");
}

TEST_CASE("GPU: a column body at 4 lanes and at 8 matches the CPU") {
  if (!test::have_gpu()) return;
  setenv("KILN_CHANNELS_LAST_VALUES", "1", 1);
  for (const char* lanes : {"4", "8"}) {
    setenv("KILN_COLUMN_LANES", lanes, 1);
    CAPTURE(lanes);
    // A stage-1 shape, channels of one tile and of a part tile, odd rows, one row.
    for (const Shape& shape :
         {Shape{64, 32, 32, 64}, Shape{7, 9, 11, 40}, Shape{3, 5, 5, 128}, Shape{1, 1, 1, 64}}) {
      CAPTURE(shape.str());
      const Graph g = gradient_columns(shape, DType::bf16);
      const std::vector<Feed> feeds = test::random_feeds(g, 11);
      const Outputs gpu = compile(g, {.device = Device::cuda()})->run(feeds);
      const Outputs cpu = compile(g)->run(feeds);
      for (const auto& [name, tensor] : cpu) {
        CAPTURE(name);
        CHECK(test::closeness(gpu.at(name), tensor, 1e-4, 1e-2) <= 1.0);
      }
    }
  }
  unsetenv("KILN_COLUMN_LANES");
  unsetenv("KILN_CHANNELS_LAST_VALUES");
}

TEST_CASE("golden: a global average pool over [B, H, W, C] takes the column body, a job a b") {
  struct Case {
    Shape shape;
    const char* values;  // KILN_CHANNELS_LAST_VALUES: the vector form with them
    std::int64_t splits;
    int block;
  };
  // [64, 4, 4, 512]: 64 x 8 tiles of 64 columns, 16 rows of a tile each (4 a warp: 4 warps);
  // the scalar form 64 x 16 tiles of 32, a row a warp (8 warps); 40 columns: 2 tiles of 32.
  for (const Case& c : {Case{{64, 4, 4, 512}, "1", 1, 128}, Case{{64, 4, 4, 512}, "0", 1, 256},
                        Case{{3, 5, 7, 40}, "0", 1, 256}}) {
    setenv("KILN_CHANNELS_LAST_VALUES", c.values, 1);
    CAPTURE(c.shape.str());
    CAPTURE(c.values);
    const Graph fused = stage_reductions(
        fuse(eliminate_dead_code(pooled_columns(c.shape, DType::bf16))), cuda_stage_options());
    const CudaKernelSource k = generate_cuda(*reduction_group(fused));
    CAPTURE(k.source);
    CHECK(k.splits == c.splits);
    CHECK(k.block_threads == c.block);
    const std::int64_t tile = std::string(c.values) == "1" ? 64 : 32;
    CHECK(k.work_items == c.shape[0] * ((c.shape[3] + tile - 1) / tile) * k.splits);
    CHECK(contains(k.source, fmt::format("job < {}LL * tiles * splits;", c.shape[0])));
    CHECK(
        contains(k.source, fmt::format("const long long n_red = {}LL;", c.shape[1] * c.shape[2])));
    CHECK(contains(k.source, "const long long first = b * n_red * n_out;"));
    CHECK(contains(k.source, "const long long i = first + r * n_out + c"));
#ifdef KILN_HAVE_CUDA
    CHECK(gpu::compile_to_cubin({k.name, k.source, {}}, {.sm = 90}).size() > 4);
#endif
  }
  unsetenv("KILN_CHANNELS_LAST_VALUES");
}

TEST_CASE("golden: a column body's 1024 splits are finished a block an output") {
  setenv("KILN_CHANNELS_LAST_VALUES", "1", 1);
  const Graph fused = stage_reductions(
      fuse(eliminate_dead_code(channel_statistics({512, 32, 32, 64}, DType::bf16))),
      cuda_stage_options());
  const CudaKernelSource k = generate_cuda(*reduction_group(fused));
  CAPTURE(k.source);
  CHECK(k.splits == 1024);  // 524288 rows of one tile of 64 channels in splits of 512 rows
  CHECK(k.block_threads == 256);
  CHECK(contains(k.source, "#pragma unroll 4"));  // one input streams: four rows in flight
  // k = y[0, 0, 0, c], the same in every row: loaded once a job, before the rows.
  const std::size_t hoisted = k.source.find("((first + c) % 64LL)");
  CHECK(hoisted < k.source.find("#pragma unroll 4"));
  const std::size_t rows = k.source.find("#pragma unroll 4");
  CHECK(k.source.substr(rows, k.source.find("} else {", rows) - rows).find("(i % 64LL)") ==
        std::string::npos);  // (the scalar loop, for unaligned operands, loads it every row)
  setenv("KILN_COLUMN_HOIST", "0", 1);  // every row, for measuring
  const CudaKernelSource every_row = generate_cuda(*reduction_group(fused));
  const std::size_t loop = every_row.source.find("#pragma unroll 4");
  CHECK(every_row.source.find("((first + c) % 64LL)") == std::string::npos);
  CHECK(every_row.source.find("(i % 64LL)", loop) < every_row.source.find("} else {", loop));
  unsetenv("KILN_COLUMN_HOIST");
  CHECK(k.finish_threads == 256);
  CHECK(contains(k.source, "for (long long o = blockIdx.x; o < n_out; o += gridDim.x) {"));
  // The launch picks the splits (at most 1024) to fill the resident blocks once: the main
  // kernel reads them from its grid, the finisher from its second parameter.
  CHECK(k.split_jobs == 1);
  CHECK(contains(k.source,
                 "const long long splits = (long long)gridDim.x / (1LL * tiles);  // <= "
                 "1024"));
  CHECK(
      contains(k.source, k.finish_name + "(const T* __restrict__ partial, const long long splits"));
  CHECK(contains(k.source,
                 "for (long long c = threadIdx.x; c < splits; c += 256) { const T v = (partial + "
                 "1LL * n_out * 1024LL)[o * splits + c]; acc1 = (acc1 + v); }"));
  CHECK(contains(k.source, "for (int w = 1; w < 8; ++w) acc1 = (acc1 + warp_acc1[w]);"));
  CHECK(contains(k.source, "if (threadIdx.x == 0u) reduced1[o] = acc1;"));
#ifdef KILN_HAVE_CUDA
  CHECK(gpu::compile_to_cubin({k.name, k.source, {}}, {.sm = 90}).size() > 4);
#endif
  unsetenv("KILN_CHANNELS_LAST_VALUES");
}

TEST_CASE("golden: channel statistics over [B, H, W, C] take the column body, rows finished") {
  {  // (only while the channels-last values are asked for, until run on a GPU)
    const Graph fused =
        stage_reductions(fuse(eliminate_dead_code(channel_statistics({32, 8, 8, 64}, DType::bf16))),
                         cuda_stage_options());
    CHECK(!contains(generate_cuda(*reduction_group(fused)).source, "const long long tiles ="));
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
  CHECK(contains(k.source, "const long long c = tile * 32 + lane, o = b * n_out + c;"));
  CHECK(contains(k.source, "const long long i = first + r * n_out + c;"));
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
    CHECK(contains(k.source,
                   fmt::format("const long long c = tile * {} + group * {};", tile, c.lanes)));
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
      // ([64, 32, 32, 64]: 1024 splits, finished a block an output.)
      for (const Shape& shape : {Shape{32, 8, 8, 64}, Shape{7, 9, 11, 40}, Shape{64, 4, 4, 512},
                                 Shape{9, 8, 8, 24}, Shape{4, 16, 16, 96}, Shape{64, 32, 32, 64}}) {
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

TEST_CASE("GPU: a global average pool over [B, H, W, C] in the column body matches the CPU") {
  if (!test::have_gpu()) return;
  for (const char* values : {"0", "1"})
    for (DType dtype : {DType::f32, DType::bf16}) {
      setenv("KILN_CHANNELS_LAST_VALUES", values, 1);  // "1": the vector form where it fits
      CAPTURE(values);
      CAPTURE(dtype_name(dtype));
      // A ResNet's last block; odd rows and columns; a partial tile; 1 row of 2 x 1; many b.
      for (const Shape& shape : {Shape{64, 4, 4, 512}, Shape{3, 5, 7, 40}, Shape{5, 3, 3, 36},
                                 Shape{2, 2, 1, 64}, Shape{1000, 2, 2, 96}}) {
        CAPTURE(shape.str());
        const Graph g = pooled_columns(shape, dtype);
        const std::vector<Feed> feeds = test::random_feeds(g, 5);
        const Outputs gpu = compile(g, {.device = Device::cuda()})->run(feeds);
        const Outputs cpu = compile(g)->run(feeds);
        CHECK(test::closeness(gpu.at("pooled"), cpu.at("pooled"), 1e-4, 1e-3) <= 1.0);
      }
    }
  unsetenv("KILN_CHANNELS_LAST_VALUES");
}

}  // namespace kiln
