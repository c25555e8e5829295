// Sizes and names of element types.
#include "core/dtype.h"

#include "core/error.h"

namespace kiln {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
    case DType::bf16:
    case DType::f16:
      return 2;
  }
  KILN_ASSERT(false, "unknown dtype {}", static_cast<int>(dtype));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
  }
  KILN_ASSERT(false, "unknown dtype {}", static_cast<int>(dtype));
}

DType dtype_from_name(std::string_view name) {
  if (name == "f32" || name == "float32" || name == "F32") return DType::f32;
  if (name == "f64" || name == "float64" || name == "F64") return DType::f64;
  if (name == "i32" || name == "int32" || name == "I32") return DType::i32;
  if (name == "i64" || name == "int64" || name == "I64") return DType::i64;
  if (name == "u8" || name == "uint8" || name == "U8") return DType::u8;
  if (name == "bf16" || name == "bfloat16" || name == "BF16") return DType::bf16;
  if (name == "f16" || name == "float16" || name == "half" || name == "F16") return DType::f16;
  throw Error(
      fmt::format("unknown dtype '{}' (expected f32, f64, bf16, f16, i32, i64 or u8)", name));
}

bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || is_low_precision(dtype);
}

bool is_low_precision(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }

}  // namespace kiln
