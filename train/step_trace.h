// --trace for a step of several programs (a GAN's discriminator and generator steps): each
// program traces its run to a part file, and the parts become one Perfetto trace with one
// process per program, laid out one after the other as they ran.
#pragma once

#include <string>
#include <vector>

#include "train/task.h"

namespace kiln {

class StepTrace {
 public:
  // Arms every program's next run to trace into a part of `path`.
  StepTrace(const std::string& path, const std::vector<StepProgram>& programs);
  // After the runs: merges the parts into `path` (written atomically) and removes them.
  // kiln::Error naming the file if a part is missing or not a trace.
  void finish();

 private:
  std::string path_;
  std::vector<std::string> names_, parts_;
};

}  // namespace kiln
