// The CUDA backend's Program: it executes a lowered step (backends/lowering.h: streams, the
// memory plan in one device arena, in-place updates, the launch list), every launch
// prepared once with fixed pointers and, after a warm-up run, the whole step captured as a
// CUDA graph and replayed.
#pragma once

#include <memory>
#include <vector>

#include "backends/lowering.h"
#include "backends/program.h"

namespace kiln {

struct CudaOptions {
  bool graphs = true;  // capture the step as a CUDA graph after the first run
  bool tf32 = false;   // allow TF32 tensor-core math in cuBLAS GEMMs
  int streams = 4;     // 1: everything in order on one stream; N: backends/schedule's
  bool check_numerics =
      false;  // after each launch: synchronise and scan its outputs (slow; debugging)
  // Every kernel of kiln's CUDA backend is deterministic already (no atomics on values;
  // split reductions finish in order); this also forbids cuBLAS algorithms that use atomics.
  bool deterministic = false;
};

// The scratch each node's launch needs (a convolution's workspace; 0 for most), for
// lower_for_device to plan in the arena. It sets the process's TF32 switch to `tf32` first,
// as the program will run (the convolutions' paths, and so their scratch, depend on it).
std::vector<std::size_t> cuda_scratch_bytes(const Graph& compiled, bool tf32);

// `lowering` is lower_for_device(compiled, options.streams, ..., cuda_scratch_bytes(...)).
std::unique_ptr<Program> make_cuda_program(const Graph& compiled, const Lowering& lowering,
                                           const CudaOptions& options);

}  // namespace kiln
