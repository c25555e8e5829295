// bf16 and f16: 16-bit floating-point storage types. Conversions from float round to nearest,
// ties to even (as the GPU's __float2bfloat16_rn and __float2half_rn do); conversions to float
// are exact. Arithmetic happens in float: the types convert to it implicitly and are made from
// it explicitly, so rounding to 16 bits is always visible in the code.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

namespace kiln {

// float -> bf16 bits, round to nearest even; a NaN stays a (quiet) NaN of the same sign.
constexpr std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
constexpr float bf16_bits_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

// float -> IEEE binary16 bits, round to nearest even, with subnormals; beyond 65504 (from
// 65520 on, the tie) the result is infinity; a NaN stays a quiet NaN of the same sign.
constexpr std::uint16_t float_to_f16_bits(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520
  if (a >= 0x38800000u) {  // normal in f16: >= 2^-14
    a += 0xfffu + ((a >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | ((a >> 13) - (112u << 10)));
  }
  if (a <= 0x33000000u) return sign;  // at most 2^-25, half the smallest subnormal: ties to 0
  // Subnormal: the value in units of 2^-24, rounded to nearest even.
  const std::uint32_t mantissa = (a & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126u - (a >> 23);
  std::uint32_t q = mantissa >> shift;
  const std::uint32_t rest = mantissa & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (q & 1u))) ++q;
  return static_cast<std::uint16_t>(sign | q);
}
constexpr float f16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// A 16-bit floating-point value stored as its bit pattern, with the format's conversions.
template <std::uint16_t (*kEncode)(float), float (*kDecode)(std::uint16_t)>
struct Float16Storage {
  std::uint16_t bits = 0;
  constexpr Float16Storage() = default;
  constexpr explicit Float16Storage(float f) : bits(kEncode(f)) {}
  constexpr explicit Float16Storage(double d) : bits(kEncode(static_cast<float>(d))) {}  // as GPU
  template <class I>
  requires std::is_integral_v<I>
  constexpr explicit Float16Storage(I i) : bits(kEncode(static_cast<float>(i))) {}
  constexpr operator float() const { return kDecode(bits); }
  static constexpr Float16Storage from_bits(std::uint16_t b) {
    Float16Storage v;
    v.bits = b;
    return v;
  }
};

using bf16 = Float16Storage<float_to_bf16_bits, bf16_bits_to_float>;
using f16 = Float16Storage<float_to_f16_bits, f16_bits_to_float>;

static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2);

}  // namespace kiln
