// random_uniform and Dropout on the CPU: the Philox stream it must reproduce, its
// statistics, the step counter (resume), masks, gradients and eval mode.
#include <doctest/doctest.h>

#include <cmath>

#include "core/philox.h"
#include "graph/autograd.h"
#include "graph/nn/dropout.h"
#include "graph/nn/functional.h"
#include "tests/support.h"

namespace kiln {
namespace {

Tensor step_tensor(std::int64_t step) { return Tensor::from_vector<std::int64_t>({}, {step}); }

// random_uniform's values and next step for `step`, run on the CPU.
std::pair<Tensor, std::int64_t> draw(const Shape& shape, std::uint64_t seed, std::int64_t step,
                                     DType dtype = DType::f32) {
  Graph g;
  const RandomUniform r = random_uniform(g.input("step", {}, DType::i64), shape, seed, dtype);
  g.output("u", r.values);
  g.output("next", r.next_step);
  const Outputs out = test::run_once(g, {{"step", step_tensor(step)}});
  return {out.at("u"), static_cast<std::int64_t>(out.at("next").item())};
}

}  // namespace

TEST_CASE("random_uniform: element i of step s is word i % 4 of Philox block (seed, (i / 4, s))") {
  const std::uint64_t seed = 0x123456789abcdefULL;
  for (DType dtype : {DType::f32, DType::f64}) {
    const auto [u, next] = draw({3, 7}, seed, 5, dtype);  // 21 values: a partial last block
    CHECK(next == 6);
    CHECK(u.dtype() == dtype);
    for (std::int64_t i = 0; i < 21; ++i) {
      const auto block = philox_block(seed, static_cast<std::uint64_t>(i / 4), 5);
      CHECK(u.at(i) ==
            static_cast<double>(uniform_from_bits(block[static_cast<std::size_t>(i % 4)])));
    }
  }
}

TEST_CASE(
    "random_uniform: uniform in 0 <= u < 1: mean, variance, deciles, steps and seeds give new "
    "values") {
  const std::int64_t n = 200000;
  const Tensor u = draw({n}, 7, 0).first;
  double sum = 0, sq = 0;
  std::vector<double> deciles(10, 0);
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = u.at(i);
    REQUIRE(v >= 0.0);
    REQUIRE(v < 1.0);
    sum += v;
    sq += v * v;
    deciles[static_cast<std::size_t>(v * 10)] += 1;
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  CHECK(std::abs(mean - 0.5) < 0.003);  // 4.6 sigma
  CHECK(std::abs(var - 1.0 / 12) < 0.002);
  for (double d : deciles) CHECK(std::abs(d / n - 0.1) < 0.004);  // 6 sigma
  const Tensor next_step = draw({n}, 7, 1).first, other_seed = draw({n}, 8, 0).first;
  std::int64_t same_step = 0, same_seed = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    same_step += u.at(i) == next_step.at(i);
    same_seed += u.at(i) == other_seed.at(i);
  }
  CHECK(same_step < 100);  // 2^-24 per element by chance
  CHECK(same_seed < 100);
}

TEST_CASE("Dropout: about p of the elements are zeroed, the others scaled by 1 / (1 - p)") {
  Philox rng(3);
  nn::Dropout drop(0.3, rng);
  Graph g;
  g.output("y", drop(g.input("x", {400, 250})));
  const Tensor y = test::run_once(g, {{"x", Tensor::full({400, 250}, 1.0, DType::f32)}}).at("y");
  std::int64_t kept = 0;
  double total = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    const double v = y.at(i);
    REQUIRE((v == 0.0 || v == static_cast<double>(1.0f * static_cast<float>(1.0 / 0.7))));
    kept += v != 0.0;
    total += v;
  }
  CHECK(std::abs(static_cast<double>(kept) / 1e5 - 0.7) < 0.007);  // 4.8 sigma
  CHECK(std::abs(total / 1e5 - 1.0) < 0.01);                       // the mean is kept
}

TEST_CASE(
    "Dropout: each run draws a new mask, the step buffer makes a resumed run repeat the stream") {
  Philox rng(4);
  nn::Dropout drop(0.5, rng);
  CHECK(drop.buffers().size() == 1);
  Graph g;
  g.output("y", drop(g.input("x", {64})));
  auto step = compile(g);
  const Tensor ones = Tensor::full({64}, 1.0, DType::f32);
  const Tensor first = step->run({{"x", ones}}).at("y");
  const Tensor second = step->run({{"x", ones}}).at("y");
  CHECK(drop.step()->value.item() == 2.0);
  CHECK(test::closeness(first, second, 0, 0) > 1.0);  // different masks
  drop.step()->value = step_tensor(1);  // as a checkpoint taken after the first step restores it
  const Tensor again = step->run({{"x", ones}}).at("y");
  CHECK(test::closeness(again, second, 0, 0) == 0.0);
  Philox other_rng(4);
  CHECK(nn::Dropout(0.5, other_rng).seed() ==
        drop.seed());  // the seed comes from the model's generator
  CHECK(nn::Dropout(0.5, other_rng).seed() != drop.seed());
}

TEST_CASE("Dropout: the gradient flows only through the kept elements, scaled like them") {
  Philox rng(5);
  nn::Dropout drop(0.4, rng);
  Graph g;
  const Value x = g.input("x", {50}, DType::f64);
  const Value y = drop(x);
  const Tensor rv = test::random_tensor({50}, DType::f64, 9);
  const Value r = g.constant(rv);
  g.output("y", y);
  g.output("dx", grad(sum_all(y * r), {x})[0]);
  const Tensor xv = test::random_tensor({50}, DType::f64, 10, 1, 2);  // never zero
  const Outputs out = test::run_once(g, {{"x", xv}});
  std::int64_t dropped = 0;
  for (std::int64_t i = 0; i < 50; ++i) {
    const double mask = out.at("y").at(i) / xv.at(i);  // 0 or 1 / 0.6
    CHECK(out.at("dx").at(i) == doctest::Approx(mask * rv.at(i)));
    dropped += mask == 0.0;
  }
  CHECK(dropped > 5);
  CHECK(dropped < 45);
}

TEST_CASE("Dropout: the identity in eval mode and for p = 0, p < 0 or p >= 1 is an error") {
  Philox rng(6);
  nn::Dropout drop(0.5, rng);
  drop.set_training(false);
  Graph g;
  const Value x = g.input("x", {8});
  CHECK(drop(x).ref() == x.ref());
  CHECK(g.assignments().empty());
  nn::Dropout none(0.0, rng);
  CHECK(none(x).ref() == x.ref());
  CHECK_THROWS_WITH_AS(nn::Dropout(1.0, rng),
                       doctest::Contains("Dropout: p is 1 but must be in [0, 1)"), Error);
  CHECK_THROWS_WITH_AS(nn::Dropout(-0.1, rng), doctest::Contains("must be in [0, 1)"), Error);
}

TEST_CASE("random_uniform: a step that is not an i64 scalar is a clear error") {
  Graph g;
  CHECK_THROWS_WITH_AS(random_uniform(g.input("s", {2}, DType::i64), {3}, 1),
                       doctest::Contains("the step must be an i64 scalar but is i64[2]"), Error);
  CHECK_THROWS_WITH_AS(random_uniform(g.input("f", {}), {3}, 1), doctest::Contains("but is f32[]"),
                       Error);
}

}  // namespace kiln
