// `trainer --config FILE`: a JSON object with the same keys as the trainer's flags
// ("epochs", "batch-size", "lr", ...); flags given on the command line override it. The
// same JSON goes into checkpoints' metadata.
#pragma once

#include <string>
#include <string_view>

#include "train/train.h"

namespace kiln {

// Applies the JSON text's settings to `config`. kiln::Error names `source` (the file) and
// the problem: invalid JSON, not an object, an unknown key, a value of the wrong type or
// out of range. Nothing is applied unless everything is valid.
TrainConfig parse_train_config(std::string_view json, const std::string& source,
                               TrainConfig config);
TrainConfig read_train_config(const std::string& path, TrainConfig config);

// Every config key with its value in `config`, as one JSON object (what checkpoints keep in
// their metadata); parse_train_config of it gives the same settings back. Settings that are
// "off" (max-steps -1, save-every 0) are null.
std::string train_config_json(const TrainConfig& config);

}  // namespace kiln
