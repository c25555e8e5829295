// CUDA C generation for fused groups. The kernel's parameters are the group's inputs
// (const T*), then its full-shape outputs (T*), then the reduction output (T*) if any;
// shapes and strides are compile-time constants in the source.
#pragma once

#include <string>
#include <vector>

#include "fusion/fused_group.h"

namespace kiln {

struct CudaKernelSource {
  std::string name;    // extern "C" symbol: "kiln_" + a hash of the source
  std::string source;  // a complete CUDA C translation unit, no includes
  bool reduction = false;
  std::int64_t work_items = 0;  // elements (elementwise) or reduction jobs (outputs x splits; tiles
                                // of 32 outputs x splits for columns)
  int vector_width = 1;         // f32 groups: 4 (float4); 16-bit groups: 8 or 4; 1: no vector path
  // A reduction with few outputs over many elements is split: `name` writes reduced_outputs x
  // splits partial results (its last parameters are then scratch buffers of that many values, one
  // per reduction) and `finish_name` (partial, reduced...; a warp an output) combines each
  // output's partials in a fixed order, reduction r's at partial + r * reduced_outputs * splits.
  std::int64_t splits = 1;
  std::int64_t reduced_outputs = 0;
  // The parameters (and node outputs) after the elementwise outputs: `reductions` reduced values,
  // then `row_outputs` row outputs (fusion/fused_group.h). Where a split group has row outputs,
  // its finisher computes them: (partial, reduced..., inputs..., row outputs...).
  int reductions = 0;
  int row_outputs = 0;
  bool warp_jobs = false;  // staged groups: a warp per work item (row), not a block
  // Column bodies: the threads a block that a job's rows keep busy (64 to 256), taken where
  // that keeps the occupancy-best threads an SM, and a block a job (the grid is the jobs); 0:
  // the occupancy-best block, and the grid at most the resident blocks.
  int block_threads = 0;
  bool block_forced = false;  // block_threads whatever the occupancy (KILN_REDUCTION_THREADS)
  int finish_threads = 32;    // the finisher's threads an output: a warp, or a block of 256
  // Split column bodies: the launch picks the splits (1 to `splits`, for which the partials are
  // allocated) to fill the resident blocks once, the grid is split_jobs x those splits, the
  // main kernel reads them from gridDim and the finisher from its second parameter. 0: the
  // splits are the source's.
  std::int64_t split_jobs = 0;
  std::string finish_name;  // empty when splits == 1 or finish_in_kernel
  // A split row-by-row reduction whose last block to finish an output's split combines its
  // partials (KILN_LAST_BLOCK_FINISH=1; no finisher launch): after the row outputs come
  // (unsigned* arrivals, one zeroed counter an output that the last block sets back to 0, then
  // the reduced outputs, one pointer a reduction).
  bool finish_in_kernel = false;
};

CudaKernelSource generate_cuda(const FusedGroup& group);

// A horizontal launch (backends/horizontal.h): groups of `group`'s kind (every input read
// contiguously or as one element, no reduction) as segments of one kernel, whose parameters are
// (const long long* table, int segments). The table holds per segment, in order, 3 + inputs +
// outputs 8-byte words: its element count, its first tile, whether it takes the vector path
// (horizontal_segment_vectorized), then the device pointers of its inputs (offsets applied)
// and outputs. Block b computes tile b - first tile (kHorizontalTile elements) of the last
// segment whose first tile is at most b with the lines of generate_cuda's kernel for that
// segment (its vector path where that kernel would take it, else its scalar loop), so that the
// compiler makes the same instructions and the results are the same bits. Sizes are not in
// the source.
inline constexpr std::int64_t kHorizontalTile = 2048;
CudaKernelSource generate_cuda_horizontal(const FusedGroup& group);
bool horizontal_segment_vectorized(const FusedGroup& group, const std::vector<const void*>& inputs,
                                   const std::vector<void*>& outputs);

}  // namespace kiln
