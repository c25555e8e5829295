// The CPU backend's threads: once warm, a training step starts and ends no threads. libgomp
// ends the threads that a smaller team than the last leaves out and creates them again for
// the next full team, so every parallel region must be the whole team or a single thread.
#include <doctest/doctest.h>
#include <omp.h>

#include <filesystem>
#include <set>
#include <string>

#include "backends/compile.h"
#include "data/dataset.h"
#include "models/registry.h"
#include "train/step_graph.h"

namespace kiln {
namespace {

std::set<std::string> thread_ids() {
  std::set<std::string> ids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task"))
    ids.insert(entry.path().filename().string());
  return ids;
}

}  // namespace

TEST_CASE("CPU: a warm training step at 4 threads starts no threads (full teams or one thread)") {
  const int before = omp_get_max_threads();
  omp_set_num_threads(4);
  // resnet: batch norm's groups from [16] to [16, 16, 28, 28], oneDNN's convolutions and
  // reorders; vgg: pooling and the matmuls of its classifier.
  for (const std::string model : {"resnet", "vgg"}) {
    CAPTURE(model);
    const Dataset batch = synthetic_images(16, {1, 28, 28}, 10, 3);
    ModelGraph m = build_model_graph(model, Stage::train, 16, {.name = "sgd", .lr = 0.01}, 7);
    auto step = compile(*m.graph, {.device = Device::cpu()});
    for (int i = 0; i < 2; ++i) step->run({{"x", batch.images}, {"y", batch.labels}});
    const std::set<std::string> warm = thread_ids();
    for (int i = 0; i < 3; ++i) step->run({{"x", batch.images}, {"y", batch.labels}});
    CHECK(thread_ids() == warm);
  }
  omp_set_num_threads(before);
}

}  // namespace kiln
