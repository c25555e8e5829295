// rematerialize_outputs: a fused group's output that only groups over the same shape read (each
// as it is stored, element i at i) and whose instructions reach no reduction, only the group's
// inputs, constants and other stored outputs (its leaves), is made again in each of those
// readers instead, where the step moves fewer bytes so: the producer stops writing it and each
// reader stops loading it, against the leaves a reader does not load already. The candidates
// that save the most go first; one that loads a value taken before it, or that one taken loads,
// stays stored. ResNet's residual blocks: batch norm's backward sums group stores g and g times
// a per-channel scale; the group after it, which read the product, makes it from g, which the
// block before reads anyway; and batch norm's backward after a ReLU stores the masked gradient
// dy * (bn(y) > 0), which the next group, loading y anyway, makes from dy and y (resnet18 bf16
// b512: 10.86 -> 10.42 GB a step; the first case alone 11.05 -> 10.86). An output that stays
// stored (a graph output, or one with readers that cannot make it) is still made again by each
// reader that can and loads its leaves anyway but fewer bytes' worth than it: the downsampling
// blocks' backward sums make the block's output from its two convolutions' outputs (resnet18
// bf16 b512: 10.42 -> 10.36 GB; KILN_REMATERIALIZE_LOCAL=0 turns that part off).
//
// The recomputed instructions are the producer's, with their operands and dtypes, each rounded
// as the producer rounded it: the same bits (fusion/recompute.h does the same before fusion,
// but the staged groups that hold these outputs are made after it).
//
// Pre: the output of fuse (and stage_reductions and the passes after it). Post: verify holds;
// the same values; every output and assignment refers to the same value. Where `report` is
// given, its groups follow the new node ids. KILN_REMATERIALIZE=0 turns it off;
// KILN_REMATERIALIZE_INSTRS=N takes outputs of at most N instructions (32; 1 for measuring).
#pragma once

#include "graph/graph.h"

namespace kiln {

struct FusionReport;  // fusion/fuse.h
Graph rematerialize_outputs(const Graph& fused, FusionReport* report = nullptr);

}  // namespace kiln
