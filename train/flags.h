// The one table of training flags: name, type, range, help and the tasks that use each,
// bound to its field of TrainConfig (whose initialiser is the default). The trainer's
// command line, --config JSON files, the checkpoint's kiln.config and --help all come from
// it, so a flag is declared and validated once.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "models/registry.h"
#include "train/config.h"

namespace kiln {

// The tasks a flag applies to, one bit per ModelTask (task_bit); kAllTasks includes tasks
// added later, so a new task gets every loop flag.
constexpr unsigned task_bit(ModelTask task) { return 1u << static_cast<unsigned>(task); }
enum TaskBits : unsigned {
  kClassifierTask = task_bit(ModelTask::image_classifier),
  kGanTask = task_bit(ModelTask::gan),
  kLmTask = task_bit(ModelTask::language_model),
  kImageTasks = kClassifierTask | kGanTask,
  kAllTasks = ~0u,
};

struct Flag {
  using Field =
      std::variant<std::function<std::int64_t&(TrainConfig&)>, std::function<int&(TrainConfig&)>,
                   std::function<double&(TrainConfig&)>, std::function<std::string&(TrainConfig&)>,
                   std::function<bool&(TrainConfig&)>, std::function<std::uint64_t&(TrainConfig&)>>;
  std::string name;  // "batch-size": --batch-size on the command line, the JSON key
  Field field;
  unsigned tasks = kAllTasks;
  std::string help;
  double min = -1e300, max = 1e300;  // numbers: the range [min, max] (min excluded if open)
  bool min_open = false;
  std::vector<std::string> choices;  // text: the allowed values (empty: any)
  bool has_off = false;              // integers: `off` means "not set", written as null
  std::int64_t off = 0;
  bool negated = false;  // booleans: the flag --no-x sets the field to false
  bool saved = true;     // false: command line only (the launcher's), not in JSON
};

const std::vector<Flag>& training_flags();
const Flag& training_flag(const std::string& name);  // kiln::Error for an unknown name

// Checks `value` against the flag's type and range and stores it; kiln::Error naming
// `where` (e.g. "--lr" or "c.json: 'lr'") and the value otherwise.
void set_flag(const Flag& flag, TrainConfig& config, const nlohmann::json& value,
              const std::string& where);
nlohmann::json get_flag(const Flag& flag, const TrainConfig& config);
// A command-line value ("1e-3", "adam") as the JSON value set_flag takes.
nlohmann::json flag_text_value(const Flag& flag, const std::string& text, const std::string& where);

// At most `max` characters of user text for a message (a longer one is cut, with "...").
std::string excerpt(std::string_view text, std::size_t max = 60);
// A JSON value as a message shows it: its dump, cut to `max` characters.
std::string json_excerpt(const nlohmann::json& value, std::size_t max = 60);

// kiln::Error unless every flag in `given` applies to the config's model; names the flag,
// the model and the models it is for.
void check_flags_apply(const std::set<std::string>& given, const std::string& model);
// kiln::Error unless every field of `config` is in its flag's range (the same checks as
// the command line and JSON; for configs built in code).
void validate_config(const TrainConfig& config);

}  // namespace kiln
