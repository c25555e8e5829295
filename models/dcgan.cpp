// The DCGAN generator and discriminator.
#include "models/dcgan.h"

#include "graph/nn/functional.h"

namespace kiln {

DcganGenerator::DcganGenerator(Philox& rng)
    : fc_(100, 128 * 7 * 7, rng, false),
      bn0_(128),
      up1_({.in_channels = 128,
            .out_channels = 64,
            .kernel = 4,
            .stride = 2,
            .padding = 1,
            .bias = false},
           rng),
      bn1_(64),
      up2_({.in_channels = 64, .out_channels = 1, .kernel = 4, .stride = 2, .padding = 1}, rng) {
  register_module("fc", fc_);
  register_module("bn0", bn0_);
  register_module("up1", up1_);
  register_module("bn1", bn1_);
  register_module("up2", up2_);
}

Value DcganGenerator::forward(Value z) {
  Value x = reshape(fc_(z), {z.shape()[0], 128, 7, 7});
  x = relu(bn0_(x));
  x = relu(bn1_(up1_(x)));  // [B, 64, 14, 14]
  return tanh(up2_(x));     // [B, 1, 28, 28]
}

DcganDiscriminator::DcganDiscriminator(Philox& rng)
    : conv1_({.in_channels = 1, .out_channels = 64, .kernel = 4, .stride = 2, .padding = 1}, rng),
      conv2_({.in_channels = 64,
              .out_channels = 128,
              .kernel = 4,
              .stride = 2,
              .padding = 1,
              .bias = false},
             rng),
      bn2_(128),
      fc_(128 * 7 * 7, 1, rng, true, nn::Init::xavier_uniform) {
  register_module("conv1", conv1_);
  register_module("conv2", conv2_);
  register_module("bn2", bn2_);
  register_module("fc", fc_);
}

Value DcganDiscriminator::forward(Value images) {
  Value x = leaky_relu(conv1_(images), 0.2);  // [B, 64, 14, 14]
  x = leaky_relu(bn2_(conv2_(x)), 0.2);       // [B, 128, 7, 7]
  return fc_(flatten(x));                     // [B, 1]
}

void dcgan_init(const nn::Module& module, Philox& rng) {
  for (const VariablePtr& p : module.parameters())
    if (p->value.shape().rank() == 4) rng.fill_normal(p->value, 0.0, 0.02);
}

}  // namespace kiln
