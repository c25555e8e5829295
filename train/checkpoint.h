// Training checkpoints: parameters, optimizer state, model buffers and the position in the data, in
// one safetensors file written atomically; the run's settings go in its __metadata__.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "graph/graph.h"
#include "train/checkpoint_metadata.h"

namespace kiln {

// Tensors are stored as "param/<name>", "state/<name>" (optimizer state) and
// "buffer/<name>" (a model's non-trainable state: running statistics, RNG step counters);
// device tensors are copied to the host.
void save_checkpoint(const std::filesystem::path& path, const std::vector<VariablePtr>& params,
                     const std::vector<VariablePtr>& state, const TrainingPosition& position,
                     const std::map<std::string, std::string>& settings,
                     const std::vector<VariablePtr>& buffers = {});

// kiln::Error unless a checkpoint could be saved at `path` now: not a directory or special file,
// in a directory that exists and is writable (checked before training, so that a bad
// --checkpoint fails at once rather than after an epoch of work).
void check_checkpoint_directory(const std::filesystem::path& path);

// A checkpoint file read and validated once: its metadata can be looked at (which model,
// which settings) before its tensors are copied into a model's variables.
class Checkpoint {
 public:
  explicit Checkpoint(const std::filesystem::path& path);  // kiln::Error naming the file
  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return file_.metadata; }
  // The metadata value of `key`, or "" when there is none.
  std::string metadata_value(const std::string& key) const;
  TrainingPosition position() const { return position_; }
  // Copies the tensors into the variables (see load_checkpoint); nothing is assigned unless
  // every variable has its tensor with the exact shape and dtype (or, for an f64 variable, an
  // f32 tensor of its shape, widened exactly: older checkpoints' Adam step count).
  void restore(const std::vector<VariablePtr>& params, const std::vector<VariablePtr>& state,
               const std::vector<VariablePtr>& buffers = {}) const;

 private:
  std::filesystem::path path_;
  SafetensorsFile file_;
  TrainingPosition position_;
};

// Loads into the variables (as host tensors; a GPU program uploads them at its next run).
// Every variable must be in the file with its exact shape and dtype: kiln::Error names the
// file and the tensor otherwise. Returns the position and fills `settings`.
TrainingPosition load_checkpoint(const std::filesystem::path& path,
                                 const std::vector<VariablePtr>& params,
                                 const std::vector<VariablePtr>& state,
                                 std::map<std::string, std::string>* settings = nullptr,
                                 const std::vector<VariablePtr>& buffers = {});

}  // namespace kiln
