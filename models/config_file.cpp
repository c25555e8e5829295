// The config keys, each with its type check and its field; read through nlohmann::json.
#include "models/config_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

namespace kiln {
namespace {

using Setter = std::function<void(const nlohmann::json&, TrainConfig&, const std::string& where)>;

Setter integer(std::int64_t TrainConfig::*field, std::int64_t minimum) {
  return [=](const nlohmann::json& v, TrainConfig& c, const std::string& where) {
    KILN_CHECK(v.is_number_integer(), "{} must be an integer, not {}", where, v.dump());
    const auto value = v.get<std::int64_t>();
    KILN_CHECK(value >= minimum, "{} is {} but must be at least {}", where, value, minimum);
    c.*field = value;
  };
}

Setter real(double TrainConfig::*field, double minimum, bool strictly) {
  return [=](const nlohmann::json& v, TrainConfig& c, const std::string& where) {
    KILN_CHECK(v.is_number(), "{} must be a number, not {}", where, v.dump());
    const double value = v.get<double>();
    KILN_CHECK(std::isfinite(value) && (strictly ? value > minimum : value >= minimum), "{} is {} but must be {} {}", where,
               v.dump(), strictly ? ">" : ">=", minimum);
    c.*field = value;
  };
}

Setter text(std::string TrainConfig::*field, std::vector<std::string> allowed) {
  return [=](const nlohmann::json& v, TrainConfig& c, const std::string& where) {
    KILN_CHECK(v.is_string(), "{} must be a string, not {}", where, v.dump());
    const auto value = v.get<std::string>();
    KILN_CHECK(allowed.empty() || std::find(allowed.begin(), allowed.end(), value) != allowed.end(), "{} is '{}' (one of: {})", where,
               value, fmt::join(allowed, ", "));
    c.*field = value;
  };
}

Setter flag(bool TrainConfig::*field) {
  return [=](const nlohmann::json& v, TrainConfig& c, const std::string& where) {
    KILN_CHECK(v.is_boolean(), "{} must be true or false, not {}", where, v.dump());
    c.*field = v.get<bool>();
  };
}

const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> table = {
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
      {"max-steps", integer(&TrainConfig::max_steps, 1)},
      {"eval-batch", integer(&TrainConfig::eval_batch, 1)},
      {"checkpoint", text(&TrainConfig::checkpoint_path, {})},
      {"save-every", integer(&TrainConfig::save_every, 1)},
      {"resume", text(&TrainConfig::resume_path, {})},
      {"check-numerics", flag(&TrainConfig::check_numerics)},
      {"deterministic", flag(&TrainConfig::deterministic)},
      {"tf32", flag(&TrainConfig::tf32)},
      {"trace", text(&TrainConfig::trace_path, {})},
      {"seed", [](const nlohmann::json& v, TrainConfig& c, const std::string& where) {
         KILN_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0), "{} must be a non-negative integer, not {}",
                    where, v.dump());
         c.seed = v.get<std::uint64_t>();
       }},
  };
  return table;
}

}  // namespace

TrainConfig parse_train_config(std::string_view json, const std::string& source, TrainConfig config) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json.begin(), json.end());
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON ({})", source, e.what()));
  }
  KILN_CHECK(doc.is_object(), "{}: a config must be a JSON object of flag names and values, not {}", source, doc.type_name());
  std::vector<std::string> known;
  for (const auto& [key, setter] : setters()) known.push_back(key);
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    auto setter = setters().find(it.key());
    KILN_CHECK(setter != setters().end(), "{}: unknown key '{}' (known: {})", source, it.key(), fmt::join(known, ", "));
    setter->second(it.value(), config, fmt::format("{}: '{}'", source, it.key()));
  }
  return config;
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
