// Models of one's own in the one training loop (models/registry.h, register_classifier): a
// registered classifier trains through train() like the zoo's, a builder of any input gets the
// data's shape and classes, and bad registrations are refused naming the problem.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>

#include "graph/nn/functional.h"
#include "graph/nn/module.h"
#include "models/registry.h"
#include "train/loop.h"

namespace kiln {
namespace {

// A linear classifier over flattened images.
class Flat : public nn::Layer {
 public:
  Flat(Philox& rng, std::int64_t inputs, std::int64_t classes) : fc_(inputs, classes, rng) {
    register_module("fc", fc_);
  }
  Value forward(Value x) override { return fc_(flatten(x)); }

 private:
  nn::Linear fc_;
};

TrainConfig synthetic_run(const std::string& model, const std::string& data) {
  TrainConfig c;
  c.model = model;
  c.images.data = data;
  c.loop.epochs = 1;
  c.loop.max_steps = 30;
  c.loop.batch_size = 16;
  c.loop.lr = 0.05;
  c.loop.optimizer = "sgd";
  c.loop.lr_schedule = "constant";
  c.loop.progress = false;
  return c;
}

TEST_CASE("a registered classifier trains through the one loop like the zoo's") {
  register_classifier({.name = "test-flat",
                       .description = "a linear classifier",
                       .input_shape = Shape{1, 6, 6},
                       .classes = 3},
                      [](Philox& rng, const Shape& example, std::int64_t classes) {
                        return std::make_unique<Flat>(rng, example.numel(), classes);
                      });
  CHECK(model_info("test-flat").description == "a linear classifier");
  const std::vector<EpochReport> reports = train(synthetic_run("test-flat", "synthetic"));
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].steps == 30);
  CHECK(std::isfinite(reports[0].loss));
  CHECK(reports[0].has("test_accuracy"));
}

TEST_CASE("a registered classifier of any input is built for the data's shape and classes") {
  Shape built;
  register_classifier({.name = "test-any",
                       .input_shape = Shape{1, 6, 6},
                       .classes = 3,
                       .any_input = true,
                       .min_input_size = 4},
                      [&](Philox& rng, const Shape& example, std::int64_t classes) {
                        built = example;
                        return std::make_unique<Flat>(rng, example.numel(), classes);
                      });
  train(synthetic_run("test-any", "synthetic:2x9x7"));
  CHECK(built == Shape{2, 9, 7});
  CHECK_THROWS_WITH_AS(train(synthetic_run("test-any", "synthetic:2x3x3")),
                       doctest::Contains("H, W >= 4"), Error);
}

TEST_CASE("register_classifier refuses a known name, another task, a bad shape, no builder") {
  auto flat = [](Philox& rng, const Shape& example, std::int64_t classes) {
    return std::make_unique<Flat>(rng, example.numel(), classes);
  };
  CHECK_THROWS_WITH_AS(
      register_classifier({.name = "lenet", .input_shape = Shape{1, 28, 28}, .classes = 10}, flat),
      doctest::Contains("a model named 'lenet' is known already"), Error);
  CHECK_THROWS_WITH_AS(
      register_classifier({.name = "two words", .input_shape = Shape{1, 28, 28}, .classes = 10},
                          flat),
      doctest::Contains("must be one word"), Error);
  CHECK_THROWS_WITH_AS(register_classifier({.name = "test-gan",
                                            .task = ModelTask::gan,
                                            .input_shape = Shape{1, 28, 28},
                                            .classes = 10},
                                           flat),
                       doctest::Contains("must be an image classifier"), Error);
  CHECK_THROWS_WITH_AS(
      register_classifier({.name = "test-flat-2", .input_shape = Shape{28, 28}, .classes = 10},
                          flat),
      doctest::Contains("[C, H, W] images in at least 2 classes"), Error);
  CHECK_THROWS_WITH_AS(
      register_classifier({.name = "test-one", .input_shape = Shape{1, 28, 28}, .classes = 1},
                          flat),
      doctest::Contains("at least 2 classes"), Error);
  CHECK_THROWS_WITH_AS(
      register_classifier({.name = "test-none", .input_shape = Shape{1, 28, 28}, .classes = 10},
                          nullptr),
      doctest::Contains("has no builder"), Error);
  CHECK_THROWS_WITH_AS(model_info("test-none"), doctest::Contains("unknown model"), Error);
}

}  // namespace
}  // namespace kiln
