// The settings turned into what the compiler, the schedule and the optimizer take.
#include "train/config.h"

#include <fmt/format.h>

#include "gpu/cuda_runtime.h"

namespace kiln {

Device resolve_device(const std::string& name) {
  if (name == "cpu") return Device::cpu();
  if (name == "cuda") {
    KILN_CHECK(gpu::cuda_device_count() > 0, "--device cuda: {}", gpu::cuda_unavailable_reason());
    return Device::cuda();
  }
  if (name == "auto") return gpu::cuda_device_count() > 0 ? Device::cuda() : Device::cpu();
  throw Error(fmt::format("unknown device '{}' (cpu, cuda, auto)", name));
}

Precision precision_of(const DeviceSettings& d) {
  const std::optional<Precision> p = precision_from_name(d.precision);
  KILN_CHECK(p.has_value(), "unknown precision '{}' (fp32, tf32, bf16, fp16)", d.precision);
  KILN_CHECK(!d.tf32 || *p == Precision::fp32 || *p == Precision::tf32,
             "--tf32 with --precision {}: --tf32 means --precision tf32", d.precision);
  return d.tf32 ? Precision::tf32 : *p;
}

std::optional<LossScaleOptions> loss_scale_of(const DeviceSettings& d) {
  if (precision_of(d) != Precision::fp16) return std::nullopt;
  return LossScaleOptions{};
}

CompileOptions compile_options(const DeviceSettings& d) {
  return {.device = resolve_device(d.name),
          .cuda_graphs = d.cuda_graphs,
          .precision = precision_of(d),
          .cuda_streams = d.streams,
          .check_numerics = d.check_numerics,
          .deterministic = d.deterministic};
}

LrSchedule lr_schedule_of(const LoopSettings& l) {
  return {.kind = l.lr_schedule,
          .base_lr = l.lr,
          .warmup_steps = l.warmup_steps,
          .step_size = l.lr_step_size,
          .gamma = l.lr_gamma};
}

OptimizerConfig optimizer_config(const LoopSettings& l) {
  return {.name = l.optimizer, .lr = l.lr, .momentum = l.momentum, .weight_decay = l.weight_decay};
}

}  // namespace kiln
