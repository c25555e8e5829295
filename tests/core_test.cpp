// core: shapes and broadcasting, tensors, dtypes, the Philox generator.
#include <doctest/doctest.h>

#include <cstdlib>
#include <set>

#include "core/env_switch.h"
#include "core/philox.h"
#include "core/tensor.h"

namespace kiln {

TEST_CASE("broadcast_shapes follows NumPy rules and names both shapes on failure") {
  CHECK(broadcast_shapes({64, 10}, {10}, "add") == Shape{64, 10});
  CHECK(broadcast_shapes({2, 1, 3}, {4, 1}, "add") == Shape{2, 4, 3});
  CHECK(broadcast_shapes({}, {3, 2}, "add") == Shape{3, 2});
  CHECK_THROWS_WITH_AS(broadcast_shapes({3, 4}, {3}, "mul"),
                       doctest::Contains("mul: shapes [3, 4] and [3]"), Error);
}

TEST_CASE("broadcast_strides puts zeros on broadcast axes") {
  CHECK(broadcast_strides({3, 1}, {2, 3, 4}) == std::vector<std::int64_t>{0, 1, 0});
  CHECK(broadcast_strides({4}, {2, 4}) == std::vector<std::int64_t>{0, 1});
}

TEST_CASE("normalize_axis accepts negative axes and rejects out-of-range ones") {
  CHECK(normalize_axis(-1, 3, "sum") == 2);
  CHECK_THROWS_WITH_AS(normalize_axis(3, 3, "sum"), doctest::Contains("axis 3 is out of range"),
                       Error);
}

TEST_CASE("tensors convert dtypes, reshape as views and narrow rows") {
  const Tensor t = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  CHECK(t.to(DType::i64).at(5) == 6);
  CHECK(t.to(DType::u8).dtype() == DType::u8);
  const Tensor r = t.reshape({3, 2});
  CHECK(r.storage() == t.storage());
  CHECK_THROWS_AS(t.reshape({4, 2}), Error);
  const Tensor row = t.narrow_rows(1, 1);
  CHECK(row.shape() == Shape{1, 3});
  CHECK(row.at(0) == 4);
  CHECK_THROWS_AS(t.narrow_rows(1, 2), Error);
  CHECK_THROWS_WITH_AS(t.data<double>(), doctest::Contains("f32 read as f64"), Error);
}

TEST_CASE("an environment switch is on unless set to 0") {
  const char* name = "KILN_TEST_ENV_SWITCH";
  ::unsetenv(name);
  CHECK(env_switch_on(name));
  for (const char* on : {"1", "", "00", "off"}) {
    ::setenv(name, on, 1);
    CHECK_MESSAGE(env_switch_on(name), on);
  }
  ::setenv(name, "0", 1);
  CHECK_FALSE(env_switch_on(name));
  ::unsetenv(name);
}

TEST_CASE("dtype names round-trip") {
  for (DType d :
       {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8})
    CHECK(dtype_from_name(dtype_name(d)) == d);
  CHECK_THROWS_AS(dtype_from_name("f8"), Error);
}

TEST_CASE("philox matches the Random123 known-answer vector") {
  // philox4x32-10, counter = 0, key = 0 (Random123 kat_vectors).
  const auto block = philox_block(0, 0);
  CHECK(block[0] == 0x6627e8d5u);
  CHECK(block[1] == 0xe169c58du);
  CHECK(block[2] == 0xbc57ac4cu);
  CHECK(block[3] == 0x9b00dbd8u);
}

TEST_CASE("philox: the full 128-bit counter matches the Random123 known answers") {
  // Random123's kat_vectors for philox4x32_10: counter (c0, c1, c2, c3), key (k0, k1).
  const auto ones = philox_block(~0ULL, ~0ULL, ~0ULL);
  CHECK(ones[0] == 0x408f276du);
  CHECK(ones[1] == 0x41c83b0eu);
  CHECK(ones[2] == 0xa20bc7c6u);
  CHECK(ones[3] == 0x6d5451fdu);
  const auto pi = philox_block(0x299f31d0a4093822ULL, 0x85a308d3243f6a88ULL, 0x0370734413198a2eULL);
  CHECK(pi[0] == 0xd16cfe09u);
  CHECK(pi[1] == 0x94fdccebu);
  CHECK(pi[2] == 0x5001e420u);
  CHECK(pi[3] == 0x24126ea1u);
}

TEST_CASE("philox fills are reproducible, depend on the seed, and have the right moments") {
  Tensor a = Tensor::empty({10000}, DType::f32), b = Tensor::empty({10000}, DType::f32),
         c = Tensor::empty({10000}, DType::f32);
  Philox(7).fill_uniform(a, -1, 1);
  Philox(7).fill_uniform(b, -1, 1);
  Philox(8).fill_uniform(c, -1, 1);
  double mean = 0, diff = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    CHECK(a.at(i) == b.at(i));
    CHECK(a.at(i) >= -1.0);
    CHECK(a.at(i) < 1.0);
    mean += a.at(i);
    diff += std::abs(a.at(i) - c.at(i));
  }
  CHECK(std::abs(mean / 10000) < 0.03);
  CHECK(diff > 1000);

