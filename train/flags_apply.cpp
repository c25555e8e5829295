// check_flags_apply: the flags given, against the tasks the registry of models names.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "train/flags.h"

namespace kiln {

void check_flags_apply(const std::set<std::string>& given, const std::string& model) {
  const ModelInfo& info = model_info(model);
  for (const std::string& name : given) {
    const Flag& f = training_flag(name);
    if (f.tasks & task_bit(info.task)) continue;
    std::vector<std::string> models;
    for (const ModelInfo& m : model_infos())
      if (f.tasks & task_bit(m.task)) models.push_back(m.name);
    throw Error(fmt::format("--{} does not apply to model {} (it is for: {})", name, model,
                            fmt::join(models, ", ")));
  }
}

}  // namespace kiln
