// train_config_json: the settings of a model's task as the JSON of its checkpoints.
#include "train/config_file.h"
#include "train/flags.h"

namespace kiln {

std::string train_config_json(const TrainConfig& config) {
  const unsigned task = task_bit(model_info(config.model).task);
  nlohmann::json doc = nlohmann::json::object();
  for (const Flag& f : training_flags())
    if (f.saved && (f.tasks & task)) doc[f.name] = get_flag(f, config);
  return doc.dump();
}

}  // namespace kiln
