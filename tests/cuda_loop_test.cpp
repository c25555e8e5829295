// The loop on the GPU queues each step before it reads the last one's values: the same losses,
// learning rates, checkpoints and final state, bit for bit, as waiting for every step before
// queuing the next (KILN_STEP_AHEAD=0), with periodic saves, micro-batches, a traced step and
// a schedule whose rate changes every step in the run. Skipped without a GPU.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backends/host_copy.h"
#include "train/checkpoint.h"
#include "train/loop.h"
#include "tests/support.h"

namespace kiln {
namespace {

using test::have_gpu;

// The "step" lines of a metrics file, without the fields that time the step.
std::vector<nlohmann::json> step_lines(const std::filesystem::path& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["kind"] != "step") continue;
    for (const char* timing : {"examples_per_second", "data_wait_ms", "time"}) j.erase(timing);
    lines.push_back(j);
  }
  return lines;
}

struct Run {
  std::vector<nlohmann::json> lines;
  std::vector<Tensor> state;  // parameters, optimizer state, buffers: on the host
  std::string checkpoint;     // the file's bytes
};

// `c` trained once, with KILN_STEP_AHEAD set to `ahead`, into `dir` (the same files for both
// settings: a checkpoint's metadata holds the paths).
Run train_into(TrainConfig c, const std::filesystem::path& dir, const char* ahead) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  c.loop.metrics = (dir / "metrics.jsonl").string();
  c.loop.checkpoint = (dir / "model.safetensors").string();
  c.loop.trace = (dir / "trace.json").string();
  setenv("KILN_STEP_AHEAD", ahead, 1);
  Run run;
  try {
    train(c, {}, [&](const TaskState& s) {
      for (const std::vector<VariablePtr>* vars : {&s.parameters, &s.optimizer_state, &s.buffers})
        for (const VariablePtr& v : *vars) run.state.push_back(to_host(v->value));
    });
  } catch (...) {
    unsetenv("KILN_STEP_AHEAD");
    throw;
  }
  unsetenv("KILN_STEP_AHEAD");
  run.lines = step_lines(c.loop.metrics);
  std::ifstream in(c.loop.checkpoint, std::ios::binary);
  run.checkpoint.assign(std::istreambuf_iterator<char>(in), {});
  CHECK(std::filesystem::file_size(c.loop.trace) > 100);
  return run;
}

}  // namespace

TEST_CASE(
    "GPU: the loop queues each step before reading the last one's values: the losses, rates, "
    "checkpoint and state of waiting for every step (lenet with micro-batches, the MLP GAN)") {
  if (!have_gpu()) return;
  const test::TempDir dir("kiln-gpu-loop-test");
  for (const char* model : {"lenet", "gan"}) {
    CAPTURE(model);
    TrainConfig c;
    c.model = model;
    c.device.name = "cuda";
    c.images.synthetic = true;
    c.loop.progress = false;
    c.loop.epochs = 1;
    c.loop.max_steps = 13;  // the cosine rate changes every step
    c.loop.save_every = 4;
    c.loop.metrics_every = 1;
    c.loop.batch_size = 32;
    if (std::strcmp(model, "lenet") == 0) c.loop.accumulate = 2;
    c.gan.samples_dir = dir.path.string();
    const Run ahead = train_into(c, dir.path / model, "1"),
              waited = train_into(c, dir.path / model, "0");
    REQUIRE(ahead.lines.size() == 13);
    CHECK(ahead.lines == waited.lines);
    CHECK(ahead.lines.front()["lr"] != ahead.lines.back()["lr"]);
    CHECK(!ahead.checkpoint.empty());
    CHECK(ahead.checkpoint == waited.checkpoint);
    REQUIRE(ahead.state.size() == waited.state.size());
    for (std::size_t i = 0; i < ahead.state.size(); ++i) {
      CAPTURE(i);
      const Tensor& a = ahead.state[i];
      const Tensor& b = waited.state[i];
      REQUIRE(a.nbytes() == b.nbytes());
      CHECK(std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
    }
  }
}

}  // namespace kiln
