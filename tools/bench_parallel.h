// bench --gpus N (--ranks N on the CPU): the data-parallel training step on N ranks of this
// host, timed beside the one-rank step, and the scaling efficiency between them.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "backends/compile.h"

namespace kiln::tools {

struct ScalingRun {
  int ranks = 2;
  std::string model;
  std::int64_t batch = 64;         // per rank
  std::int64_t items = 64;         // examples (an LM: characters) of one rank's step
  std::int64_t bucket_kib = 4096;  // gradients per all-reduce
  bool sync_batch_norm = false;    // batch norm's statistics over the ranks (--sync-batch-norm)
  int warmup = 5, steps = 50;
  CompileOptions options;
};

// Launches the ranks (this executable) and returns rank 0's figures for the N-rank step,
// with the global throughput and "scaling_efficiency" = N-rank throughput / (N x one-rank
// throughput), from `one_rank` (bench's result for the plain step at the same batch).
nlohmann::json bench_scaling(const ScalingRun& run, const nlohmann::json& one_rank);

// One rank of a scaling run (what bench_scaling starts): joins the job, times the
// data-parallel step; rank 0 writes its figures as JSON to `json_path`. Returns the exit code.
int bench_rank(const ScalingRun& run, int rank, int world_size, const std::string& init,
               const std::string& json_path);

}  // namespace kiln::tools
