// bf16 and f16: conversions from float against a reference that knows nothing of bit tricks
// (every representable value decoded, the nearest found by search, ties to the even pattern),
// on fresh random floats of every magnitude and on the special values; tensors and files.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/philox.h"
#include "core/safetensors.h"
#include "core/tensor.h"

namespace kiln {
namespace {

// The finite non-negative values of a 16-bit format, ascending, with their patterns.
struct Finite {
  std::vector<double> value;
  std::vector<std::uint16_t> bits;
};

template <class Decode>
Finite finite_values(Decode decode) {
  Finite f;
  for (std::uint32_t b = 0; b < 0x8000u; ++b) {
    const double v = decode(static_cast<std::uint16_t>(b));
    if (!std::isfinite(v)) continue;
    f.value.push_back(v);
    f.bits.push_back(static_cast<std::uint16_t>(b));
  }
  REQUIRE(std::is_sorted(f.value.begin(), f.value.end()));
  return f;
}

// Round-to-nearest-even by search over the decoded values; beyond the largest finite value
// by at least half its last step the result is infinity (inf_bits).
std::uint16_t reference_round(const Finite& f, float x, std::uint16_t inf_bits) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  const double top = f.value.back(), step = top - f.value[f.value.size() - 2];
  if (a >= top + step / 2) return sign | inf_bits;  // the tie goes to the even infinity
  const auto hi = std::lower_bound(f.value.begin(), f.value.end(), a) - f.value.begin();
  if (static_cast<std::size_t>(hi) == f.value.size()) return sign | f.bits.back();
  if (hi == 0 || f.value[static_cast<std::size_t>(hi)] == a)
    return sign | f.bits[static_cast<std::size_t>(hi)];
  const auto lo = static_cast<std::size_t>(hi - 1), h = static_cast<std::size_t>(hi);
  const double d_lo = a - f.value[lo], d_hi = f.value[h] - a;
  if (d_lo < d_hi) return sign | f.bits[lo];
  if (d_hi < d_lo) return sign | f.bits[h];
  return sign | ((f.bits[lo] & 1) == 0 ? f.bits[lo] : f.bits[h]);
}

// Random floats: every exponent equally likely, random mantissa and sign, plus exact ties.
std::vector<float> random_floats(std::uint64_t seed, int n) {
  std::mt19937_64 gen(seed);
  std::vector<float> out;
  for (int i = 0; i < n; ++i) {
    std::uint32_t u = static_cast<std::uint32_t>(gen());
    const std::uint32_t exponent = static_cast<std::uint32_t>(gen() % 255);  // no inf/NaN
    u = (u & 0x807fffffu) | (exponent << 23);
    if (i % 8 == 0) u = (u & 0xffff0000u) | 0x8000u;  // a bf16 tie
    if (i % 8 == 1) u = (u & 0xffffe000u) | 0x1000u;  // an f16 tie (normal range)
    out.push_back(std::bit_cast<float>(u));
  }
  return out;
}

}  // namespace

TEST_CASE("float to bf16 rounds to nearest even on fresh random floats of every magnitude") {
  const Finite f = finite_values([](std::uint16_t b) { return double{bf16_bits_to_float(b)}; });
  for (float x : random_floats(std::random_device{}(), 200000)) {
    CAPTURE(x);
    REQUIRE(float_to_bf16_bits(x) == reference_round(f, x, 0x7f80));
  }
}

TEST_CASE("float to f16 rounds to nearest even, subnormals and overflow included") {
  const Finite f = finite_values([](std::uint16_t b) { return double{f16_bits_to_float(b)}; });
  std::vector<float> xs = random_floats(std::random_device{}(), 200000);
  for (float x : {65504.0f, 65519.99f, 65520.0f, 0x1p-24f, 0x1p-25f, 0x1.000002p-25f, 0x1.8p-24f,
                  0x1p-14f, 0x1.ffcp-15f, 1.0f / 3.0f, -2.5e-6f})
    xs.push_back(x);
  for (float x : xs) {
    CAPTURE(x);
    REQUIRE(float_to_f16_bits(x) == reference_round(f, x, 0x7c00));
  }
}

