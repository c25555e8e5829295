// The classifier training loop behind `trainer`: builds the model, compiles one training
// step and one eval step, feeds shuffled batches, evaluates after each epoch.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "graph/graph.h"
#include "train/lr_schedule.h"
#include "data/dataset.h"
#include "models/registry.h"

namespace kiln {

struct TrainConfig {
  std::string model = "lenet";
  std::int64_t epochs = 2;
  std::int64_t batch_size = 64;
  std::string optimizer = "adam";  // sgd, adam, adamw
  double lr = 1e-3;
  std::string lr_schedule =
      "cosine";  // constant, step (x lr_gamma every lr_step_size steps), cosine decay to 0
  std::int64_t warmup_steps = 0;     // linear warm-up before the schedule
  std::int64_t lr_step_size = 1000;  // step schedule
  double lr_gamma = 0.1;             // step schedule
  double clip_grad_norm = 0;  // > 0: gradients scaled so that their global L2 norm is at most this
  double momentum = 0.9;
  double weight_decay = 0.0;
  std::uint64_t seed = 0;
  std::string data_dir;         // empty: the Debian package's directory
  bool synthetic = false;       // random data of the right shape instead of Fashion-MNIST
  std::int64_t max_steps = -1;  // stop after this many steps (all epochs together); -1: no limit
  std::int64_t eval_batch = 1000;
  Device device = Device::cpu();
  bool cuda_graphs = true;      // CUDA: replay the step as a CUDA graph
  bool tf32 = false;            // CUDA: TF32 tensor-core GEMMs
  int cuda_streams = 2;         // CUDA: streams of the schedule (1 or 2)
  std::string trace_path;       // non-empty: a Chrome trace of the 10th step goes here
  bool check_numerics = false;  // stop at the first op that makes a NaN or Inf (ops run unfused)
  bool deterministic = false;   // bitwise-reproducible (see CompileOptions::deterministic)
  std::string
      checkpoint_path;  // non-empty: save here after every epoch (and every save_every steps)
  std::int64_t save_every = 0;      // steps between checkpoints; 0: at the end of each epoch only
  std::string resume_path;          // non-empty: continue from this checkpoint
  std::string metrics_path;         // non-empty: JSON lines of metrics go here (models/metrics.h)
  std::int64_t metrics_every = 50;  // steps per "step" line of the metrics (mean loss over them)
  bool progress = true;

  // Data parallelism (dist/): this process is rank `rank` of `world_size`, joined through
  // rank 0's address `init` (HOST:PORT). batch_size is per rank; each step trains on the
  // global batch batch_size * world_size, sharded by rank from the one seed.
  int rank = 0;
  int world_size = 1;
  std::string init = "127.0.0.1:29500";
  std::int64_t init_timeout_ms = 60'000;  // connecting, and a silent rank's heartbeat
  std::int64_t bucket_kib = 4096;         // gradient all-reduce buckets
  std::int64_t check_replicas = 0;  // > 0: compare the replicas' variables every this many steps

  // Language models (char-lstm).
  std::string text_path;      // the corpus; empty: Debian's fortunes (kFortunesDir)
  std::int64_t seq_len = 64;  // characters per training sequence
  std::int64_t embedding = 64;
  std::int64_t hidden = 256;
  std::int64_t layers = 1;
  std::string cell = "lstm";   // lstm or rnn (tanh)
  bool bidirectional = false;  // row-lstm: a bidirectional LSTM over the image rows
  std::int64_t sample_chars =
      0;  // > 0: generate this many characters (from --resume's checkpoint) instead of training
  double temperature = 1.0;  // sampling temperature
  std::string prime;         // text the sample starts from

  // GANs.
  std::string samples_dir = ".";  // PNG grids of samples go here, one per epoch
  std::string fid_classifier;     // a checkpoint of a trained lenet: FID on its features, per epoch
};

struct EpochResult {
  std::int64_t epoch = 0;
  std::int64_t steps = 0;
  double train_loss = 0;     // mean over the epoch's steps
  double test_accuracy = 0;  // fraction in [0, 1] (data parallelism: rank 0 only, NaN elsewhere)
  double test_loss = 0;      // mean cross-entropy on the test set
  double lr = 0;             // learning rate of the epoch's last step
  double seconds = 0;        // training time of the epoch (evaluation excluded)
  double images_per_second = 0;
};

namespace dist {
class DataParallel;
}

// This process's place in the config's data-parallel job (joined now), or null for one process.
std::unique_ptr<dist::DataParallel> join_data_parallel(const TrainConfig& config);

// The learning-rate schedule the config asks for (every training loop uses this one).
LrSchedule lr_schedule_of(const TrainConfig& config);

// Trains and returns one result per epoch; `on_epoch` is called after each, `on_finish`
// with the trained parameters.
std::vector<EpochResult> train_classifier(
    const TrainConfig& config, const std::function<void(const EpochResult&)>& on_epoch = {},
    const std::function<void(const std::vector<VariablePtr>&)>& on_finish = {});

// The training or test set a config trains on: Fashion-MNIST from data_dir, or synthetic
// images of the model's input shape (from the config's seed).
Dataset classifier_data(const TrainConfig& config, const ModelInfo& info, Split split);

}  // namespace kiln
