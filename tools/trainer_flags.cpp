// The flag table as CLI11 options; every value is checked by train/flags.cpp's set_flag.
#include "tools/trainer_flags.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "train/flags.h"

namespace kiln::tools {
namespace {

// "[char-lstm]" or "[gan, dcgan]" for a flag that not every model uses.
std::string tasks_note(const Flag& f) {
  if (f.tasks == kAllTasks) return "";
  std::vector<std::string> models;
  for (const ModelInfo& m : model_infos())
    if (f.tasks & task_bit(m.task)) models.push_back(m.name);
  return fmt::format(" [{}]", fmt::join(models, ", "));
}

std::string help_of(const Flag& f) {
  std::string help = f.help + tasks_note(f);
  if (f.name == "model") {
    std::vector<std::string> names;
    for (const ModelInfo& m : model_infos()) names.push_back(m.name);
    help += fmt::format(": {}", fmt::join(names, ", "));
  }
  return help;
}

// INT, NUMBER, TEXT or the choices, for --help.
std::string type_of(const Flag& f, const nlohmann::json& value) {
  if (!f.choices.empty()) return fmt::format("{}", fmt::join(f.choices, "|"));
  if (f.field.index() == 2) return "NUMBER";  // double
  if (f.field.index() == 3) return "TEXT";    // std::string
  return value.is_null() || value.is_number() ? "INT" : "TEXT";
}

}  // namespace

void add_training_flags(CLI::App& app, const TrainConfig& defaults, FlagValues& values) {
  for (const Flag& f : training_flags()) {
    const std::string option = "--" + f.name;
    const nlohmann::json value = get_flag(f, defaults);
    if (value.is_boolean()) {
      app.add_flag(option, values.present[f.name], help_of(f));
      continue;
    }
    CLI::Option* o = app.add_option(option, values.text[f.name], help_of(f));
    o->type_name(type_of(f, value));
    if (!value.is_null() && !(value.is_string() && value.get<std::string>().empty()))
      o->default_str(value.is_string() ? value.get<std::string>() : value.dump());
  }
}

void apply_training_flags(const CLI::App& app, const FlagValues& values, TrainConfig& config,
                          std::set<std::string>& given) {
  for (const Flag& f : training_flags()) {
    const std::string option = "--" + f.name;
    if (app.count(option) == 0) continue;
    auto text = values.text.find(f.name);
    const nlohmann::json value =
        text == values.text.end() ? nlohmann::json(true) : flag_text_value(f, text->second, option);
    set_flag(f, config, value, option);
    given.insert(f.name);
  }
}

}  // namespace kiln::tools
