// Renderings of a compiled graph for `dump`: plain text, Graphviz DOT with fused groups as
// clusters, and JSON (with the lowering: each launch's stream, events and buffers' arena
// offsets, the in-place updates), plus the fusion summary (ops before, kernels after, bytes saved).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "backends/lowering.h"
#include "core/precision.h"
#include "fusion/codegen.h"
#include "fusion/fuse.h"
#include "gpu/tuning_record.h"

namespace kiln::tools {

// What the GPU says of a compiled kernel (dump --device cuda).
struct KernelOccupancy {
  int registers = 0;
  std::size_t shared_bytes = 0;
  std::size_t spill_bytes = 0;  // local memory per thread
  int block = 0;
  double occupancy = 0;  // resident warps / the SM's maximum at that block size
};

// A node that is not a fused group and the hand-written CUDA kernels it launches (its op
// entry's sources for its input types and the view's precision; none in a build without CUDA).
struct HandWrittenLaunch {
  std::int32_t node = 0;
  std::string op;
  std::vector<std::string> kernels;
};

struct FusionView {
  Graph before;  // after dead-code elimination and constant folding, before fusion
  Graph after;   // after fusion
  FusionReport report;
  std::vector<CudaKernelSource> kernels;  // one per fused group, in report order
  Lowering lowering;  // backends/lowering of `after` on two streams, as compile() lowers it
  std::vector<KernelOccupancy> occupancy;       // per kernel, filled by add_occupancy
  std::vector<HandWrittenLaunch> hand_written;  // the other kernels' CUDA sources, by node
  std::vector<gpu::TuningRecord> tuning;        // the autotuned choices (add_occupancy), in order
};

// Compiles every fused kernel for the GPU present and records its resources and occupancy, and
// the autotuned choices of the hand-written kernels (timed when the view was lowered, or found
// in the kernel cache).
void add_occupancy(FusionView& view);

FusionView fuse_for_view(const Graph& recorded, Precision precision = Precision::fp32);

struct FusionSummary {
  int ops_before = 0;
  int kernels_after = 0;
  int fused_kernels = 0;
  std::int64_t bytes_saved = 0;
  // What the step's kernels read and write after fusion, each operand counted once per kernel
  // (a lower bound for GEMMs and convolutions, whose tiles may read an operand more than once):
  // in fused groups, and in the others (GEMMs, convolutions, pooling, layout).
  std::int64_t fused_bytes = 0, other_bytes = 0;
};
FusionSummary summarise(const FusionView& view);

std::string render_text(const FusionView& view, const std::string& title, bool with_source);
std::string render_dot(const FusionView& view, const std::string& title);
nlohmann::json render_json(const FusionView& view, bool with_source);

}  // namespace kiln::tools