  Tensor n = Tensor::empty({20000}, DType::f64);
  Philox(3).fill_normal(n, 2.0, 0.5);
  double sum = 0, sq = 0;
  for (std::int64_t i = 0; i < n.numel(); ++i) {
    sum += n.at(i);
    sq += n.at(i) * n.at(i);
  }
  const double m = sum / 20000, var = sq / 20000 - m * m;
  CHECK(m == doctest::Approx(2.0).epsilon(0.01));
  CHECK(std::sqrt(var) == doctest::Approx(0.5).epsilon(0.03));
}

TEST_CASE(
    "philox fill_normal: element i is Box-Muller on words of block offset + i / 4 (odd sizes "
    "too)") {
  for (std::int64_t n : {1, 6, 7, 13}) {
    Tensor t = Tensor::empty({n}, DType::f32);
    Philox rng(5, 9);
    rng.fill_normal(t, 1.0, 2.0);
    CHECK(rng.offset() == 9 + static_cast<std::uint64_t>((n + 3) / 4));
    for (std::int64_t i = 0; i < n; ++i) {  // the definition, element by element
      const auto block = philox_block(5, 9 + static_cast<std::uint64_t>(i / 4));
      const std::size_t pair = static_cast<std::size_t>(i % 4) / 2 * 2;
      const double radius =
          std::sqrt(-2.0 * std::log(1.0 - static_cast<double>(uniform_from_bits(block[pair]))));
      const double angle = 2.0 * M_PI * static_cast<double>(uniform_from_bits(block[pair + 1]));
      const double z = i % 2 == 0 ? radius * std::cos(angle) : radius * std::sin(angle);
      CHECK(t.at(i) == static_cast<float>(1.0 + 2.0 * z));
    }
  }
}

TEST_CASE(
    "philox fill_normal_part: parts on copies of one generator, covering the tensor, write "
    "fill_normal's bits and advance the stream as it does, and a bad part is an error") {
  for (std::int64_t n : {1, 7, 13, 800, 6401}) {
    for (DType dtype : {DType::f32, DType::f64}) {
      CAPTURE(n);
      Tensor whole = Tensor::empty({n}, dtype), parts = Tensor::zeros({n}, dtype);
      Philox rng(17, 4);
      rng.fill_normal(whole, 0.5, 3.0);
      for (std::int64_t k : {2, 0, 1}) {  // out of order, as threads finish
        const std::int64_t begin = n * k / 3 / 2 * 2, end = k == 2 ? n : n * (k + 1) / 3 / 2 * 2;
        Philox copy(17, 4);
        copy.fill_normal_part(parts, 0.5, 3.0, begin, end);
        CHECK(copy.offset() == rng.offset());
      }
      CHECK(std::memcmp(whole.raw(), parts.raw(), whole.nbytes()) == 0);
    }
  }
  Tensor t = Tensor::empty({10}, DType::f32);
  CHECK_THROWS_WITH_AS(Philox(1).fill_normal_part(t, 0, 1, 3, 10),
                       doctest::Contains("the first must be even"), Error);
  CHECK_THROWS_WITH_AS(Philox(1).fill_normal_part(t, 0, 1, 0, 11), doctest::Contains("[0, 11)"),
                       Error);
  Tensor half = Tensor::empty({10}, DType::bf16);
  CHECK_THROWS_WITH_AS(Philox(1).fill_normal_part(half, 0, 1, 0, 10),
                       doctest::Contains("f32 or f64 only"), Error);
}

TEST_CASE(
    "a philox stream continues where a split stream would: (seed, offset) is the whole state") {
  Philox whole(11);
  Tensor all = Tensor::empty({16}, DType::f32);
  whole.fill_uniform(all, 0, 1);
  Philox first(11);
  Tensor head = Tensor::empty({8}, DType::f32);
  first.fill_uniform(head, 0, 1);
  Philox resumed(11, first.offset());
  Tensor tail = Tensor::empty({8}, DType::f32);
  resumed.fill_uniform(tail, 0, 1);
  for (std::int64_t i = 0; i < 8; ++i) {
    CHECK(all.at(i) == head.at(i));
    CHECK(all.at(8 + i) == tail.at(i));
  }
}

}  // namespace kiln
