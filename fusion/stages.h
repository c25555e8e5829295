// stage_reductions: merges fused groups that read a reduction of another group over the same
// rows into it, so that a chain of dependent reductions and the elementwise work after them
// (softmax and the loss, batch norm's mean, variance and normalisation, the backward's sums
// and its input gradient) is one kernel that passes over each row once per stage.
//
// Pre: the output of fuse (fusion/fuse.h). Post: the graph computes the same values (within
// the reductions' reassociation: a staged reduction sums each row in order on the CPU); every
// output and assignment refers to the same value; no cycle.
//
// Merged, where the result's rows satisfy StageOptions: a group C into a group P (the same
// shape and register dtype, every reduction of both over the same axes, of which at most one
// run of adjacent axes is kept) where C reads P's outputs elementwise or P's reductions at
// the row's broadcast strides; and a group over P's reduced shape that reads P's reductions
// (batch norm's mean = sum / n, its scale), which becomes per-row code and row outputs. C's
// other inputs must not depend on P.
#pragma once

#include <cstdint>
#include <limits>

#include "graph/graph.h"

namespace kiln {

struct StageOptions {
  // A block (GPU) or a thread's stretch of rows (CPU) takes whole rows: a backend whose row
  // passes cost more than separate kernels past a length says so here.
  std::int64_t max_row_elements = std::numeric_limits<std::int64_t>::max();
  // Groups of fewer rows only when small: one row is one thread's (or block's) work.
  std::int64_t min_rows = 1;
  std::int64_t small_elements = 0;  // groups of at most this many elements take any row count
  // Rows past max_row_elements may still take row outputs where those are all that reads the
  // reductions (FusedGroup::rows_finish_only: computed by the reduction's finisher, not by a
  // pass over the row).
  bool finish_row_outputs = false;
};

// The policies of the two backends: rows of at most 1024 elements; on the CPU at least 8 rows
// or 2^16 elements (one thread takes a block of rows); on the GPU any number (a block a row),
// and row outputs on rows of any length (finish_row_outputs).
StageOptions cpu_stage_options();
StageOptions cuda_stage_options();

struct FusionReport;  // fusion/fuse.h: kept up to date with the merged groups when given
// KILN_STAGES=0 turns the pass off (the graph is returned as it is).
Graph stage_reductions(const Graph& fused, const StageOptions& options,
                       FusionReport* report = nullptr);

}  // namespace kiln
