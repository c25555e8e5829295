// bench's command line (tools/tool_main.h): times training steps (warm-up, then the median of
// many) and prints a table; --json writes the figures. The speed targets of the issues are checked
// with this tool. A step is timed two ways: wall time from run() to run() returning (inputs copied
// in, the step, the loss copied out, synchronised) and, on the GPU, device time from CUDA events
// around the step's kernels (Program::last_step_device_ms). Peak device memory is the
// caching allocator's peak while the step's program lives.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <optional>
#include <span>
#include <sstream>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "backends/compile.h"
#include "core/atomic_file.h"
#include "backends/device_warm_up.h"
#include "data/image_sources.h"
#include "graph/nn/functional.h"
#include "tools/bench_parallel.h"
#include "tools/cli.h"
#include "tools/openmp_defaults.h"
#include "tools/output_check.h"
#include "tools/tool_main.h"
#include "train/tasks.h"
#ifdef KILN_HAVE_CUDA
#include "tools/bench_cuda.h"
#endif

namespace {

using kiln::StepTimes;
using kiln::time_runs;

kiln::CompileOptions g_options;  // the device and CUDA settings of this run
std::string g_synthetic;         // --synthetic CxHxW: a classifier's input; empty: its own

nlohmann::json result(const std::string& name, const StepTimes& t, std::int64_t items) {
  const bool fp32 = g_options.precision == kiln::Precision::fp32 && !g_options.tf32;
  const kiln::Precision precision = g_options.tf32 ? kiln::Precision::tf32 : g_options.precision;
  return {{"name", fp32 ? name : fmt::format("{} [{}]", name, kiln::precision_name(precision))},
          {"precision", kiln::precision_name(precision)},
          {"device", g_options.device.str()},
          {"threads", omp_get_max_threads()},
          {"median_ms", t.median_ms},
          {"p10_ms", t.p10_ms},
          {"p90_ms", t.p90_ms},
          {"items_per_second", static_cast<double>(items) * 1000.0 / t.median_ms},
          {"device_median_ms", t.device_median_ms}};
}

// The task's training step for `model` at `batch` (train/tasks.h): the registry says what
// is timed (classifiers: SGD with momentum; char-lstm: Adam at its defaults, sequence 64;
// GANs: a D step and a G step, timed by the task).
kiln::BenchStep bench_step(const std::string& model, std::int64_t batch,
                           const kiln::TaskContext& context = {}) {
  kiln::TrainConfig c;
  c.model = model;
  c.loop.batch_size = batch;
  if (!g_synthetic.empty()) c.images.data = "synthetic:" + g_synthetic;
  return kiln::task_entry(model).bench(c, context);
}

void reset_peak() {
#ifdef KILN_HAVE_CUDA
  if (!g_options.device.is_cpu()) kiln::tools::reset_device_peak();
#endif
}

void add_peak(nlohmann::json& r) {
#ifdef KILN_HAVE_CUDA
  if (!g_options.device.is_cpu())
    r["peak_device_mib"] = static_cast<double>(kiln::tools::device_peak_bytes()) / (1 << 20);
#endif
  (void)r;
}

// Compiles and times a step of one program.
nlohmann::json bench_training_step(kiln::BenchStep m, bool fuse, int warmup, int steps) {
  reset_peak();
  const auto compile_start = std::chrono::steady_clock::now();
  kiln::CompileOptions options = g_options;
  options.fuse = fuse;
  auto step = kiln::compile(*m.recorded.graph, options);
  const double compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - compile_start)
          .count();
  nlohmann::json r = result(m.label + (fuse ? "" : " (unfused)"),
                            time_runs(*step, m.feeds, warmup, steps), m.items);
  r["compile_ms"] = compile_ms;
  r["streams"] = g_options.device.is_cpu() ? 1 : g_options.cuda_streams;
  r["planned_bytes"] = step->planned_bytes();
  add_peak(r);
  return r;
}

// A step of several programs, timed by its task.
nlohmann::json bench_timed_step(const kiln::BenchStep& m, int warmup, int steps) {
  reset_peak();
  const kiln::TimedSteps timed = m.time(g_options, warmup, steps);
  nlohmann::json r = result(m.label, timed.times, m.items);
  add_peak(r);
  r["compile_ms"] = timed.compile_ms;
  for (const auto& [name, value] : timed.extras) r[name] = value;
  return r;
}

