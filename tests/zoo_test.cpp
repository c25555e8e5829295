// The CNN model zoo (resnet, vgg, alexnet, inception; resnet18 at the end): each builds, maps
// [B, 1, 28, 28] to [B, 10] logits, has the parameter count its layers add up to, and learns: a
// few dozen Adam steps on one small batch (Fashion-MNIST where installed, else synthetic) cut
// its loss.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>

#include "backends/compile.h"
#include "backends/schedule.h"
#include "fusion/fuse.h"
#include "graph/op.h"
#include "graph/passes/dead_code.h"
#include "data/dataset.h"
#include "graph/nn/functional.h"
#include "graph/optim.h"
#include "models/registry.h"
#include "models/resnet.h"
#include "train/step_graph.h"

namespace kiln {
namespace {

std::int64_t parameter_count(const nn::Module& model) {
  std::int64_t n = 0;
  for (const VariablePtr& p : model.parameters()) n += p->value.numel();
  return n;
}

// Parameters of a conv without bias followed by batch norm (gamma, beta).
constexpr std::int64_t conv_bn(std::int64_t in, std::int64_t out, std::int64_t k) {
  return in * out * k * k + 2 * out;
}
constexpr std::int64_t conv(std::int64_t in, std::int64_t out, std::int64_t k) {
  return in * out * k * k + out;
}
constexpr std::int64_t linear(std::int64_t in, std::int64_t out) { return in * out + out; }

constexpr std::int64_t basic_block(std::int64_t in, std::int64_t out) {
  return conv_bn(in, out, 3) + conv_bn(out, out, 3) + (in == out ? 0 : conv_bn(in, out, 1));
}

constexpr std::int64_t inception_module(std::int64_t in, std::int64_t b1, std::int64_t r3,
                                        std::int64_t b3, std::int64_t r5, std::int64_t b5,
                                        std::int64_t pool) {
  return conv_bn(in, b1, 1) + conv_bn(in, r3, 1) + conv_bn(r3, b3, 3) + conv_bn(in, r5, 1) +
         conv_bn(r5, b5, 5) + conv_bn(in, pool, 1);
}

struct ZooCase {
  const char* name;
  std::int64_t parameters;  // from the layer lists in models/*.h
};

const ZooCase kZoo[] = {
    {"resnet", conv_bn(1, 16, 3) + 2 * basic_block(16, 16) + basic_block(16, 32) +
                   basic_block(32, 32) + basic_block(32, 64) + basic_block(64, 64) +
                   linear(64, 10)},
    {"vgg", conv_bn(1, 16, 3) + conv_bn(16, 16, 3) + conv_bn(16, 32, 3) + conv_bn(32, 32, 3) +
                conv_bn(32, 64, 3) + conv_bn(64, 64, 3) + linear(576, 256) + linear(256, 10)},
    {"alexnet", conv(1, 32, 5) + conv(32, 48, 3) + conv(48, 96, 3) + conv(96, 96, 3) +
                    conv(96, 64, 3) + linear(1024, 512) + linear(512, 512) + linear(512, 10)},
    {"inception", conv_bn(1, 32, 3) + inception_module(32, 16, 16, 32, 8, 16, 16) +
                      inception_module(80, 32, 32, 48, 8, 24, 24) +
                      inception_module(128, 48, 32, 64, 8, 24, 24) + linear(160, 10)},
};

// One batch of `n` examples: the first n training images of Fashion-MNIST, or synthetic.
Dataset first_batch(std::int64_t n) {
  if (!std::filesystem::exists(kFashionMnistDir)) return synthetic_images(n, {1, 28, 28}, 10, 3);
  const Dataset train = load_fashion_mnist(kFashionMnistDir, Split::train);
  Dataset batch{Tensor::empty({n, 1, 28, 28}, DType::f32), Tensor::empty({n}, DType::i64)};
  std::copy_n(train.images.data<float>(), n * 28 * 28, batch.images.data<float>());
  std::copy_n(train.labels.data<std::int64_t>(), n, batch.labels.data<std::int64_t>());
  return batch;
}

}  // namespace

TEST_CASE("zoo: every model maps [B, 1, 28, 28] to [B, 10] and has its layers' parameter count") {
  for (const ZooCase& c : kZoo) {
    CAPTURE(c.name);
    const ModelInfo& info = model_info(c.name);
    CHECK(info.task == ModelTask::image_classifier);
    CHECK(info.input_shape == Shape{1, 28, 28});
    CHECK(info.classes == 10);
    ModelGraph m = build_model_graph(c.name, Stage::forward, 3, {});
    const Outputs out =
        compile(*m.graph)->run({{"x", synthetic_images(3, {1, 28, 28}, 10, 1).images}});
    CHECK(out.at("logits").shape() == Shape{3, 10});
    MESSAGE(std::string(c.name) << ": " << parameter_count(*m.model) << " parameters");
    CHECK(parameter_count(*m.model) == c.parameters);
  }
}

TEST_CASE("zoo: in eval mode an example's logits do not depend on the rest of its batch") {
  const Tensor images = synthetic_images(4, {1, 28, 28}, 10, 5).images;
  for (const ZooCase& c : kZoo) {
    CAPTURE(c.name);
    Philox rng(0);
    std::unique_ptr<nn::Layer> model = make_model(c.name, rng);
    model->set_training(false);  // batch norm on running statistics, dropout off
    Graph whole, single;
    whole.output("logits", (*model)(whole.input("x", {4, 1, 28, 28})));
    single.output("logits", (*model)(single.input("x", {1, 1, 28, 28})));
    const Tensor all = compile(whole)->run({{"x", images}}).at("logits");
    Tensor last = Tensor::empty({1, 1, 28, 28}, DType::f32);
    std::copy_n(images.data<float>() + 3 * 28 * 28, 28 * 28, last.data<float>());
    const Tensor alone = compile(single)->run({{"x", last}}).at("logits");
    for (std::int64_t k = 0; k < 10; ++k)
      CHECK(alone.at(k) == doctest::Approx(all.at(30 + k)).epsilon(1e-4));
  }
}

TEST_CASE(
    "zoo: 25 Adam steps on one batch of 16 cut every model's loss by half and far below chance") {
  const Dataset batch = first_batch(16);
  for (const ZooCase& c : kZoo) {
    CAPTURE(c.name);
    ModelGraph m = build_model_graph(c.name, Stage::train, 16, {.name = "adam", .lr = 1e-3}, 7);
    auto step = compile(*m.graph);
    double first = 0, last = 0;
    for (int i = 0; i < 25; ++i) {
      const double loss = step->run({{"x", batch.images}, {"y", batch.labels}}).at("loss").item();
      REQUIRE(std::isfinite(loss));
      if (i == 0) first = loss;
      last = loss;
    }
    MESSAGE(std::string(c.name) << ": loss " << first << " -> " << last << " in 25 steps");
    CHECK(last < 0.5 * first);
    CHECK(last < 0.5 * std::log(10.0));  // chance: ln(10) = 2.3
  }
}

}  // namespace kiln

