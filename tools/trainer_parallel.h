// The trainer's launcher: --gpus N / --ranks N start N ranks on this host; --rank,
// --world-size and --init make this process one rank of a job that may span several hosts.
#pragma once

#include <optional>

#include "train/config.h"

namespace kiln::tools {

// Checks the data-parallel flags together; when they ask for ranks on this host (and this
// process is not itself a rank), runs them and returns the job's exit code; nullopt: train
// in this process.
std::optional<int> launch_ranks_if_asked(const TrainConfig& config, int argc, char** argv);

}  // namespace kiln::tools
