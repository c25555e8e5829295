// --gpus / --ranks run the same command line N times through dist::launch_local, with the
// launcher's flags replaced by each rank's --rank/--world-size/--init.
#include "tools/trainer_parallel.h"

#include <fmt/format.h>

#include <chrono>

#include "core/error.h"
#include "distributed/launch.h"
#include "models/registry.h"

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

void add_parallel_options(CLI::App& app, TrainConfig& config, ParallelArgs& args) {
  app.add_option("--gpus", args.gpus,
                 "data parallel: train on N GPUs of this host, one process each (NCCL)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--ranks", args.ranks,
                 "data parallel: N processes on this host on --device (the CPU averages over TCP)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--rank", config.rank,
                 "data parallel: this process's rank in a job of --world-size")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--world-size", config.world_size,
                 "data parallel: processes in the job (all hosts)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--init", config.init,
                 "data parallel: HOST:PORT where rank 0 listens for the others")
      ->capture_default_str();
  app.add_option("--init-timeout", args.init_timeout_s,
                 "data parallel: seconds to wait for the other ranks (and for a silent rank)")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
  app.add_option("--bucket-kib", config.bucket_kib,
                 "data parallel: KiB of gradients per all-reduce")
      ->check(CLI::Range(1, 1 << 22))
      ->capture_default_str();
  app.add_option("--check-replicas", config.check_replicas,
                 "data parallel: compare every variable across the ranks every K steps")
      ->check(CLI::NonNegativeNumber);
}

std::optional<int> launch_ranks_if_asked(const ParallelArgs& args, TrainConfig& config, int argc,
                                         char** argv) {
  config.init_timeout_ms = static_cast<std::int64_t>(args.init_timeout_s * 1000);
  KILN_CHECK(args.gpus == 0 || args.ranks == 0, "--gpus and --ranks: give one of them");
  const int local = std::max(args.gpus, args.ranks);
  KILN_CHECK(local == 0 || config.world_size == 1,
             "--{} starts its own ranks: --world-size and --rank are for one rank of a job",
             args.gpus > 0 ? "gpus" : "ranks");
  KILN_CHECK(config.rank < config.world_size, "--rank {} is not a rank of --world-size {}",
             config.rank, config.world_size);
  const bool parallel = local > 1 || config.world_size > 1;
  KILN_CHECK(!parallel || model_info(config.model).task == ModelTask::image_classifier,
             "data-parallel training runs the image classifiers; '{}' trains on one process",
             config.model);
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
       .grace = std::chrono::milliseconds(static_cast<std::int64_t>(args.init_timeout_s * 1000))});
}

}  // namespace kiln::tools
