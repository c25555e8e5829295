// Calls a generic lambda with a value of the C++ type that matches a DType.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"

namespace kiln {

template <class F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    case DType::i32:
      return f(std::int32_t{});
    case DType::i64:
      return f(std::int64_t{});
    case DType::u8:
      return f(std::uint8_t{});
    case DType::bf16:
      return f(bf16{});
    case DType::f16:
      return f(f16{});
  }
  KILN_ASSERT(false, "unknown dtype {}", static_cast<int>(dtype));
}

// Only the floating dtypes, for kernels that compute in floating point.
template <class F>
decltype(auto) visit_floating(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    default:
      break;
  }
  throw Error(
      fmt::format("{}: dtype {} is not supported (f32 or f64 expected)", op, dtype_name(dtype)));
}

}  // namespace kiln
