// fold_channels_last_outputs: a transpose of a fused group's output to channels-last
// ([B, C, H, W] -> [B, H, W, C], perm kChannelsLast; the layout pass's copy of an image or a dy
// for the GPU's tensor-core convolutions, graph/passes/channels_last.h) joins that group: the
// group stores the value channels-last itself (FusedGroup::channels_last), through a tile in
// shared memory on the GPU (fusion/codegen_channels_last.cpp), and stores the [B, C, H, W] value
// only where something else still reads it. Batch norm's backward writes dy straight into the
// layout the input and weight gradients read, so that copy's read and write and its launch are
// gone; its forward's ReLU output is written in both layouts, saving the copy's read.
//
// Only groups without reductions take it (their elements in any order), over 4-D shapes, and (the
// GPU's policy) only where the kernel takes its vector form: 16-bit values whose channels and
// planes are multiples of 8 (a 14 x 14 plane keeps the convolutions' own copy, which is faster
// than one element a thread); `any_shape` folds every such transpose (for tests of the other form).
//
// A dy copy (a transpose to channels-last read only by input and weight gradients, as their dy)
// that does not fold is undone: they read the [B, C, H, W] dy again, unmarked.
//
// Pre: the output of fuse (and stage_reductions, fuse_gemm_epilogues). Post: verify holds; the
// same values, bit for bit; every output and assignment refers to the same value. Where
// `report` is given, its groups follow the new node ids. KILN_CHANNELS_LAST_OUTPUTS=0 turns it
// off.
#pragma once

#include "graph/graph.h"

namespace kiln {

struct FusionReport;  // fusion/fuse.h
Graph fold_channels_last_outputs(const Graph& fused, FusionReport* report = nullptr,
                                 bool any_shape = false);

}  // namespace kiln
