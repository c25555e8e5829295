// The GANs' task (gan, dcgan): alternating discriminator and generator steps
// (train/gan_steps.h) over Fashion-MNIST scaled to [-1, 1]; after each epoch a PNG grid of
// samples from a fixed noise batch and, with --fid-classifier, the FID.
#pragma once

#include <cstdint>
#include <string>

#include "train/config.h"

namespace kiln {

// The usual GAN settings (Radford et al.): Adam at 2e-4 with beta1 = 0.5, a constant rate.
inline constexpr double kGanLr = 2e-4;
inline constexpr double kGanBeta1 = 0.5;
// Generated and real test images the FID compares (the whole Fashion-MNIST test set).
inline constexpr std::int64_t kFidSamples = 10000;
// Samples in the grid written after each epoch (8 x 8).
inline constexpr std::int64_t kGridSamples = 64;

struct BenchStep;
struct TaskContext;
// bench: both steps at the config's batch, timed by the task (train/gan_bench.cpp).
BenchStep gan_bench_step(const TrainConfig& config, const TaskContext& context);

// The path of the grid of `epoch`: samples_dir/<model>-epoch-<epoch>.png.
std::string gan_samples_path(const TrainConfig& config, std::int64_t epoch);

}  // namespace kiln
