// fuzz_compiler: differential fuzzing of the compiler. Random elementwise DAGs (broadcasting,
// shared values, reductions inside and at the end, several outputs) run fused and unfused on
// the CPU (and fused on the GPU with --device cuda); values and gradients must agree.
//   fuzz_compiler --graphs 10000 --seed 1 [--device cuda]
// Exit codes: 0 all agreed, 1 a mismatch or an error (the graph is printed), 2 a bad flag.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <optional>

#include "backends/compile.h"
#include "graph/autograd.h"
#include "graph/op.h"
#include "graph/testing/random_graph.h"
#include "tools/cli.h"

namespace {

struct Mismatch {
  std::string output;
  double worst = 0;
};

// Largest |a - b| / (tolerance * (1 + |b|)); above 1 is a mismatch.
double distance(const kiln::Tensor& a, const kiln::Tensor& b, double tolerance) {
  double worst = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.at(i), y = b.at(i);
    if (std::isnan(x) && std::isnan(y)) continue;
    worst = std::max(worst, std::abs(x - y) / (tolerance * (1 + std::abs(y))));
  }
  return worst;
}

std::vector<kiln::Feed> random_feeds(const kiln::Graph& g, std::uint64_t seed) {
  std::vector<kiln::Feed> feeds;
  for (const kiln::Node& n : g.nodes()) {
    if (n.op->id != kiln::OpId::input) continue;
    kiln::Tensor t = kiln::Tensor::empty(n.outputs[0].shape, n.outputs[0].dtype);
    kiln::Philox(seed++).fill_uniform(t, -2, 2);
    feeds.emplace_back(n.name, t);
  }
  return feeds;
}

// Whether the graph compares values (greater, equal: also in the gradients of max and
// maximum). Its outputs then jump where two backends round differently, so GPU and CPU can
// disagree legitimately; such graphs are compared fused against unfused on the CPU only.
bool compares_values(const kiln::Graph& g) {
  for (const kiln::Node& n : g.nodes())
    if (n.op->id == kiln::OpId::greater || n.op->id == kiln::OpId::equal) return true;
  return false;
}

// Builds graph number `seed`, runs it every way, returns the first disagreement if any.
std::optional<Mismatch> check_graph(std::uint64_t seed, int max_ops, bool gpu, std::string& text,
                                    std::int64_t& gpu_checked) {
  kiln::Graph g;
  kiln::testing::build_with_gradients(
      g, seed, 3 + static_cast<int>(seed % static_cast<std::uint64_t>(max_ops)));
  text = g.str();
  const std::vector<kiln::Feed> feeds = random_feeds(g, seed * 7 + 1);
  const kiln::Outputs reference = kiln::compile(g, {.fuse = false})->run(feeds);
  // The fused CPU evaluation runs the same per-element math as the unfused one (only sums
  // are regrouped); the GPU's expf/tanhf/logf differ from the CPU's by an ulp or two, which
  // long gradient chains amplify, hence its looser tolerance.
  std::vector<std::pair<kiln::Outputs, double>> candidates = {
      {kiln::compile(g, {.fuse = true})->run(feeds), 2e-5}};
  if (gpu && !compares_values(g)) {
    candidates.emplace_back(kiln::compile(g, {.device = kiln::Device::cuda()})->run(feeds), 2e-4);
    ++gpu_checked;
  }
  for (const auto& [candidate, tolerance] : candidates)
    for (const auto& [name, tensor] : reference) {
      const double d = distance(candidate.at(name), tensor, tolerance);
      if (d > 1.0) return Mismatch{name, d};
    }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t graphs = 1000;
  std::uint64_t seed = 1;
  int max_ops = 24;
  std::string device = "cpu";
  CLI::App app{"kiln fuzz_compiler: random graphs compiled with and without fusion must agree"};
  app.add_option("--graphs", graphs, "how many graphs")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--seed", seed, "the first graph's seed (graph i uses seed + i)")
      ->capture_default_str();
  app.add_option("--max-ops", max_ops, "ops per graph at most")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--device", device, "cpu, or cuda to also run every graph fused on the GPU")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  if (const auto code = kiln::tools::parse_command_line(app, argc, argv)) return *code;
  const auto start = std::chrono::steady_clock::now();
  std::int64_t gpu_checked = 0;
  for (std::int64_t i = 0; i < graphs; ++i) {
    const std::uint64_t s = seed + static_cast<std::uint64_t>(i);
    std::string text;
    try {
      if (auto m = check_graph(s, max_ops, device == "cuda", text, gpu_checked)) {
        fmt::print(stderr, "fuzz_compiler: graph seed {} disagrees on '{}' (distance {:.3g}):\n{}",
                   s, m->output, m->worst, text);
        return 1;
      }
    } catch (const std::exception& e) {
      fmt::print(stderr, "fuzz_compiler: graph seed {} failed: {}\n{}", s, e.what(), text);
      return 1;
    }
    if ((i + 1) % 1000 == 0) fmt::print("{} graphs agree\n", i + 1);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print(
      "fuzz_compiler: {} random graphs (seeds {}..{}), fused and unfused agree on values and "
      "gradients{}, {:.1f} s\n",
      graphs, seed, seed + static_cast<std::uint64_t>(graphs) - 1,
      device == "cuda" ? fmt::format("; the GPU agrees on the {} without comparisons", gpu_checked)
                       : "",
      seconds);
  return 0;
}