// The fused-elementwise benchmark of the speed issue: tanh(relu(a * b + 1)) * 0.5 over n floats.
nlohmann::json bench_chain(std::int64_t n, bool fuse, int warmup, int steps) {
  kiln::Graph g;
  const kiln::Value a = g.input("a", {n});
  const kiln::Value b = g.input("b", {n});
  g.output("y", kiln::tanh(kiln::relu(a * b + 1.0)) * 0.5);
  kiln::CompileOptions options = g_options;
  options.fuse = fuse;
  auto p = kiln::compile(g, options);
  kiln::Tensor ta = kiln::Tensor::empty({n}, kiln::DType::f32),
               tb = kiln::Tensor::empty({n}, kiln::DType::f32);
  kiln::Philox(1).fill_uniform(ta, -1, 1);
  kiln::Philox(2).fill_uniform(tb, -1, 1);
  nlohmann::json r =
      result(fmt::format("tanh(relu(a*b+1))*0.5, {} floats{}", n, fuse ? "" : " (unfused)"),
             time_runs(*p, {{"a", ta}, {"b", tb}}, warmup, steps), n);
  r["gb_per_second"] =
      static_cast<double>(n) * 12.0 / (r["median_ms"].get<double>() * 1e6);  // 2 reads + 1 write
  return r;
}

// --json: written atomically (a failed write leaves the previous file whole).
void write_json(const std::string& path, const nlohmann::json& results) {
  const std::string text = results.dump(2) + "\n";
  kiln::write_file_atomically(
      path, std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
}

// Milliseconds from this process's start (by the kernel's clock) to now: the dynamic
// loading of the shared libraries before main included. -1 if /proc says nothing.
double ms_since_process_start() {
  std::ifstream stat("/proc/self/stat"), uptime("/proc/uptime");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  double up = 0;
  if (!(uptime >> up)) return -1;
  const std::size_t close = text.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return -1;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i)
    if (i == 22)
      return (up - std::stod(field) / static_cast<double>(sysconf(_SC_CLK_TCK))) * 1000.0;
  return -1;
}

// The start-up of a training process, phase by phase: graph, compile (fusion and JIT, from
// the disk cache when warm), the first step. Run twice with an empty KILN_CACHE_DIR to see a
// cold and then a warm start. With `warm_up` (as the trainer does) the GPU's context and
// cuBLAS start on a thread of their own first and the phases overlap them; without it the
// context is made first on this thread (context_ms) and cuBLAS starts in the first step.
nlohmann::json bench_startup(const std::string& model_name, std::int64_t batch, bool warm_up) {
  nlohmann::json r = {
      {"name", fmt::format("{} start-up to the first step, batch {}", model_name, batch)},
      {"device", g_options.device.str()},
      {"warm_up_thread", warm_up}};
  r["before_main_ms"] = ms_since_process_start();
  auto phase = [](auto&& work) {
    const auto start = std::chrono::steady_clock::now();
    work();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
        .count();
  };
  std::optional<kiln::DeviceWarmUp> warming;
  if (warm_up) warming.emplace(g_options.device);
#ifdef KILN_HAVE_CUDA
  if (!warm_up && !g_options.device.is_cpu()) r["context_ms"] = kiln::tools::cuda_context_ms();
#endif
  kiln::BenchStep m;
  r["graph_ms"] = phase([&] { m = bench_step(model_name, batch); });
  KILN_CHECK(!m.time, "--startup: {}'s step is several programs; it times a step of one",
             model_name);
  std::unique_ptr<kiln::Program> step;
  r["compile_ms"] = phase([&] { step = kiln::compile(*m.recorded.graph, g_options); });
  r["first_step_ms"] = phase([&] { step->run(m.feeds); });
  r["process_to_first_step_ms"] = ms_since_process_start();
  return r;
}

}  // namespace

