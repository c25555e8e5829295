// Checkpoints carry a model's buffers ("buffer/<name>") next to parameters and optimizer state.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>

#include "core/safetensors.h"
#include "train/checkpoint.h"

namespace kiln {

TEST_CASE("checkpoint: buffers are saved as buffer/<name> and restored on load") {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("kiln-buffers-test-" + std::to_string(getpid()) + ".safetensors");
  const VariablePtr weight = make_variable("fc.weight", Tensor::full({2, 3}, 0.5, DType::f32));
  const VariablePtr mean =
      make_variable("bn.running_mean", Tensor::from_vector<float>({3}, {1, 2, 3}), false);
  const VariablePtr counter =
      make_variable("drop.step", Tensor::from_vector<std::int64_t>({}, {41}), false);
  save_checkpoint(path, {weight}, {}, {.step = 7, .epoch = 1, .batch = 7}, {}, {mean, counter});

  const SafetensorsFile file = load_safetensors(path);
  CHECK(file.tensors.count("buffer/bn.running_mean") == 1);
  CHECK(file.tensors.count("buffer/drop.step") == 1);

  mean->value = Tensor::zeros({3}, DType::f32);
  counter->value = Tensor::from_vector<std::int64_t>({}, {0});
  const TrainingPosition at = load_checkpoint(path, {weight}, {}, nullptr, {mean, counter});
  CHECK(at.step == 7);
  CHECK(mean->value.at(2) == 3.0);
  CHECK(counter->value.at(0) == 41.0);

  const VariablePtr other = make_variable("bn.running_var", Tensor::zeros({3}, DType::f32), false);
  CHECK_THROWS_WITH_AS(load_checkpoint(path, {weight}, {}, nullptr, {other}),
                       doctest::Contains("has no tensor 'buffer/bn.running_var'"), Error);
  std::filesystem::remove(path);
}

}  // namespace kiln
