// --gpus / --ranks run the same command line N times through dist::launch_local, with the
// launcher's flags replaced by each rank's --rank/--world-size/--init.
#include "tools/trainer_parallel.h"

#include <fmt/format.h>

#include <chrono>

#include "core/error.h"
#include "distributed/launch.h"

namespace kiln::tools {
namespace {

// argv without the launcher's own flags (as "--gpus 2" or "--gpus=2").
std::vector<std::string> rank_arguments(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--gpus" || arg == "--ranks") {
      ++i;  // and its value
      continue;
    }
    if (arg.rfind("--gpus=", 0) == 0 || arg.rfind("--ranks=", 0) == 0) continue;
    args.push_back(arg);
  }
  return args;
}

}  // namespace

std::optional<int> launch_ranks_if_asked(const TrainConfig& config, int argc, char** argv) {
  const ParallelSettings& args = config.parallel;
  KILN_CHECK(args.gpus == 0 || args.ranks == 0, "--gpus and --ranks: give one of them");
  const int local = std::max(args.gpus, args.ranks);
  KILN_CHECK(local == 0 || args.world_size == 1,
             "--{} starts its own ranks: --world-size and --rank are for one rank of a job",
             args.gpus > 0 ? "gpus" : "ranks");
  KILN_CHECK(args.rank < args.world_size, "--rank {} is not a rank of --world-size {}", args.rank,
             args.world_size);
  KILN_CHECK(config.lm.sample == 0 || (local <= 1 && args.world_size == 1),
             "--sample runs on one process");
  if (local <= 1) return std::nullopt;  // one rank on this host is just this process
  std::vector<std::string> rank_args = rank_arguments(argc, argv);
  if (args.gpus > 0) rank_args.insert(rank_args.end(), {"--device", "cuda"});
  fmt::print("kiln trainer: starting {} ranks on this host{}\n", local,
             args.gpus > 0 ? ", one GPU each" : "");
  std::fflush(stdout);
  return dist::launch_local(
      dist::self_executable(), rank_args,
      {.world_size = local,
       .one_gpu_per_rank = args.gpus > 0,
       .grace = std::chrono::milliseconds(static_cast<std::int64_t>(args.init_timeout * 1000))});
}

}  // namespace kiln::tools
