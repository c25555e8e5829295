// The config keys, each with its type check and its field; read through nlohmann::json.
#include "train/config_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

namespace kiln {
namespace {

using Setter = std::function<void(const nlohmann::json&, TrainConfig&, const std::string& where)>;
using Getter = std::function<nlohmann::json(const TrainConfig&)>;

// A config key: how to check and apply a JSON value, and how to write the field back.
struct Key {
  Setter set;
  Getter get;
};

// `off`, when given, is the field's "not set" value (e.g. max-steps -1): written and read as null.
Key integer(std::int64_t TrainConfig::*field, std::int64_t minimum,
            std::optional<std::int64_t> off = std::nullopt) {
  Setter set = [=](const nlohmann::json& v, TrainConfig& c, const std::string& where) {
    if (off && v.is_null()) {
      c.*field = *off;
      return;
    }
    KILN_CHECK(v.is_number_integer(), "{} must be an integer{}, not {}", where,
               off ? " or null" : "", v.dump());
    const auto value = v.get<std::int64_t>();
    KILN_CHECK(value >= minimum, "{} is {} but must be at least {}", where, value, minimum);
    c.*field = value;
  };
  Getter get = [=](const TrainConfig& c) {
    return off && c.*field == *off ? nlohmann::json(nullptr) : nlohmann::json(c.*field);
  };
  return {set, get};
}

Key real(double TrainConfig::*field, double minimum, bool strictly) {
  Setter set = [=](const nlohmann::json& v, TrainConfig& c, const std::string& where) {
    KILN_CHECK(v.is_number(), "{} must be a number, not {}", where, v.dump());
    const double value = v.get<double>();
    KILN_CHECK(std::isfinite(value) && (strictly ? value > minimum : value >= minimum),
               "{} is {} but must be {} {}", where, v.dump(), strictly ? ">" : ">=", minimum);
    c.*field = value;
  };
  return {set, [=](const TrainConfig& c) { return nlohmann::json(c.*field); }};
}

Key text(std::string TrainConfig::*field, std::vector<std::string> allowed) {
  Setter set = [=](const nlohmann::json& v, TrainConfig& c, const std::string& where) {
    KILN_CHECK(v.is_string(), "{} must be a string, not {}", where, v.dump());
    const auto value = v.get<std::string>();
    KILN_CHECK(allowed.empty() || std::find(allowed.begin(), allowed.end(), value) != allowed.end(),
               "{} is '{}' (one of: {})", where, value, fmt::join(allowed, ", "));
    c.*field = value;
  };
  return {set, [=](const TrainConfig& c) { return nlohmann::json(c.*field); }};
}

Key flag(bool TrainConfig::*field) {
  Setter set = [=](const nlohmann::json& v, TrainConfig& c, const std::string& where) {
    KILN_CHECK(v.is_boolean(), "{} must be true or false, not {}", where, v.dump());
    c.*field = v.get<bool>();
  };
  return {set, [=](const TrainConfig& c) { return nlohmann::json(c.*field); }};
}

Key seed() {
  Setter set = [](const nlohmann::json& v, TrainConfig& c, const std::string& where) {
    KILN_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0),
               "{} must be a non-negative integer, not {}", where, v.dump());
    c.seed = v.get<std::uint64_t>();
  };
  return {set, [](const TrainConfig& c) { return nlohmann::json(c.seed); }};
}

const std::map<std::string, Key>& keys() {
  static const std::map<std::string, Key> table = {
      {"model", text(&TrainConfig::model, {})},
      {"epochs", integer(&TrainConfig::epochs, 1)},
      {"batch-size", integer(&TrainConfig::batch_size, 1)},
      {"optimizer", text(&TrainConfig::optimizer, {"sgd", "adam", "adamw"})},
      {"lr", real(&TrainConfig::lr, 0, true)},
      {"lr-schedule", text(&TrainConfig::lr_schedule, {"constant", "step", "cosine"})},
      {"warmup-steps", integer(&TrainConfig::warmup_steps, 0)},
      {"lr-step-size", integer(&TrainConfig::lr_step_size, 1)},
      {"lr-gamma", real(&TrainConfig::lr_gamma, 0, true)},
      {"clip-grad-norm", real(&TrainConfig::clip_grad_norm, 0, false)},
      {"metrics", text(&TrainConfig::metrics_path, {})},
      {"metrics-every", integer(&TrainConfig::metrics_every, 1)},
      {"text", text(&TrainConfig::text_path, {})},
      {"seq-len", integer(&TrainConfig::seq_len, 1)},
      {"embedding", integer(&TrainConfig::embedding, 1)},
      {"hidden", integer(&TrainConfig::hidden, 1)},
      {"layers", integer(&TrainConfig::layers, 1)},
      {"cell", text(&TrainConfig::cell, {"lstm", "rnn"})},
      {"bidirectional", flag(&TrainConfig::bidirectional)},
      {"sample", integer(&TrainConfig::sample_chars, 0)},
      {"temperature", real(&TrainConfig::temperature, 0, true)},
      {"prime", text(&TrainConfig::prime, {})},
      {"samples-dir", text(&TrainConfig::samples_dir, {})},
      {"fid-classifier", text(&TrainConfig::fid_classifier, {})},
      {"momentum", real(&TrainConfig::momentum, 0, false)},
      {"weight-decay", real(&TrainConfig::weight_decay, 0, false)},
      {"data-dir", text(&TrainConfig::data_dir, {})},
      {"synthetic", flag(&TrainConfig::synthetic)},
      {"max-steps", integer(&TrainConfig::max_steps, 1, -1)},
      {"eval-batch", integer(&TrainConfig::eval_batch, 1)},
      {"checkpoint", text(&TrainConfig::checkpoint_path, {})},
      {"save-every", integer(&TrainConfig::save_every, 1, 0)},
      {"resume", text(&TrainConfig::resume_path, {})},
      {"check-numerics", flag(&TrainConfig::check_numerics)},
      {"deterministic", flag(&TrainConfig::deterministic)},
      {"tf32", flag(&TrainConfig::tf32)},
      {"trace", text(&TrainConfig::trace_path, {})},
      {"seed", seed()},
  };
  return table;
}

}  // namespace

TrainConfig parse_train_config(std::string_view json, const std::string& source,
                               TrainConfig config) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json.begin(), json.end());
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON ({})", source, e.what()));
  }
  KILN_CHECK(doc.is_object(), "{}: a config must be a JSON object of flag names and values, not {}",
             source, doc.type_name());
  std::vector<std::string> known;
  for (const auto& [key, entry] : keys()) known.push_back(key);
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    auto entry = keys().find(it.key());
    KILN_CHECK(entry != keys().end(), "{}: unknown key '{}' (known: {})", source, it.key(),
               fmt::join(known, ", "));
    entry->second.set(it.value(), config, fmt::format("{}: '{}'", source, it.key()));
  }
  return config;
}

std::string train_config_json(const TrainConfig& config) {
  nlohmann::json doc = nlohmann::json::object();
  for (const auto& [key, entry] : keys()) doc[key] = entry.get(config);
  return doc.dump();
}

TrainConfig read_train_config(const std::string& path, TrainConfig config) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "{}: cannot open the config file", path);
  std::ostringstream text;
  text << in.rdbuf();
  KILN_CHECK(text.str().size() <= (1u << 20), "{}: a config file larger than 1 MiB", path);
  return parse_train_config(text.str(), path, std::move(config));
}

}  // namespace kiln
