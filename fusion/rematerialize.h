// rematerialize_outputs: a fused group's output that is one instruction of what the group stores
// anyway (its other outputs), its inputs and constants, and that only groups over the same shape
// read (each as it is stored, element i at i), is made again in each of those readers instead:
// the producer writes one value fewer and the reader loads the stored operands instead (the same
// bytes where they replace one value of that size; none where it loads them already). ResNet's
// residual blocks: batch norm's backward sums group stores g and g times a per-channel scale;
// the group after it, which read the product, makes it from g, which the block before reads
// anyway (resnet18 bf16 b512: 184 MB fewer written a step).
//
// The recomputed instruction has the same operands and dtype, rounded where it is stored as the
// producer rounded it: the same bits (fusion/recompute.h does the same before fusion, but the
// staged groups that hold these outputs are made after it).
//
// Pre: the output of fuse (and stage_reductions and the passes after it). Post: verify holds;
// the same values; every output and assignment refers to the same value. Where `report` is
// given, its groups follow the new node ids. KILN_REMATERIALIZE=0 turns it off.
#pragma once

#include "graph/graph.h"

namespace kiln {

struct FusionReport;  // fusion/fuse.h
Graph rematerialize_outputs(const Graph& fused, FusionReport* report = nullptr);

}  // namespace kiln
