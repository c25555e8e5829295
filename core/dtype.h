// Element types of tensors.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/half.h"

namespace kiln {

// bf16 and f16 are storage types: kernels compute in float and round where they store.
enum class DType : std::uint8_t { f32, f64, i32, i64, u8, bf16, f16 };

std::size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
// Parses "f32", "float32", ...; throws kiln::Error on an unknown name.
DType dtype_from_name(std::string_view name);
bool is_floating(DType dtype);       // f32, f64, bf16, f16
bool is_low_precision(DType dtype);  // bf16, f16

// The DType of a C++ scalar type, for typed access to tensor data.
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<std::uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::f16;
}

// x[0, n) rounded in place to `dtype` and held as float: what a bf16/f16 value computed in
// float holds once stored (the CPU's low-precision kernels and groups); f32 stays as it is.
inline void round_to(DType dtype, float* x, std::int64_t n) {
  if (dtype == DType::bf16)
    for (std::int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(bf16(x[i]));
  else if (dtype == DType::f16)
    for (std::int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(f16(x[i]));
}

}  // namespace kiln
