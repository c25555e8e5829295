// The training step as graph ops: gradients of the loss, optionally clipped by their global
// norm, then the optimizer's update.
#pragma once

#include <optional>
#include <vector>

#include "graph/loss_scale.h"
#include "graph/optim.h"

namespace kiln {

struct TrainStepOptions {
  // > 0: before the update every gradient is multiplied by min(1, clip / (norm + 1e-6)),
  // norm = sqrt(sum over params of sum(g * g)) (PyTorch's clip_grad_norm_). 0: off.
  double clip_grad_norm = 0;
  // Data parallelism: >= 0 names the collective group (graph/collective.h) whose ranks
  // train replicas of this step. The gradients are then averaged over the ranks by
  // all_reduce_mean ops, in buckets of about `bucket_bytes` taken from the last parameter
  // backwards (the order the backward finishes them), so a bucket's communication overlaps
  // the rest of the backward; the forward's buffer updates (batch norm's running
  // statistics) and the "loss" output are averaged too, so replicas stay identical and the
  // loss is that of the global batch. -1: one process.
  int data_parallel_group = -1;
  std::size_t bucket_bytes = std::size_t{4} << 20;
  // With a data_parallel_group: the recorders of the zoo's steps (build_model_graph, the GAN
  // steps) make the model's batch norms synchronised (nn::sync_batch_norm) before recording
  // its forward (build_model_graph shards its dropout masks by rank in any case,
  // nn::shard_dropout). append_training_step itself does not read it.
  bool sync_batch_norm = false;
  // The classifiers' recorder (build_model_graph): cross_entropy's label smoothing (0: off).
  double label_smoothing = 0;
  // Dynamic loss scaling (graph/loss_scale.h), for fp16; compile_training turns it on for
  // Precision::fp16 when it is not set.
  std::optional<LossScaleOptions> loss_scale;
  // Gradient accumulation: N > 1 makes the step a micro-step. Each run adds its gradients
  // (unscaled, before any averaging over the ranks) into an accumulator per parameter; every
  // N-th run (a counter in the graph, from the first run on) updates with their mean, empties
  // them and restarts the count, and the other runs leave the parameters and the optimizer
  // state (loss scaler's included) as they were, so N runs on batches of B update as one run
  // on their N B examples would (batch norm's statistics and running statistics are each
  // micro-batch's, as in PyTorch). The "loss" output is each run's. The accumulators and the
  // counter are empty between updates, so checkpoints do not hold them.
  int accumulate = 1;
};

// The gradients scaled to a global L2 norm of at most `max_norm` (> 0), as graph ops that
// fuse like any other; `norm`, when given, receives the global norm before scaling ([]).
// Below the threshold the scale is exactly 1, so the gradients are unchanged.
std::vector<Value> clip_by_global_norm(const std::vector<Value>& grads, double max_norm,
                                       Value* norm = nullptr);

// The gradients averaged over the ranks of `group` in buckets of about `bucket_bytes`
// (see TrainStepOptions::data_parallel_group); `loss`, when given, is averaged in the last.
std::vector<Value> average_over_ranks(const std::vector<Value>& grads, int group,
                                      std::size_t bucket_bytes, Value* loss = nullptr);

// Appends to loss's graph the gradients of `params`, the optimizer update (as
// assignments) and the output "loss" (and "grad_norm", the norm before clipping, when
// clipping is on; "loss_scale" and "skipped_steps" with loss scaling). `params` must be
// trainable.
void append_training_step(Value loss, const std::vector<VariablePtr>& params, Optimizer& optimizer,
                          const TrainStepOptions& options = {});

}  // namespace kiln
