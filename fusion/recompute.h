// recompute_in_readers: a value that a fused group would store only for groups that read it
// later (the backward reading the forward's x - mean) is made again inside each of those
// groups from values that are stored anyway, and never written.
//
// A node's value is recomputed when (1) the node is elementwise and in a group
// (fusion_groups), (2) no node outside the groups, graph output or assignment reads it (those
// keep it stored whatever happens), and (3) its inputs are constants, values of fewer
// elements (per-channel statistics, read at broadcast strides), and at most one value of its
// own size, which is either stored anyway (made outside the groups: a convolution's or GEMM's
// output, a graph input; or read by such a node) or itself recomputed by this rule (a chain of
// up to 4 nodes). The nodes of another group that read it then read a copy of its chain, one
// per group, placed just before the first of them, which the fuse pass puts into that group: it
// loads the stored value of the same size (as many elements, often fewer bytes: a bf16
// convolution output against an f32 value) and the producing group writes one value fewer.
// Readers in the value's own group keep the original.
//
// relu's mask in the backward, greater(relu(x), 0), in another group than the relu and where x
// can be made again by that rule (from a stored value of its size, batch norm's per-channel
// values and constants), reads a copy of x's chain instead of relu(x): the same mask (x > 0
// exactly where relu(x) > 0, but for an x so small that its storage dtype rounds relu(x) to
// zero), and relu(x), stored for a convolution, need not live until the backward (nor be read
// there again).
//
// Pre: verify(g) holds. Post: verify holds; the same values, except where a recomputed value
// was stored in a narrower dtype than its group computes in (its readers now see it unrounded)
// or where the CUDA compiler contracts the recomputed multiply and a reader's add into one
// FMA. Run it before fuse (backends' simplify_for_fusion does); dead originals are left to
// eliminate_dead_code.
#pragma once

#include "graph/graph.h"

namespace kiln {

Graph recompute_in_readers(const Graph& g);

}  // namespace kiln
