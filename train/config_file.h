// `trainer --config FILE`: a JSON object whose keys are the trainer's flag names ("epochs",
// "batch-size", "lr", ...; train/flags.h) with the same checks; flags given on the command
// line override it. Checkpoints keep the same JSON in their metadata (kiln.config).
#pragma once

#include <set>
#include <string>
#include <string_view>

#include "train/config.h"

namespace kiln {

// Applies the JSON text's settings to `config` and adds its keys to `given` (when not
// null). kiln::Error names `source` and the problem: invalid JSON, not an object, a
// duplicate or unknown key, a command-line-only flag, a value of the wrong type or out of
// range. Nothing is applied unless everything is valid. `saved`: the JSON comes from a
// checkpoint's kiln.config, where keys this build retired ("bidirectional") are skipped.
TrainConfig parse_train_config(std::string_view json, const std::string& source, TrainConfig config,
                               std::set<std::string>* given = nullptr, bool saved = false);
TrainConfig read_train_config(const std::string& path, TrainConfig config,
                              std::set<std::string>* given = nullptr);

// The config's settings as one JSON object (what checkpoints keep in kiln.config): every
// flag that applies to its model's task, except the launcher's command-line-only ones;
// "off" settings (max-steps -1, save-every 0) are null. parse_train_config of it gives the
// same settings back.
std::string train_config_json(const TrainConfig& config);

}  // namespace kiln
