// GANs for 28x28 images: a generator (noise z [B, 100] -> images [B, 1, 28, 28] in [-1, 1])
// and a discriminator (images -> one logit each; its sigmoid lives in bce_with_logits).
#pragma once

#include <memory>
#include <string>

#include "graph/nn/module.h"

namespace kiln {

inline constexpr std::int64_t kGanNoiseDim = 100;

// The pair, as one module: parameters are "generator.*" and "discriminator.*", so that both
// go into one checkpoint.
class Gan : public nn::Module {
 public:
  Gan(std::unique_ptr<nn::Layer> generator, std::unique_ptr<nn::Layer> discriminator);
  nn::Layer& generator() { return *generator_; }
  nn::Layer& discriminator() { return *discriminator_; }
  std::vector<VariablePtr> generator_parameters() const { return generator_->parameters(); }
  std::vector<VariablePtr> discriminator_parameters() const { return discriminator_->parameters(); }

 private:
  std::unique_ptr<nn::Layer> generator_, discriminator_;
};

// The classic MLP GAN: z -> 256 (ReLU) -> 784 (tanh) -> [B, 1, 28, 28].
class MlpGenerator : public nn::Layer {
 public:
  explicit MlpGenerator(Philox& rng);
  Value forward(Value z) override;  // z: [B, 100] -> [B, 1, 28, 28]

 private:
  nn::Linear fc1_, fc2_;
};

// 784 -> 256 (LeakyReLU 0.2) -> 1 logit.
class MlpDiscriminator : public nn::Layer {
 public:
  explicit MlpDiscriminator(Philox& rng);
  Value forward(Value images) override;  // images: [B, 1, 28, 28] -> logits [B, 1]

 private:
  nn::Linear fc1_, fc2_;
};

// "gan" or "dcgan" (kiln::Error for another name), initialised from `rng`.
std::unique_ptr<Gan> make_gan(const std::string& name, Philox& rng);

}  // namespace kiln
