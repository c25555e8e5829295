// Precision: how a compiled step stores and computes its floating values (DESIGN.md,
// Precision). fp32 everywhere; tf32: fp32 storage with TF32 tensor-core math in GEMMs; bf16 and
// fp16: the autocast pass stores activations and GEMM/convolution inputs in 16 bits, with fp32
// master weights, optimizer state and accumulation (fp16 with a dynamic loss scale).
#pragma once

#include <optional>
#include <string_view>

#include "core/dtype.h"

namespace kiln {

enum class Precision { fp32, tf32, bf16, fp16 };

constexpr const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32:
      return "fp32";
    case Precision::tf32:
      return "tf32";
    case Precision::bf16:
      return "bf16";
    case Precision::fp16:
      return "fp16";
  }
  return "?";
}

constexpr std::optional<Precision> precision_from_name(std::string_view name) {
  for (Precision p : {Precision::fp32, Precision::tf32, Precision::bf16, Precision::fp16})
    if (name == precision_name(p)) return p;
  return std::nullopt;
}

// The 16-bit storage dtype of bf16 and fp16 steps; nullopt for fp32 and tf32.
constexpr std::optional<DType> low_precision_dtype(Precision p) {
  if (p == Precision::bf16) return DType::bf16;
  if (p == Precision::fp16) return DType::f16;
  return std::nullopt;
}

}  // namespace kiln
