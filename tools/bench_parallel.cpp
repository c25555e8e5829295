// The scaling benchmark: the parent launches N copies of bench as ranks; each times the
// data-parallel step (gradients averaged by all_reduce_mean), rank 0 reports to a file.
#include "tools/bench_parallel.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "distributed/data_parallel.h"
#include "distributed/launch.h"
#include "graph/op.h"
#include "train/tasks.h"

namespace kiln::tools {

nlohmann::json bench_scaling(const ScalingRun& run, const nlohmann::json& one_rank) {
  const std::filesystem::path report = std::filesystem::temp_directory_path() /
                                       fmt::format("kiln-bench-{}-{}.json", getpid(), run.batch);
  std::vector<std::string> args = {"--model",      run.model,
                                   "--batch-size", std::to_string(run.batch),
                                   "--warmup",     std::to_string(run.warmup),
                                   "--steps",      std::to_string(run.steps),
                                   "--device",     run.options.device.is_cpu() ? "cpu" : "cuda",
                                   "--rank-json",  report.string(),
                                   "--bucket-kib", std::to_string(run.bucket_kib)};
  if (run.options.tf32) args.push_back("--tf32");
  if (run.sync_batch_norm) args.push_back("--sync-batch-norm");
  args.push_back("--precision");
  args.push_back(precision_name(run.options.precision));
  if (!run.options.cuda_graphs) args.push_back("--no-cuda-graphs");
  const int code = dist::launch_local(
      dist::self_executable(), args,
      {.world_size = run.ranks, .one_gpu_per_rank = !run.options.device.is_cpu()});
  KILN_CHECK(code == 0, "bench: the {}-rank run failed (exit code {})", run.ranks, code);
  std::ifstream in(report);
  KILN_CHECK(in, "bench: rank 0 wrote no result to {}", report.string());
  nlohmann::json r = nlohmann::json::parse(in);
  std::filesystem::remove(report);
  const double global_items = static_cast<double>(run.items * run.ranks);
  r["items_per_second"] = global_items * 1000.0 / r["median_ms"].get<double>();
  r["scaling_efficiency"] = r["items_per_second"].get<double>() /
                            (run.ranks * one_rank["items_per_second"].get<double>());
  return r;
}

int bench_rank(const ScalingRun& run, int rank, int world_size, const std::string& init,
               const std::string& json_path) {
  dist::DataParallel parallel({.rank = rank, .world_size = world_size, .address = init},
                              run.options.device);
  TrainConfig c;
  c.model = run.model;
  c.loop.batch_size = run.batch;
  c.parallel.bucket_kib = run.bucket_kib;
  c.parallel.sync_batch_norm = run.sync_batch_norm;
  const TaskContext context{.options = run.options,
                            .rank = rank,
                            .world_size = world_size,
                            .collective_group = parallel.collective_group()};
  BenchStep m = task_entry(run.model).bench(c, context);
  StepTimes t;
  int buckets = 0;  // all_reduce_mean ops of the step (a GAN: of both programs)
  if (m.time) {     // several programs (a GAN), timed by the task
    const TimedSteps timed = m.time(run.options, run.warmup, run.steps);
    t = timed.times;
    for (const auto& [name, value] : timed.extras)
      if (name == "all_reduce_ops") buckets = static_cast<int>(value);
  } else {
    auto step = compile(*m.recorded.graph, run.options);
    t = time_runs(*step, m.feeds, run.warmup, run.steps);
    for (const Node& n : step->graph().nodes()) buckets += n.op->id == OpId::all_reduce_mean;
  }
  parallel.finish();
  if (rank != 0) return 0;
  const std::string device = run.options.device.is_cpu() ? "CPU ranks (TCP)" : "GPUs (NCCL)";
  const nlohmann::json r = {{"name", fmt::format("{} step, batch {} per rank x {} {}", run.model,
                                                 run.batch, world_size, device)},
                            {"device", run.options.device.str()},
                            {"ranks", world_size},
                            {"bucket_kib", run.bucket_kib},
                            {"sync_batch_norm", run.sync_batch_norm},
                            {"all_reduce_ops", buckets},
                            {"median_ms", t.median_ms},
                            {"p10_ms", t.p10_ms},
                            {"p90_ms", t.p90_ms},
                            {"device_median_ms", t.device_median_ms}};
  std::ofstream out(json_path);
  KILN_CHECK(out, "bench: cannot write {}", json_path);
  out << r.dump(2) << "\n";
  return 0;
}

}  // namespace kiln::tools
