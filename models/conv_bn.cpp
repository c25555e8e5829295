// ConvBn: conv2d without bias, BatchNorm2d, optional ReLU.
#include "models/conv_bn.h"

#include "graph/ops.h"

namespace kiln {

ConvBn::ConvBn(const ConvBnOptions& o, Philox& rng)
    : relu_(o.relu),
      conv_({.in_channels = o.in_channels,
             .out_channels = o.out_channels,
             .kernel = o.kernel,
             .stride = o.stride,
             .padding = o.padding < 0 ? o.kernel / 2 : o.padding,
             .bias = false},
            rng),
      bn_(o.out_channels) {
  register_module("conv", conv_);
  register_module("bn", bn_);
}

Value ConvBn::forward(Value x) {
  const Value y = bn_(conv_(x));
  return relu_ ? relu(y) : y;
}

}  // namespace kiln
