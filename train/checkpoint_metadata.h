// What a training checkpoint's metadata says, read and checked before any tensor is used:
// the data position (kiln.step, kiln.epoch, kiln.batch) and the settings (kiln.config, or an
// older checkpoint's loose keys). Every error names the checkpoint file. Depends only on
// core/ and the flag table, so that a fuzz target (fuzz/checkpoint_metadata_fuzzer.cpp) can
// reach it directly.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "train/config.h"

namespace kiln {

using Metadata = std::map<std::string, std::string>;

// Where training stands: the next step to run is batch `batch` of epoch `epoch`.
struct TrainingPosition {
  std::int64_t step = 0;  // steps done
  std::int64_t epoch = 1;
  std::int64_t batch = 0;
};

// The most steps a position may count (far below 2^63, so that no sum of steps overflows).
inline constexpr std::int64_t kMaxCheckpointSteps = 1'000'000'000'000'000;  // 10^15

// kiln::Error "<path>: ..." unless kiln.step (at most kMaxCheckpointSteps), kiln.epoch (at
// least 1) and kiln.batch are decimal integers in range.
TrainingPosition checkpoint_position(const Metadata& metadata, const std::string& path);

// The settings the checkpoint was trained with: its kiln.config (parsed with the flag table's
// checks, its nesting bounded), or, in a checkpoint older than kiln.config, the loose keys
// the GANs and the LM kept (batch_size, seed, hidden, ...) through the same checks, on
// `config`'s defaults. kiln::Error "<path>: ..." for invalid JSON or values, a checkpoint
// that names no model, or a "model" that contradicts its kiln.config.
TrainConfig checkpoint_settings(const Metadata& metadata, const std::string& path);

}  // namespace kiln