namespace kiln {

TEST_CASE(
    "zoo: the stream schedule runs some of inception's independent forward branches beside the "
    "critical path") {
  ModelGraph m = build_model_graph("inception", Stage::forward, 8, {});
  const Graph fused = eliminate_dead_code(fuse(eliminate_dead_code(*m.graph)));
  const std::vector<int> stream = assign_streams(fused, 2);
  int convs[2] = {0, 0};
  for (std::size_t id = 0; id < fused.nodes().size(); ++id)
    if (fused.nodes()[id].op->id == OpId::conv2d) ++convs[stream[id]];
  CAPTURE(convs[0]);
  CAPTURE(convs[1]);
  CHECK(convs[0] > 0);
  CHECK(convs[1] > 0);  // branches off the longest chain overlap it on the side stream
  // With four streams the side branches spread over the three side streams, and a stream
  // never runs a kernel before the kernels its inputs come from (node order is kept).
  const std::vector<int> four = assign_streams(fused, 4);
  int on[4] = {0, 0, 0, 0};
  for (std::size_t id = 0; id < fused.nodes().size(); ++id) {
    REQUIRE(four[id] >= 0);
    REQUIRE(four[id] < 4);
    if (fused.nodes()[id].op->id == OpId::conv2d) ++on[four[id]];
    if (stream[id] == 0) CHECK(four[id] == 0);  // the critical path stays on stream 0
  }
  CAPTURE(on[1]);
  CAPTURE(on[2]);
  CAPTURE(on[3]);
  CHECK(on[1] > 0);
  CHECK(on[2] > 0);
  CHECK(on[3] > 0);
}

// ResNet-18 in its CIFAR form: its parameter count, its output for CIFAR-sized and
// Fashion-MNIST-sized inputs, a clear error for the wrong input, and a step that learns.
TEST_CASE("resnet18: 11,173,962 parameters for CIFAR, [B, 10] logits for 3x32x32 and 1x28x28") {
  Philox rng(1);
  ResNet18 cifar(rng);
  CHECK(parameter_count(cifar) == 11'173'962);  // the CIFAR ResNet-18 of the literature
  ResNet18 gray(rng, 1, 10);
  CHECK(parameter_count(gray) == 11'173'962 - 2 * 64 * 9);  // one input channel instead of 3
  for (const auto& [model, shape] : {std::pair<ResNet18*, Shape>{&cifar, Shape{2, 3, 32, 32}},
                                     std::pair<ResNet18*, Shape>{&gray, Shape{2, 1, 28, 28}}}) {
    model->set_training(false);
    Graph g;
    Value x = g.input("x", shape);
    g.output("logits", (*model)(x));
    Tensor images = Tensor::empty(shape, DType::f32);
    rng.fill_uniform(images, -1.0, 1.0);
    const Tensor logits = compile(g)->run({{x, images}}).at("logits");
    CHECK(logits.shape() == Shape{2, 10});
    for (std::int64_t i = 0; i < logits.numel(); ++i) CHECK(std::isfinite(logits.at(i)));
  }
  Graph g;
  CHECK_THROWS_WITH_AS((void)cifar(g.input("x", {2, 1, 28, 28})),
                       "resnet18: input is [2, 1, 28, 28] but the model takes [B, 3, H, W] with "
                       "H, W >= 8",
                       Error);
}

TEST_CASE("resnet18: SGD with momentum on one batch of 8 (3x16x16, two classes) cuts the loss") {
  Philox rng(3);
  ResNet18 model(rng, 3, 2);
  Graph g;
  Value x = g.input("x", {8, 3, 16, 16});
  Value y = g.input("y", {8}, DType::i64);
  const Value loss = cross_entropy(model(x), y);
  Sgd sgd({.lr = 0.02, .momentum = 0.9});
  auto step = compile_training(loss, model.parameters(), sgd);
  // Class 1 images are brighter on the left half: a pattern a CNN learns in a few steps.
  Tensor images = Tensor::empty({8, 3, 16, 16}, DType::f32),
         labels = Tensor::empty({8}, DType::i64);
  rng.fill_uniform(images, -0.5, 0.5);
  for (std::int64_t b = 0; b < 8; ++b) {
    labels.data<std::int64_t>()[b] = b % 2;
    if (b % 2 == 0) continue;
    for (std::int64_t i = 0; i < 3 * 16 * 16; ++i)
      if (i % 16 < 8) images.data<float>()[b * 768 + i] += 1.0f;
  }
  double first = 0, last = 0;
  for (int i = 0; i < 8; ++i) {
    last = step->run({{x, images}, {y, labels}}).at("loss").item();
    REQUIRE(std::isfinite(last));
    if (i == 0) first = last;
  }
  MESSAGE("resnet18 loss " << first << " -> " << last);
  CHECK(last < 0.5 * first);
}

TEST_CASE("zoo: the pooled models take the data's channels, size and classes, the others refuse") {
  struct Case {
    const char* model;
    Shape example;
    std::int64_t classes;
  };
  for (const Case& c : {Case{"resnet", {3, 20, 24}, 7}, Case{"resnet18", {3, 32, 32}, 100},
                        Case{"inception", {3, 16, 16}, 2}, Case{"resnet18", {1, 32, 32}, 10}}) {
    CAPTURE(c.model);
    ModelGraph m = build_model_graph(c.model, Stage::forward, 2, {}, 0, {}, {c.example, c.classes});
    m.model->set_training(false);
    Tensor images = Tensor::empty(batch_shape(2, c.example), DType::f32);
    Philox(3).fill_uniform(images, -1.0, 1.0);
    const Tensor logits = compile(*m.graph)->run({{"x", images}}).at("logits");
    CHECK(logits.shape() == Shape{2, c.classes});
  }
  for (const char* fixed : {"lenet", "vgg", "alexnet", "row-lstm"}) {
    CAPTURE(fixed);
    Philox rng(0);
    CHECK_THROWS_WITH_AS(make_model(fixed, rng, Shape{3, 32, 32}, 10),
                         doctest::Contains("takes only [1, 28, 28] images in 10 classes"), Error);
    CHECK_THROWS_WITH_AS(make_model(fixed, rng, Shape{1, 28, 28}, 100),
                         doctest::Contains("not [1, 28, 28] in 100 classes"), Error);
    CHECK(make_model(fixed, rng, Shape{1, 28, 28}, 10) != nullptr);
  }
  Philox rng(0);
  CHECK_THROWS_WITH_AS(make_model("resnet18", rng, Shape{3, 4, 4}, 10),
                       doctest::Contains("H, W >= 8"), Error);
}

}  // namespace kiln
