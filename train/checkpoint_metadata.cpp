// The data position and the settings in a checkpoint's metadata, checked.
#include "train/checkpoint_metadata.h"

#include <fmt/format.h>

#include <set>

#include "train/config_file.h"
#include "train/flags.h"

namespace kiln {
namespace {

// `text` as a decimal integer in [low, high], or kiln::Error naming `where`.
std::int64_t integer_in(const std::string& text, std::int64_t low, std::int64_t high,
                        const std::string& where) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;  // not a number, or beyond 64 bits
  }
  const std::string shown = text.size() > 40 ? text.substr(0, 40) + "..." : text;
  KILN_CHECK(used != 0 && used == text.size() && value >= low && value <= high,
             "{} is '{}', not an integer from {} to {}", where, shown, low, high);
  return value;
}

std::int64_t position_value(const Metadata& metadata, const std::string& key, std::int64_t low,
                            const std::string& path) {
  auto it = metadata.find(key);
  KILN_CHECK(it != metadata.end(), "{}: not a kiln checkpoint (no '{}' in its metadata)", path,
             key);
  return integer_in(it->second, low, kMaxCheckpointSteps,
                    fmt::format("{}: metadata '{}'", path, key));
}

// An older checkpoint's loose keys, each through its flag's checks.
TrainConfig legacy_settings(const Metadata& metadata, const std::string& path, TrainConfig config) {
  const std::pair<const char*, const char*> keys[] = {{"batch_size", "batch-size"},
                                                      {"seed", "seed"},
                                                      {"embedding", "embedding"},
                                                      {"hidden", "hidden"},
                                                      {"layers", "layers"},
                                                      {"seq_len", "seq-len"},
                                                      {"cell", "cell"}};
  for (const auto& [key, flag_name] : keys) {
    auto it = metadata.find(key);
    if (it == metadata.end()) continue;
    const Flag& flag = training_flag(flag_name);
    const std::string where = fmt::format("{}: metadata '{}'", path, key);
    set_flag(flag, config, flag_text_value(flag, it->second, where), where);
  }
  return config;
}

}  // namespace

TrainingPosition checkpoint_position(const Metadata& metadata, const std::string& path) {
  return {position_value(metadata, "kiln.step", 0, path),
          position_value(metadata, "kiln.epoch", 1, path),
          position_value(metadata, "kiln.batch", 0, path)};
}

TrainConfig checkpoint_settings(const Metadata& metadata, const std::string& path) {
  auto model = metadata.find("model");
  auto json = metadata.find("kiln.config");
  if (json == metadata.end() || json->second.empty()) {
    KILN_CHECK(model != metadata.end() && !model->second.empty(),
               "{}: not a training checkpoint (its metadata names no model)", path);
    TrainConfig config;
    config.model = model->second;
    return legacy_settings(metadata, path, config);
  }
  std::set<std::string> given;
  TrainConfig config = parse_train_config(json->second, path + ": metadata 'kiln.config'",
                                          TrainConfig{}, &given, true);
  if (model == metadata.end()) return config;
  KILN_CHECK(given.count("model") == 0 || model->second == config.model,
             "{}: its metadata 'model' is '{}' but its kiln.config is of model '{}'", path,
             model->second.substr(0, 100), config.model);
  config.model = model->second;
  return config;
}

}  // namespace kiln
