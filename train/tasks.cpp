// The task registry: one line per task.
#include "train/tasks.h"

namespace kiln {

const std::vector<TaskEntry>& task_entries() {
  static const std::vector<TaskEntry> entries = {
      classifier_task(),
      gan_task(),
      language_model_task(),
  };
  return entries;
}

const TaskEntry& task_entry(const std::string& model) {
  const ModelTask kind = model_info(model).task;
  for (const TaskEntry& e : task_entries())
    if (e.kind == kind) return e;
  KILN_ASSERT(false, "model {} has a task without an entry", model);
}

}  // namespace kiln
