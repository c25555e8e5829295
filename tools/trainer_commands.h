// `trainer eval` and `trainer predict`: a trained classifier from its checkpoint, on the
// test set or on the images of an IDX file or of PNG/JPEG/BMP files.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"

namespace kiln::tools {

struct InferenceArgs {
  std::string checkpoint;
  std::vector<std::string> images;  // predict: an IDX image file, or PNG/JPEG/BMP files
  std::string output;               // predict: where the predictions go ("" or "-": stdout)
  std::string data_dir;             // eval: the test set's directory ("": the checkpoint's)
  std::string data;                 // eval: the --data source ("": the checkpoint's)
  bool synthetic = false;           // eval: the synthetic test set of the checkpoint's seed
  std::int64_t batch = 1000;        // examples per forward step
  std::string device = "auto";
  int threads = 0;
  std::string precision;  // "": the checkpoint's (--precision it was trained with)
};

// Adds the two subcommands to `app`; `args` receives their options.
CLI::App* add_eval_command(CLI::App& app, InferenceArgs& args);
CLI::App* add_predict_command(CLI::App& app, InferenceArgs& args);

// Run them (kiln::Error on a bad checkpoint, data or output file).
void run_eval(const InferenceArgs& args, Device device);
void run_predict(const InferenceArgs& args, Device device);

}  // namespace kiln::tools