namespace {

int run(int argc, char** argv) {
  std::string model = "lenet";
  std::vector<std::int64_t> batches = {64};
  int warmup = 5, steps = 50, threads = 0;
  std::string json_path;
  bool unfused = false;
  std::int64_t chain = 0;
  bool startup = false;
  std::string conv_algo = "auto";
  CLI::App app{"kiln bench: times training steps on the CPU"};
  app.add_option("--model", model, "model")->capture_default_str();
  app.add_option("--batch-size", batches, "batch sizes (several allowed)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24))
      ->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_option("--steps", steps, "timed steps")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--threads", threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 4096));
  app.add_option("--json", json_path, "write the results as JSON here");
  app.add_option("--synthetic", g_synthetic,
                 "classifiers: random images of this shape CxHxW (default: the model's own)")
      ->check([](const std::string& s) {
        try {
          kiln::parse_image_shape(s, "value");
          return std::string();
        } catch (const kiln::Error& e) {
          return std::string(e.what()).substr(7);  // CLI11 names the option: drop "value: "
        }
      });
  std::string device = "cpu";
  bool no_graphs = false;
  app.add_option("--device", device, "cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_flag("--no-cuda-graphs", no_graphs, "CUDA: no graph capture");
  app.add_flag("--tf32", g_options.tf32, "CUDA: TF32 GEMMs (the same as --precision tf32)");
  std::string precision = "fp32";
  app.add_option("--precision", precision,
                 "fp32, tf32, bf16 or fp16 (bf16/fp16: 16-bit activations, fp32 master weights)")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}))
      ->capture_default_str();
  bool compare_streams = false;
  bool numerics = false;
  app.add_flag("--check-numerics", numerics,
               "also time each step with --check-numerics, side by side (its overhead)");
  app.add_flag("--compare-streams", compare_streams,
               "CUDA: also time each step on a single stream, side by side");
  app.add_option("--streams", g_options.cuda_streams, "CUDA: streams of the schedule")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  app.add_flag("--unfused", unfused, "also time every step without fusion, side by side");
  app.add_option("--chain", chain,
                 "also time the fused elementwise chain over this many floats (e.g. 4194304)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 32));
  app.add_option("--conv-algo", conv_algo,
                 "CUDA: auto, im2col (im2col + cuBLAS everywhere), im2col-grad-weight, "
                 "cuda-cores (bf16/f16 passes off the tensor cores), tensor-cores (bf16/f16 "
                 "passes of any size on them) or mma-nchw (no channels-last copies)")
      ->check(CLI::IsMember(
          {"auto", "im2col", "im2col-grad-weight", "cuda-cores", "tensor-cores", "mma-nchw"}))
      ->capture_default_str();
  app.add_flag("--startup", startup,
               "only time the start-up: context, graph, compile (JIT or disk cache), first step");
  bool no_warm_up = false;
  app.add_flag("--no-warm-up", no_warm_up,
               "--startup: the CUDA context and cuBLAS start on the main thread when first needed, "
               "not on a thread started first");
  int gpus = 0, rank = 0, world_size = 1;
  std::int64_t bucket_kib = 4096;
  std::string init, rank_json;
  app.add_option("--gpus", gpus,
                 "also time the data-parallel step on N GPUs of this host (NCCL) and its scaling "
                 "efficiency")
      ->check(CLI::Range(2, 1024));
  app.add_option("--ranks", gpus, "as --gpus, with N processes on --device (the CPU: TCP)")
      ->check(CLI::Range(2, 1024));
  app.add_option("--bucket-kib", bucket_kib, "--gpus: KiB of gradients per all-reduce")
      ->check(CLI::Range(1, 1 << 22))
      ->capture_default_str();
  bool sync_batch_norm = false;
  app.add_flag("--sync-batch-norm", sync_batch_norm,
               "--gpus: batch norm's statistics over every rank's batch together");
  app.add_option("--rank", rank, "(set by --gpus) this process's rank")->check(CLI::Range(0, 1024));
  app.add_option("--world-size", world_size, "(set by --gpus) ranks in the job")
      ->check(CLI::Range(1, 1024));
  app.add_option("--init", init, "(set by --gpus) rank 0's HOST:PORT");
  app.add_option("--rank-json", rank_json, "(set by --gpus) where rank 0 writes its figures");
  if (const auto code = kiln::tools::parse_command_line(app, argc, argv)) return *code;
  try {
    if (!json_path.empty()) kiln::check_atomic_target(json_path, "--json " + json_path);  // now
    if (threads > 0) omp_set_num_threads(threads);
    g_options.device = device == "cuda" ? kiln::Device::cuda() : kiln::Device::cpu();
    g_options.cuda_graphs = !no_graphs;
    g_options.precision = *kiln::precision_from_name(precision);
    KILN_CHECK(!g_options.tf32 || precision == "fp32" || precision == "tf32",
               "--tf32 with --precision {}: --tf32 means --precision tf32", precision);
    auto scaling = [&](std::int64_t batch, std::int64_t items) {
      return kiln::tools::ScalingRun{.ranks = gpus,
                                     .model = model,
                                     .batch = batch,
                                     .items = items,
                                     .bucket_kib = bucket_kib,
                                     .sync_batch_norm = sync_batch_norm,
                                     .warmup = warmup,
                                     .steps = steps,
                                     .options = g_options};
    };
    if (world_size > 1)
      return kiln::tools::bench_rank(scaling(batches.front(), 0), rank, world_size, init,
                                     rank_json);
#ifdef KILN_HAVE_CUDA
    if (!g_options.device.is_cpu()) kiln::tools::force_conv_algo(conv_algo);
#endif
    nlohmann::json results = nlohmann::json::array();
    if (startup) {
      const nlohmann::json r = bench_startup(model, batches.front(), !no_warm_up);
      fmt::print("{}\n", r.dump(2));
      results.push_back(r);
      if (!json_path.empty()) write_json(json_path, results);
      return 0;
    }
    fmt::print("{:<58} {:>10} {:>10} {:>10} {:>12} {:>10} {:>9}\n", "benchmark", "median ms",
               "p10 ms", "p90 ms", "items/s", "device ms", "peak MiB");
    auto report = [&](const nlohmann::json& r) {
      const double device_ms = r.value("device_median_ms", -1.0);
      fmt::print(
          "{:<58} {:>10.3f} {:>10.3f} {:>10.3f} {:>12.0f} {:>10} {:>9}{}\n",
          r["name"].get<std::string>(), r["median_ms"].get<double>(), r["p10_ms"].get<double>(),
          r["p90_ms"].get<double>(), r["items_per_second"].get<double>(),
          device_ms >= 0 ? fmt::format("{:.3f}", device_ms) : "-",
          r.contains("peak_device_mib") ? fmt::format("{:.1f}", r["peak_device_mib"].get<double>())
                                        : "-",
          r.contains("scaling_efficiency")
              ? fmt::format("  scaling efficiency {:.3f}", r["scaling_efficiency"].get<double>())
          : r.contains("tb_per_second")
              ? fmt::format("  {:.2f} TB/s", r["tb_per_second"].get<double>())
          : r.contains("cpu_ms_per_step")
              ? fmt::format("  {:.3f} CPU ms/step", r["cpu_ms_per_step"].get<double>())
              : "");
      results.push_back(r);
    };
    for (std::int64_t batch : batches) {
      kiln::BenchStep first = bench_step(model, batch);
      if (first.time) {  // several programs: the task's own timing, and its scaling
        report(bench_timed_step(first, warmup, steps));
        if (gpus > 1)
          report(kiln::tools::bench_scaling(scaling(batch, first.items), results.back()));
        continue;
      }
      const std::int64_t items = first.items;
      report(bench_training_step(std::move(first), true, warmup, steps));
      if (gpus > 1) report(kiln::tools::bench_scaling(scaling(batch, items), results.back()));
      if (unfused) report(bench_training_step(bench_step(model, batch), false, warmup, steps));
      if (numerics) {
        g_options.check_numerics = true;
        nlohmann::json checked = bench_training_step(bench_step(model, batch), true, warmup, steps);
        checked["name"] = checked["name"].get<std::string>() + " (check-numerics)";
        report(checked);
        g_options.check_numerics = false;
      }
      if (compare_streams) {
        const int streams = g_options.cuda_streams;
        g_options.cuda_streams = 1;
        nlohmann::json one = bench_training_step(bench_step(model, batch), true, warmup, steps);
        one["name"] = one["name"].get<std::string>() + " (one stream)";
        report(one);
        g_options.cuda_streams = streams;
      }
    }
    if (chain > 0 && g_options.device.is_cpu()) {
      report(bench_chain(chain, true, warmup, steps));
      report(bench_chain(chain, false, warmup, steps));
    }
#ifdef KILN_HAVE_CUDA
    if (chain > 0 && !g_options.device.is_cpu())
      report(kiln::tools::bench_fused_chain_cuda(
          chain, warmup, steps,
          kiln::low_precision_dtype(g_options.precision).value_or(kiln::DType::f32)));
#endif
    if (!json_path.empty()) write_json(json_path, results);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench: error: {}\n", kiln::tools::one_line(e.what()));
    return 1;
  }
}

}  // namespace

int kiln::bench_main(int argc, char** argv) {
  kiln::tools::use_openmp_defaults(argv);
  return kiln::tools::finish_output("bench", run(argc, argv));
}
