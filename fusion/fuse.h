// fuse: replaces maximal connected sets of elementwise ops that share one iteration shape
// with "fused" nodes, each carrying a FusedGroup (fusion/fused_group.h).
//
// Pre: verify(g) holds. Post: verify holds; the graph computes the same values; every
// output and assignment refers to the same value as before (now possibly a fused node's
// output); no group depends on itself through a node outside it (no cycles).
//
// What is fused: elementwise ops (including broadcast_to and cast) whose producer in the group
// has the same shape and computes in the same register dtype (f64 groups alone; f32, bf16 and
// f16 values together, loaded widened to f32 and rounded where stored); scalar fills are folded
// into the code as literals; a value used inside and outside a group is computed once and becomes a
// group output; one reduce_sum or reduce_max of a group value joins the group as its tail. A group
// reads a slice (or a chain of slices) in place from the sliced value, at its strides and an
// offset: the four gates of an LSTM's one GEMM output cost no copies. (The sliced value is never in
// the reading group: the slice node lies between them, so joining would be a cycle.) What is not,
// and why: matmul, conv and pooling (they go to GEMM libraries or their own kernels; epilogue
// fusion into them is future work); a producer of a smaller shape than its consumer (fusing it
// would recompute it once per broadcast element; it stays a separate group whose output is read at
// broadcast strides); a second reduction, or ops after a reduction (another iteration space); views
// (reshape, detach) stay zero-cost aliases outside groups; non-floating values.
#pragma once

#include <map>
#include <vector>

#include "graph/graph.h"

namespace kiln {

// Which nodes of the input graph each fused node was made of (for dump and tests).
struct FusionReport {
  struct Group {
    std::vector<std::int32_t> members;  // node ids in the input graph, the reduction tail last
    std::int32_t fused_node = -1;       // its node id in the output graph
  };
  std::vector<Group> groups;
};

struct FuseOptions {
  // Every elementwise op (and reduction) becomes a group of its own: the unfused baseline on
  // backends that run elementwise math only as generated kernels.
  bool single_ops = false;
};

Graph fuse(const Graph& g, FusionReport* report = nullptr, const FuseOptions& options = {});

// The end of a pass that copies a fused graph node by node (fusion/channels_last_outputs.h,
// fusion/rematerialize.h): `from`'s outputs and assignments set in `out` through `remap`, and
// the report's groups (where given) moved to their nodes' new ids.
void finish_copy(const Graph& from, Graph& out, const std::map<ValueRef, ValueRef>& remap,
                 const std::vector<int>& new_id, FusionReport* report);

// Each node's group as fuse(g) forms it (groups numbered from 0; -1 for a node in none), for
// passes that plan around the groups (fusion/recompute.h).
std::vector<std::int32_t> fusion_groups(const Graph& g);

}  // namespace kiln