TEST_CASE("every 16-bit pattern decodes exactly and encodes back to itself") {
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float from_bf16 = bf16_bits_to_float(bits), from_f16 = f16_bits_to_float(bits);
    if (std::isnan(from_bf16)) {
      CHECK(std::isnan(bf16_bits_to_float(float_to_bf16_bits(from_bf16))));
    } else {
      REQUIRE(float_to_bf16_bits(from_bf16) == bits);
    }
    if (std::isnan(from_f16)) {
      CHECK(std::isnan(f16_bits_to_float(float_to_f16_bits(from_f16))));
    } else {
      REQUIRE(float_to_f16_bits(from_f16) == bits);
    }
  }
  CHECK(f16_bits_to_float(0x3c00) == 1.0f);
  CHECK(f16_bits_to_float(0x7bff) == 65504.0f);
  CHECK(f16_bits_to_float(0x0001) == 0x1p-24f);
  CHECK(bf16_bits_to_float(0x3f80) == 1.0f);
  CHECK(std::isinf(float{bf16(3.4e38f * 10)}));
  CHECK(std::signbit(float{f16(-0.0f)}));
  CHECK(std::isnan(float{bf16(std::numeric_limits<float>::quiet_NaN())}));
}

TEST_CASE("bf16 and f16 tensors: names, fills, conversions and element access") {
  CHECK(dtype_from_name("bfloat16") == DType::bf16);
  CHECK(dtype_from_name("F16") == DType::f16);
  CHECK(dtype_name(DType::bf16) == "bf16");
  CHECK(dtype_size(DType::f16) == 2);
  CHECK(is_floating(DType::bf16));
  CHECK(is_low_precision(DType::f16));
  CHECK_FALSE(is_low_precision(DType::f32));
  const Tensor t = Tensor::full({3}, 1.0 / 3.0, DType::bf16);
  CHECK(t.at(2) == static_cast<double>(bf16_bits_to_float(0x3eab)));  // 0.333984375
  const Tensor v = Tensor::from_values({3}, std::vector<double>{1.5, -70000.0, 1e-8}, DType::f16);
  CHECK(v.at(0) == 1.5);
  CHECK(std::isinf(v.at(1)));
  CHECK(v.at(2) == 0.0);  // below half the smallest subnormal (2^-25 ~ 3e-8): rounds to zero
  const Tensor f = Tensor::from_values({2}, std::vector<double>{0.1, 1000.7}, DType::f32);
  const Tensor b = f.to(DType::bf16);
  CHECK(b.at(0) == static_cast<double>(float{bf16(0.1f)}));
  CHECK(b.at(1) == 1000.0);  // bf16 has 8 significant bits: 1000.7 -> 1000
  CHECK(b.to(DType::f32).at(1) == 1000.0f);
  CHECK(f.to(DType::f16).at(1) == 1000.5);  // f16: steps of 0.5 at 1000
}

TEST_CASE("bf16 and f16 tensors round-trip through a safetensors file as BF16 and F16") {
  const auto path = std::filesystem::temp_directory_path() /
                    ("kiln-half-test-" + std::to_string(::getpid()) + ".safetensors");
  const Tensor b =
      Tensor::from_values({2, 2}, std::vector<double>{1, -2.5, 3e30, 1e-3}, DType::bf16);
  const Tensor h = Tensor::from_values({3}, std::vector<double>{0.5, 65504, -6e-8}, DType::f16);
  save_safetensors(path.string(), {{"b", b}, {"h", h}}, {});
  const SafetensorsFile file = load_safetensors(path.string());
  const Tensor b2 = file.tensors.at("b"), h2 = file.tensors.at("h");
  REQUIRE(b2.dtype() == DType::bf16);
  REQUIRE(h2.dtype() == DType::f16);
  CHECK(std::memcmp(b2.raw(), b.raw(), b.nbytes()) == 0);
  CHECK(std::memcmp(h2.raw(), h.raw(), h.nbytes()) == 0);
  std::filesystem::remove(path);
}

TEST_CASE("Philox fills bf16 and f16 tensors with the f32 stream rounded to nearest even") {
  for (DType low : {DType::bf16, DType::f16}) {
    Tensor wide = Tensor::empty({37}, DType::f32), narrow = Tensor::empty({37}, low);
    Philox(9).fill_uniform(wide, -3, 3);
    Philox(9).fill_uniform(narrow, -3, 3);
    const Tensor rounded = wide.to(low);
    CHECK(std::memcmp(narrow.raw(), rounded.raw(), rounded.nbytes()) == 0);
    Philox(4).fill_normal(wide, 0, 1);
    Philox(4).fill_normal(narrow, 0, 1);
    CHECK(std::memcmp(narrow.raw(), wide.to(low).raw(), narrow.nbytes()) == 0);
  }
}

}  // namespace kiln
