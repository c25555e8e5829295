// The training settings, split by who reads them: the loop, the device (turned into
// CompileOptions once), data parallelism, and each task's own options. Every field is one
// flag of the table in train/flags.cpp, which gives its name, range and help.
#pragma once

#include <cstdint>
#include <string>

#include "backends/compile.h"
#include "train/lr_schedule.h"
#include "train/step_graph.h"

namespace kiln {

// What the one training loop (train/loop.h) reads, whatever the task.
struct LoopSettings {
  std::int64_t epochs = 2;
  std::int64_t batch_size = 64;    // per rank
  std::int64_t accumulate = 1;     // micro-batches of batch_size a step sums (one update)
  std::int64_t max_steps = -1;     // stop after this many steps (all epochs together); -1: no limit
  std::string optimizer = "adam";  // sgd, adam, adamw
  double lr = 1e-3;
  double momentum = 0.9;  // sgd
  double weight_decay = 0.0;
  double clip_grad_norm = 0;           // > 0: gradients scaled to a global L2 norm of at most this
  std::string lr_schedule = "cosine";  // constant, step, cosine decay to 0
  std::int64_t warmup_steps = 0;       // linear warm-up before the schedule
  std::int64_t lr_step_size = 1000;    // step schedule
  double lr_gamma = 0.1;               // step schedule
  std::uint64_t seed = 0;              // initialisation, data order, noise
  std::string checkpoint;              // non-empty: save here after every epoch
  std::int64_t save_every = 0;         // also every this many steps; 0: epochs only
  std::string resume;                  // non-empty: continue from this checkpoint
  std::string metrics;                 // non-empty: JSON lines (train/metrics.h) go here
  std::int64_t metrics_every = 50;     // steps per "step" line
  std::string trace;                   // non-empty: a Perfetto trace of the 10th step
  bool progress = true;                // the progress bar (on a terminal)
};

// Where and how the steps run; compile_options() is the one CompileOptions of a run.
struct DeviceSettings {
  std::string name = "cpu";        // cpu, cuda, auto (the GPU when there is one)
  int threads = 0;                 // CPU threads; 0: all cores (the tools apply it)
  bool cuda_graphs = true;         // CUDA: replay the step as a captured graph
  std::string precision = "fp32";  // fp32, tf32, bf16, fp16 (core/precision.h)
  bool tf32 = false;               // the same as precision tf32
  int streams = 4;                 // CUDA: streams of the schedule (1 to 8)
  bool check_numerics = false;
  bool deterministic = false;
};

// Data parallelism (distributed/): this process is rank `rank` of `world_size`, joined
// through rank 0's address `init`. The loop's batch is per rank; a step trains on the
// global batch batch_size * world_size, sharded by rank from the one seed.
struct ParallelSettings {
  int gpus = 0;   // the launcher: start this many ranks on this host, one GPU each
  int ranks = 0;  // the launcher: start this many ranks on this host on the device
  int rank = 0;
  int world_size = 1;
  std::string init = "127.0.0.1:29500";
  double init_timeout = 60;         // seconds: connecting, and a silent rank's heartbeat
  std::int64_t bucket_kib = 4096;   // gradient all-reduce buckets
  std::int64_t check_replicas = 0;  // > 0: compare the replicas' variables every this many steps
  bool sync_batch_norm = false;     // batch norm's statistics over the global batch, not the rank's
};

// Images (classifiers and GANs): Fashion-MNIST from a directory, or synthetic; the
// classifiers also CIFAR-10/100 and image folders (data/image_sources.h), padded,
// normalised per channel and augmented (random crop, flip).
struct ImageSettings {
  std::string data = "fashion-mnist";  // classifiers: the --data spec (data/image_sources.h)
  std::string data_dir;                // empty: data/dataset.h's kFashionMnistDir
  bool synthetic = false;              // random images of the model's shape
  std::int64_t eval_batch = 1000;      // classifiers: examples per evaluation step
  std::int64_t image_size = 0;         // folders: resize every image to this square; 0: as stored
  double test_fraction = 0.1;          // folders without train/ and test/: the test share
  std::int64_t pad = 0;                // black border added to every image (28 + 2 * 2 = 32)
  std::string mean, std;               // per channel, "0.49,0.48,0.45"; empty: from the train set
  std::int64_t crop_padding = 0;       // > 0: random crops of the image padded by this much
  bool flip = false;                   // random horizontal flips
  double label_smoothing = 0;          // > 0: the training loss against smoothed labels
  int loader_threads = 0;              // classifiers: threads filling batches ahead; 0: auto
  int loader_depth = 0;                // ... batches filled ahead of the step; 0: auto
};

// The language model (char-lstm).
struct LmSettings {
  std::string text;  // the corpus; empty: Debian's fortunes
  std::int64_t seq_len = 64;
  std::int64_t embedding = 64;
  std::int64_t hidden = 256;
  std::int64_t layers = 1;
  std::string cell = "lstm";  // lstm or rnn (tanh)
  std::int64_t sample = 0;    // > 0: generate this many characters from --resume instead
  double temperature = 1.0;
  std::string prime;  // the text a sample starts from
};

// GANs.
struct GanSettings {
  std::string samples_dir = ".";  // a PNG grid of samples per epoch goes here
  std::string fid_classifier;     // a lenet checkpoint: the FID on its features, per epoch
};

struct TrainConfig {
  std::string model = "lenet";
  LoopSettings loop;
  DeviceSettings device;
  ParallelSettings parallel;
  ImageSettings images;
  LmSettings lm;
  GanSettings gan;
};

// The device's name resolved ("auto": the GPU when there is one); kiln::Error for "cuda"
// without a usable GPU, naming why.
Device resolve_device(const std::string& name);
CompileOptions compile_options(const DeviceSettings& device);
// --precision, with --tf32 as its alias (a contradiction of the two is an error).
Precision precision_of(const DeviceSettings& device);
// The loss scaler's settings: PyTorch's defaults for fp16, none otherwise.
std::optional<LossScaleOptions> loss_scale_of(const DeviceSettings& device);
LrSchedule lr_schedule_of(const LoopSettings& loop);
OptimizerConfig optimizer_config(const LoopSettings& loop);

}  // namespace kiln
