// Which values the CPU program stores in oneDNN's 16-channel blocked layout (graph/op.h,
// kBlockedOutputs) instead of NCHW: those whose writer and every reader can take them so
// (oneDNN's convolution passes, fused groups over [B, C, H, W]: fusion/cpu_lanes.h), so that
// nothing reorders them between a convolution and its neighbours. Never a graph output nor an
// assignment's value; none in the reproducible mode (kiln's own convolutions) or with
// KILN_CPU_BLOCKED=0.
#pragma once

#include <cstdint>
#include <vector>

#include "graph/graph.h"

namespace kiln {

struct BlockedLayout {
  std::vector<std::vector<char>> stored;  // per node, per output: blocked
  std::vector<std::uint32_t> calls;       // per node: KernelCall::blocked, its blocked values
  std::uint32_t bits(std::size_t id) const { return calls.empty() ? 0 : calls[id]; }
  std::int64_t count() const;  // blocked values (an alias's output counted with its input's)
};

BlockedLayout blocked_layout(const Graph& g);

}  // namespace kiln
