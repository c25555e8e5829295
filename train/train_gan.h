// The GAN training loop behind `trainer --model gan|dcgan`: alternating discriminator and
// generator steps (models/gan_steps.h) over Fashion-MNIST scaled to [-1, 1]; after each
// epoch a PNG grid of samples from a fixed noise batch and, with --fid-classifier, the FID.
#pragma once

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "train/train.h"

namespace kiln {

// The usual GAN settings (Radford et al.): Adam at 2e-4 with beta1 = 0.5, a constant rate.
inline constexpr double kGanLr = 2e-4;
inline constexpr double kGanBeta1 = 0.5;
// Generated and real test images the FID compares (the whole Fashion-MNIST test set).
inline constexpr std::int64_t kFidSamples = 10000;
// Samples in the grid written after each epoch (8 x 8).
inline constexpr std::int64_t kGridSamples = 64;

struct GanEpochResult {
  std::int64_t epoch = 0;
  std::int64_t steps = 0;  // (discriminator step + generator step) pairs
  double d_loss = 0;       // means over the epoch's steps
  double g_loss = 0;
  double d_accuracy = 0;
  double fid = std::numeric_limits<double>::quiet_NaN();  // NaN without --fid-classifier
  double seconds = 0;            // training time of the epoch (samples and FID excluded)
  double images_per_second = 0;  // real images through the discriminator step
  std::string samples_path;      // the epoch's PNG grid
};

// Trains config.model (a GAN) and returns one result per epoch; `on_epoch` is called after
// each, `on_finish` with the trained parameters (generator first, then discriminator), then
// the buffers (batch norm's running statistics).
std::vector<GanEpochResult> train_gan(
    const TrainConfig& config, const std::function<void(const GanEpochResult&)>& on_epoch = {},
    const std::function<void(const std::vector<VariablePtr>&)>& on_finish = {});

// The path of the grid of `epoch`: samples_dir/<model>-epoch-<epoch>.png.
std::string gan_samples_path(const TrainConfig& config, std::int64_t epoch);

}  // namespace kiln
