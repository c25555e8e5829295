// Checkpoint layout over core/safetensors.
#include "train/checkpoint.h"

#include <fmt/format.h>

#include "backends/host_copy.h"
#include "core/atomic_file.h"

namespace kiln {
namespace {

// An f32 tensor as f64 (exact).
Tensor widened(const Tensor& t) {
  Tensor wide = Tensor::empty(t.shape(), DType::f64);
  for (std::int64_t i = 0; i < t.numel(); ++i) wide.data<double>()[i] = t.data<float>()[i];
  return wide;
}

// The checked tensor for `var` (nothing is assigned until every tensor has been checked).
Tensor checked_tensor(const SafetensorsFile& file, const std::string& prefix,
                      const VariablePtr& var, const std::filesystem::path& path) {
  const std::string key = prefix + var->name;
  auto it = file.tensors.find(key);
  KILN_CHECK(it != file.tensors.end(),
             "{}: has no tensor '{}' (the checkpoint is of another model or optimizer)",
             path.string(), key);
  const Tensor& t = it->second;
  if (t.shape() == var->value.shape() && t.dtype() == DType::f32 &&
      var->value.dtype() == DType::f64)
    return widened(t);  // Adam's step count, f32 in checkpoints before it was kept in f64
  KILN_CHECK(t.shape() == var->value.shape() && t.dtype() == var->value.dtype(),
             "{}: tensor '{}' is {}{} but the model has {}{}", path.string(), key,
             dtype_name(t.dtype()), t.shape().str(), dtype_name(var->value.dtype()),
             var->value.shape().str());
  return t;
}

}  // namespace

void check_checkpoint_directory(const std::filesystem::path& path) {
  // What the save will check, before training: a file path whose target (through a symbolic
  // link) is absent or a regular file, in a directory where a file can be created.
  check_atomic_target(path, "--checkpoint " + path.string());
}

void save_checkpoint(const std::filesystem::path& path, const std::vector<VariablePtr>& params,
                     const std::vector<VariablePtr>& state, const TrainingPosition& position,
                     const std::map<std::string, std::string>& settings,
                     const std::vector<VariablePtr>& buffers) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const VariablePtr& p : params) tensors.emplace_back("param/" + p->name, to_host(p->value));
  for (const VariablePtr& s : state) tensors.emplace_back("state/" + s->name, to_host(s->value));
  for (const VariablePtr& b : buffers) tensors.emplace_back("buffer/" + b->name, to_host(b->value));
  std::map<std::string, std::string> metadata = settings;
  metadata["kiln.step"] = std::to_string(position.step);
  metadata["kiln.epoch"] = std::to_string(position.epoch);
  metadata["kiln.batch"] = std::to_string(position.batch);
  save_safetensors(path, tensors, metadata);
}

Checkpoint::Checkpoint(const std::filesystem::path& path)
    : path_(path), file_(load_safetensors(path)) {
  position_ = checkpoint_position(file_.metadata, path.string());
}

std::string Checkpoint::metadata_value(const std::string& key) const {
  auto it = file_.metadata.find(key);
  return it == file_.metadata.end() ? "" : it->second;
}

void Checkpoint::restore(const std::vector<VariablePtr>& params,
                         const std::vector<VariablePtr>& state,
                         const std::vector<VariablePtr>& buffers) const {
  std::vector<std::pair<VariablePtr, Tensor>> loaded;
  for (const VariablePtr& p : params)
    loaded.emplace_back(p, checked_tensor(file_, "param/", p, path_));
  for (const VariablePtr& s : state)
    loaded.emplace_back(s, checked_tensor(file_, "state/", s, path_));
  for (const VariablePtr& b : buffers)
    loaded.emplace_back(b, checked_tensor(file_, "buffer/", b, path_));
  for (auto& [var, tensor] : loaded) var->value = tensor;
}

TrainingPosition load_checkpoint(const std::filesystem::path& path,
                                 const std::vector<VariablePtr>& params,
                                 const std::vector<VariablePtr>& state,
                                 std::map<std::string, std::string>* settings,
                                 const std::vector<VariablePtr>& buffers) {
  const Checkpoint checkpoint(path);
  checkpoint.restore(params, state, buffers);
  if (settings) *settings = checkpoint.metadata();
  return checkpoint.position();
}

}  // namespace kiln
