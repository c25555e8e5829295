// The MLP GAN's two networks and the builder of every GAN.
#include "models/gan.h"

#include "graph/nn/functional.h"
#include "models/dcgan.h"

namespace kiln {

Gan::Gan(std::unique_ptr<nn::Layer> generator, std::unique_ptr<nn::Layer> discriminator)
    : generator_(std::move(generator)), discriminator_(std::move(discriminator)) {
  register_module("generator", *generator_);
  register_module("discriminator", *discriminator_);
}

MlpGenerator::MlpGenerator(Philox& rng)
    : fc1_(kGanNoiseDim, 256, rng), fc2_(256, 28 * 28, rng, true, nn::Init::xavier_uniform) {
  register_module("fc1", fc1_);
  register_module("fc2", fc2_);
}

Value MlpGenerator::forward(Value z) {
  const Value pixels = tanh(fc2_(relu(fc1_(z))));  // [B, 784] in (-1, 1)
  return reshape(pixels, {z.shape()[0], 1, 28, 28});
}

MlpDiscriminator::MlpDiscriminator(Philox& rng)
    : fc1_(28 * 28, 256, rng), fc2_(256, 1, rng, true, nn::Init::xavier_uniform) {
  register_module("fc1", fc1_);
  register_module("fc2", fc2_);
}

Value MlpDiscriminator::forward(Value images) {
  return fc2_(leaky_relu(fc1_(flatten(images)), 0.2));  // [B, 1]
}

std::unique_ptr<Gan> make_gan(const std::string& name, Philox& rng) {
  if (name == "gan") {
    auto generator = std::make_unique<MlpGenerator>(rng);
    return std::make_unique<Gan>(std::move(generator), std::make_unique<MlpDiscriminator>(rng));
  }
  if (name == "dcgan") {
    auto generator = std::make_unique<DcganGenerator>(rng);
    auto gan =
        std::make_unique<Gan>(std::move(generator), std::make_unique<DcganDiscriminator>(rng));
    dcgan_init(*gan, rng);
    return gan;
  }
  throw Error(fmt::format("'{}' is not a GAN (gan, dcgan)", name));
}

}  // namespace kiln
