// Renderings of a compiled graph for `dump`: plain text, Graphviz DOT with fused groups as
// clusters, and JSON, plus the fusion summary (ops before, kernels after, bytes saved).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "fusion/codegen.h"
#include "fusion/fuse.h"

namespace kiln::tools {

struct FusionView {
  Graph before;  // after dead-code elimination, before fusion
  Graph after;   // after fusion
  FusionReport report;
  std::vector<CudaKernelSource> kernels;  // one per fused group, in report order
};

FusionView fuse_for_view(const Graph& recorded);

struct FusionSummary {
  int ops_before = 0;
  int kernels_after = 0;
  int fused_kernels = 0;
  std::int64_t bytes_saved = 0;
};
FusionSummary summarise(const FusionView& view);

std::string render_text(const FusionView& view, const std::string& title, bool with_source);
std::string render_dot(const FusionView& view, const std::string& title);
nlohmann::json render_json(const FusionView& view, bool with_source);

}  // namespace kiln::tools
