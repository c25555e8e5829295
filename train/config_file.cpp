// JSON configs through the flag table (train/flags.h), read with nlohmann::json.
#include "train/config_file.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "core/input_file.h"
#include "train/flags.h"

namespace kiln {
namespace {

// Arrays and objects nested deeper than this are refused while parsing (a config is one
// object of flat values; 200,000 nested arrays would overflow the stack where a value is
// serialised or destroyed).
constexpr int kMaxConfigDepth = 32;

// Parses `json`, refusing an object with the same key twice (nlohmann keeps the last) and
// nesting deeper than kMaxConfigDepth.
nlohmann::json parse_without_duplicates(std::string_view json, const std::string& source) {
  std::vector<std::set<std::string>> keys;  // per open object
  auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    KILN_CHECK(
        depth < kMaxConfigDepth || (event != Event::object_start && event != Event::array_start),
        "{}: arrays and objects nested more than {} deep", source, kMaxConfigDepth);
    if (event == nlohmann::json::parse_event_t::object_start) keys.emplace_back();
    if (event == nlohmann::json::parse_event_t::object_end) keys.pop_back();
    if (event == nlohmann::json::parse_event_t::key) {
      const auto key = parsed.get<std::string>();
      KILN_CHECK(keys.back().insert(key).second, "{}: the key '{}' is given twice", source,
                 excerpt(key));
    }
    return true;
  };
  try {
    return nlohmann::json::parse(json.begin(), json.end(), callback);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not valid JSON ({})", source, excerpt(e.what(), 200)));
  }
}

const Flag* find_flag(const std::string& name) {
  for (const Flag& f : training_flags())
    if (f.name == name) return &f;
  return nullptr;
}

}  // namespace

TrainConfig parse_train_config(std::string_view json, const std::string& source, TrainConfig config,
                               std::set<std::string>* given, bool saved) {
  const nlohmann::json doc = parse_without_duplicates(json, source);
  KILN_CHECK(doc.is_object(), "{}: a config must be a JSON object of flag names and values, not {}",
             source, doc.type_name());
  std::set<std::string> keys;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const Flag* flag = find_flag(it.key());
    if (flag == nullptr && saved && it.key() == "bidirectional") continue;  // retired
    KILN_CHECK(flag != nullptr, "{}: unknown key '{}' (the keys are the trainer's flag names)",
               source, excerpt(it.key()));
    KILN_CHECK(flag->saved, "{}: '{}' is a command-line flag only", source, it.key());
    set_flag(*flag, config, it.value(), fmt::format("{}: '{}'", source, it.key()));
    keys.insert(it.key());
  }
  if (given) given->insert(keys.begin(), keys.end());
  return config;
}

TrainConfig read_train_config(const std::string& path, TrainConfig config,
                              std::set<std::string>* given) {
  // A regular file of at most 1 MiB, checked before reading (a FIFO or /dev/zero never hangs it).
  const std::string text = read_regular_file(path, 1u << 20, "a config file");
  return parse_train_config(text, path, std::move(config), given);
}

}  // namespace kiln
