// Batch normalisation: the two expressions and the layer that records one of them.
#include "graph/nn/batch_norm.h"

#include <cmath>
#include <tuple>
#include <utility>

#include "graph/collective.h"
#include "graph/nn/functional.h"
#include "graph/ops.h"

namespace kiln {
namespace {

// Every axis but 1.
std::vector<std::int64_t> reduced_axes(const Shape& x) {
  std::vector<std::int64_t> axes = {0};
  for (std::size_t d = 2; d < x.rank(); ++d) axes.push_back(static_cast<std::int64_t>(d));
  return axes;
}

// [C] -> [1, C, 1, ...] to broadcast against x.
Value per_channel(Value v, const Shape& x) {
  std::vector<std::int64_t> dims(x.rank(), 1);
  dims[1] = x[1];
  return reshape(v, dims);
}

void check_channels(const char* op, const Shape& x, const Value& v, const char* what) {
  KILN_CHECK(x.rank() >= 2, "{}: input must be [B, C, ...] but is {}", op, x.str());
  KILN_CHECK(v.shape() == Shape{x[1]}, "{}: {} is {} but the input {} has {} channels", op, what,
             v.type().str(), x.str(), x[1]);
}

// The global batch's mean and biased variance, [1, C, 1, ...], from this rank's (of a batch of
// the same size on every rank) through one all-reduce: each rank contributes its row of a
// [W, 2C] table of every rank's statistics (its own row, zeros elsewhere), so the mean of the
// table over the ranks, times W, is the table itself; from it every rank computes the same
// mean of the means and the same mean of var_r + (mean_r - mean)^2, the global variance
// without a difference of large sums.
std::pair<Value, Value> global_statistics(Value mean, Value var, int group) {
  const Collective& ranks = collective(group);
  const std::int64_t w = ranks.world_size(), r = ranks.rank(), c = mean.shape()[1];
  const std::vector<std::int64_t> kept = mean.shape().dims();
  const Value row = concat({reshape(mean, {1, c}), reshape(var, {1, c})}, 1);  // [1, 2C]
  const Value table =
      all_reduce_mean({pad(row, 0, r, w - 1 - r)}, group)[0] * static_cast<double>(w);
  const Value means = slice(table, 1, 0, c), vars = slice(table, 1, c, c);  // [W, C]
  const Value global_mean = sum(means, {0}, true) * (1.0 / static_cast<double>(w));
  const Value apart = means - global_mean;
  const Value global_var = sum(vars + apart * apart, {0}, true) * (1.0 / static_cast<double>(w));
  return {reshape(global_mean, kept), reshape(global_var, kept)};
}

}  // namespace

// The statistics in one pass over x: the sums of x - k and of its square, with k one value of
// each channel (x[0, c, 0, ...], its gradient cut). The variance is then a difference of two
// sums of values centred near the mean, so it keeps its precision where the mean is large
// against the spread (a sum of squares of x itself would lose var / mean^2 of it), and the
// backward reads x instead of a stored x - mean: the forward makes two passes over memory
// (the sums; the normalisation) where the two-pass variance took three, and the backward two
// where it took three (ARCHITECTURE.md, "Batch norm").
BatchNormResult batch_norm_training(Value x, Value gamma, Value beta, double eps, int sync_group) {
  const Shape& shape = x.shape();
  check_channels("batch_norm", shape, gamma, "gamma");
  check_channels("batch_norm", shape, beta, "beta");
  const std::vector<std::int64_t> axes = reduced_axes(shape);
  const double n = static_cast<double>(shape.numel() / shape[1]);  // values per channel
  Value shift = detach(x);  // [1, C, 1, 1]: the first value of each channel, read in place
  for (const std::int64_t axis : axes) shift = slice(shift, axis, 0, 1);
  const Value shifted = x - shift;
  const Value offset = sum(shifted, axes, true) * (1.0 / n);  // mean - shift, [1, C, 1, 1]
  const Value square_mean = sum(shifted * shifted, axes, true) * (1.0 / n);
  Value mean_kept = shift + offset;
  // Rounding can take the difference a little below 0 where the variance is 0.
  Value var_kept = maximum(square_mean - offset * offset, scalar_like(square_mean, 0.0));
  // Synchronised: the global batch's statistics from every rank's (ranks of equal batches).
  if (sync_group >= 0)
    std::tie(mean_kept, var_kept) = global_statistics(mean_kept, var_kept, sync_group);
  const Value scale = per_channel(gamma, shape) / sqrt(var_kept + eps);  // small: [1, C, 1, 1]
  const Value y = (x - mean_kept) * scale + per_channel(beta, shape);
  return {y, reshape(mean_kept, {shape[1]}), reshape(var_kept, {shape[1]})};
}

Value batch_norm_inference(Value x, Value gamma, Value beta, Value mean, Value var, double eps) {
  const Shape& shape = x.shape();
  check_channels("batch_norm", shape, gamma, "gamma");
  check_channels("batch_norm", shape, beta, "beta");
  check_channels("batch_norm", shape, mean, "running mean");
  check_channels("batch_norm", shape, var, "running variance");
  const Value scale = gamma / sqrt(var + eps);  // [C]
  const Value shift = beta - mean * scale;
  return x * per_channel(scale, shape) + per_channel(shift, shape);
}

namespace nn {

BatchNorm::BatchNorm(const char* name, std::size_t rank, std::int64_t features,
                     const BatchNormOptions& options)
    : name_(name), rank_(rank), features_(features), options_(options) {
  KILN_CHECK(features >= 1, "{}: {} features (at least 1)", name, features);
  KILN_CHECK(options.eps > 0 && options.momentum >= 0 && options.momentum <= 1,
             "{}: eps {} must be positive and momentum {} in [0, 1]", name, options.eps,
             options.momentum);
  weight_ = register_parameter("weight", Tensor::full({features}, 1.0, DType::f32));
  bias_ = register_parameter("bias", Tensor::zeros({features}, DType::f32));
  running_mean_ = register_buffer("running_mean", Tensor::zeros({features}, DType::f32));
  running_var_ = register_buffer("running_var", Tensor::full({features}, 1.0, DType::f32));
}

Value BatchNorm::forward(Value x) {
  Graph& g = x.graph();
  const Shape& shape = x.shape();
  KILN_CHECK(shape.rank() == rank_ && shape[1] == features_,
             "{}({}): input is {} but [B, {}{}] was expected", name_, features_, x.type().str(),
             features_, rank_ == 4 ? ", H, W" : "");
  const Value gamma = g.variable(weight_), beta = g.variable(bias_);
  if (!training())
    return batch_norm_inference(x, gamma, beta, g.variable(running_mean_), g.variable(running_var_),
                                options_.eps);
  // Values per channel in the statistics: of every rank where they are synchronised.
  const std::int64_t count =
      shape.numel() / features_ * (sync_group_ >= 0 ? collective(sync_group_).world_size() : 1);
  KILN_CHECK(count > 1,
             "{}({}): training needs more than one value per channel but the input is {}", name_,
             features_, x.type().str());
  const BatchNormResult r = batch_norm_training(x, gamma, beta, options_.eps, sync_group_);
  const double m = options_.momentum;
  const double unbiased = static_cast<double>(count) / static_cast<double>(count - 1);
  g.assign_latest(running_mean_, g.latest(running_mean_) * (1 - m) + r.mean * m);
  g.assign_latest(running_var_, g.latest(running_var_) * (1 - m) + r.var * (m * unbiased));
  return r.y;
}

void sync_batch_norm(Module& root, int group) {
  if (group >= 0) collective(group);  // an unknown group is an error here, not at the forward
  root.apply([group](Module& m) {
    if (auto* bn = dynamic_cast<BatchNorm*>(&m)) bn->set_sync_group(group);
  });
}

}  // namespace nn
}  // namespace kiln
