// DCGAN (Radford et al. 2016) scaled to 28x28: transposed convolutions up from 7x7 in the
// generator, strided convolutions down in the discriminator, batch norm between.
#pragma once

#include "graph/nn/batch_norm.h"
#include "graph/nn/module.h"

namespace kiln {

// z [B, 100] -> linear -> [B, 128, 7, 7] -> BN, ReLU -> transposed conv 4x4/2 -> [B, 64, 14, 14]
// -> BN, ReLU -> transposed conv 4x4/2 -> [B, 1, 28, 28] -> tanh.
class DcganGenerator : public nn::Layer {
 public:
  explicit DcganGenerator(Philox& rng);
  Value forward(Value z) override;

 private:
  nn::Linear fc_;
  nn::BatchNorm2d bn0_;
  nn::ConvTranspose2d up1_;
  nn::BatchNorm2d bn1_;
  nn::ConvTranspose2d up2_;
};

// [B, 1, 28, 28] -> conv 4x4/2 -> [B, 64, 14, 14], LeakyReLU(0.2) -> conv 4x4/2 -> [B, 128, 7, 7]
// -> BN, LeakyReLU(0.2) -> linear -> logits [B, 1].
class DcganDiscriminator : public nn::Layer {
 public:
  explicit DcganDiscriminator(Philox& rng);
  Value forward(Value images) override;

 private:
  nn::Conv2d conv1_, conv2_;
  nn::BatchNorm2d bn2_;
  nn::Linear fc_;
};

// DCGAN's initialisation: every convolution weight (rank 4) drawn from N(0, 0.02).
void dcgan_init(const nn::Module& module, Philox& rng);

}  // namespace kiln
