// The trainer's data-parallel flags: --gpus N / --ranks N start N ranks on this host (the
// launcher); --rank, --world-size and --init make this process one rank of a job that may
// span several hosts.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>

#include "train/train.h"

namespace kiln::tools {

struct ParallelArgs {
  int gpus = 0;   // > 0: launch this many ranks, one GPU each
  int ranks = 0;  // > 0: launch this many ranks on --device (the CPU: gradients averaged over TCP)
  double init_timeout_s = 60;
};

void add_parallel_options(CLI::App& app, TrainConfig& config, ParallelArgs& args);

// Checks the flags together; when they ask for ranks on this host (and this process is not
// itself a rank), runs them and returns the job's exit code; nullopt: train in this process.
std::optional<int> launch_ranks_if_asked(const ParallelArgs& args, TrainConfig& config, int argc,
                                         char** argv);

}  // namespace kiln::tools
