// ResNet-18 in its CIFAR form: its parameter count, its output shape for CIFAR-sized and
// Fashion-MNIST-sized inputs, a clear error for the wrong input, and a training step that
// learns (a few SGD steps on one small batch cut the loss).
#include <doctest/doctest.h>

#include <cmath>

#include "backends/compile.h"
#include "core/philox.h"
#include "graph/nn/functional.h"
#include "graph/optim.h"
#include "graph/train_step.h"
#include "models/resnet.h"

namespace kiln {
namespace {

std::int64_t parameter_count(const nn::Module& model) {
  std::int64_t n = 0;
  for (const VariablePtr& p : model.parameters()) n += p->value.numel();
  return n;
}

}  // namespace

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

}  // namespace kiln
