// Batch normalisation (Ioffe & Szegedy 2015) as graph expressions: statistics over every
// axis but the channel axis 1, learnable scale and shift, running statistics as buffers
// that the training graph updates by assignment and the eval graph reads.
#pragma once

#include "graph/nn/module.h"

namespace kiln {

// Training mode over x: [B, C, ...]; gamma, beta: [C]. y = (x - mean) / sqrt(var + eps) *
// gamma + beta with the batch's mean and biased variance, both returned as [C].
// `sync_group` >= 0 (synchronised batch norm, data parallelism): the statistics are those of
// the global batch, every rank's x together (ranks of equal batches), through all_reduce_mean
// over that collective group (graph/collective.h): one all-reduce of every rank's mean and
// variance in the forward (a [W, 2C] table, rank r's row from rank r), its gradient in the
// backward. -1: this x alone.
struct BatchNormResult {
  Value y, mean, var;
};
BatchNormResult batch_norm_training(Value x, Value gamma, Value beta, double eps,
                                    int sync_group = -1);
// Inference mode: the same with given statistics mean, var: [C].
Value batch_norm_inference(Value x, Value gamma, Value beta, Value mean, Value var, double eps);

namespace nn {

struct BatchNormOptions {
  double eps = 1e-5;
  double momentum = 0.1;  // running = (1 - momentum) * running + momentum * batch statistic
};

// In training mode the running variance takes the unbiased batch variance (as PyTorch);
// applied twice in one step (a GAN's discriminator), the updates chain in call order.
class BatchNorm : public Layer {
 public:
  Value forward(Value x) override;
  const VariablePtr& running_mean() const { return running_mean_; }
  const VariablePtr& running_var() const { return running_var_; }
  const VariablePtr& weight() const { return weight_; }  // gamma, [C], initially 1
  const VariablePtr& bias() const { return bias_; }      // beta, [C], initially 0
  // Statistics over the ranks of a collective group (>= 0) instead of this process's batch
  // alone (-1, the default), read when a training graph is recorded; see sync_batch_norm.
  void set_sync_group(int group) { sync_group_ = group; }
  int sync_group() const { return sync_group_; }

 protected:
  BatchNorm(const char* name, std::size_t rank, std::int64_t features,
            const BatchNormOptions& options);

 private:
  const char* name_;
  std::size_t rank_;
  std::int64_t features_;
  BatchNormOptions options_;
  VariablePtr weight_, bias_, running_mean_, running_var_;
  int sync_group_ = -1;
};

// x: [B, F]
class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(std::int64_t features, const BatchNormOptions& options = {})
      : BatchNorm("BatchNorm1d", 2, features, options) {}
};

// x: [B, C, H, W]
class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(std::int64_t channels, const BatchNormOptions& options = {})
      : BatchNorm("BatchNorm2d", 4, channels, options) {}
};

// Every BatchNorm in `root` and its children normalises by the global batch of the ranks of
// collective group `group` (PyTorch's SyncBatchNorm.convert_sync_batchnorm), -1 by this
// process's batch again. Data-parallel training then computes exactly the step of one process
// on the global batch (up to the order of the sums), at the price of two all-reduces a step in
// each batch norm: the [W, 2C] table of the ranks' statistics in the forward, its gradient in
// the backward.
void sync_batch_norm(Module& root, int group);

}  // namespace nn
}  // namespace kiln
