// Learning-rate schedules: warm-up, step decay, cosine decay, and the values validate() rejects.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "train/lr_schedule.h"

namespace kiln {

TEST_CASE("lr schedule: constant keeps the base rate at every step") {
  const LrSchedule s{.kind = "constant", .base_lr = 0.3};
  for (std::int64_t step : {0, 1, 17, 999}) CHECK(s.at(step, 1000) == 0.3);
}

TEST_CASE("lr schedule: warm-up ramps linearly from base/W to base, then the schedule starts") {
  const LrSchedule s{.kind = "constant", .base_lr = 0.2, .warmup_steps = 8};
  CHECK(s.at(0, 100) == doctest::Approx(0.2 / 8));
  CHECK(s.at(7, 100) == doctest::Approx(0.2));
  for (std::int64_t k = 1; k < 8; ++k)
    CHECK(s.at(k, 100) - s.at(k - 1, 100) == doctest::Approx(0.2 / 8));  // equal increments
  CHECK(s.at(8, 100) == 0.2);
  CHECK(s.at(99, 100) == 0.2);
}

TEST_CASE(
    "lr schedule: step multiplies by gamma every step_size steps (counted after the warm-up)") {
  const LrSchedule s{.kind = "step", .base_lr = 1.0, .step_size = 10, .gamma = 0.5};
  CHECK(s.at(0, 100) == 1.0);
  CHECK(s.at(9, 100) == 1.0);
  CHECK(s.at(10, 100) == 0.5);
  CHECK(s.at(19, 100) == 0.5);
  CHECK(s.at(25, 100) == 0.25);
  CHECK(s.at(99, 100) == doctest::Approx(std::pow(0.5, 9)));
  const LrSchedule warm{
      .kind = "step", .base_lr = 1.0, .warmup_steps = 5, .step_size = 10, .gamma = 0.1};
  CHECK(warm.at(4, 100) == 1.0);   // the warm-up's last step
  CHECK(warm.at(14, 100) == 1.0);  // 9 steps into the schedule
  CHECK(warm.at(15, 100) == doctest::Approx(0.1));
}

TEST_CASE("lr schedule: cosine falls monotonically from base to about 0 at the end of the run") {
  const LrSchedule s{.kind = "cosine", .base_lr = 0.1};
  const std::int64_t total = 1000;
  CHECK(s.at(0, total) == 0.1);
  CHECK(s.at(total / 2, total) == doctest::Approx(0.05));
  CHECK(s.at(total - 1, total) < 0.1 * 1e-4);
  CHECK(s.at(total - 1, total) > 0);
  CHECK(s.at(total, total) == doctest::Approx(0).epsilon(1e-12));
  CHECK(s.at(total + 50, total) ==
        doctest::Approx(0).epsilon(1e-12));  // past the horizon it stays at 0
  for (std::int64_t k = 1; k < total; ++k) REQUIRE(s.at(k, total) <= s.at(k - 1, total));
  // After a warm-up, the cosine spans the remaining steps.
  const LrSchedule warm{.kind = "cosine", .base_lr = 0.1, .warmup_steps = 100};
  CHECK(warm.at(99, total) == doctest::Approx(0.1));
  CHECK(warm.at(100, total) == 0.1);
  CHECK(warm.at(550, total) == doctest::Approx(0.05));
  CHECK(warm.at(total - 1, total) < 0.1 * 1e-4);
}

TEST_CASE("lr schedule: validate() rejects bad settings with the value in the message") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK_NOTHROW(
      LrSchedule{.kind = "step", .base_lr = 0.1, .step_size = 1, .gamma = 1.0}.validate());
  CHECK_NOTHROW(LrSchedule{.kind = "cosine", .base_lr = 0.1, .warmup_steps = 0}.validate());
  CHECK_THROWS_WITH_AS(LrSchedule{.kind = "linear"}.validate(),
                       doctest::Contains("unknown learning-rate schedule 'linear'"), Error);
  CHECK_THROWS_WITH_AS(LrSchedule{.base_lr = 0}.validate(),
                       doctest::Contains("must be positive (got 0)"), Error);
  CHECK_THROWS_WITH_AS(LrSchedule{.base_lr = nan}.validate(),
                       doctest::Contains("must be positive (got nan)"), Error);
  CHECK_THROWS_WITH_AS(LrSchedule{.warmup_steps = -1}.validate(),
                       doctest::Contains("warm-up steps must not be negative (got -1)"), Error);
  CHECK_THROWS_WITH_AS((LrSchedule{.kind = "step", .step_size = 0}.validate()),
                       doctest::Contains("step size of at least 1 (got 0)"), Error);
  CHECK_THROWS_WITH_AS((LrSchedule{.kind = "step", .step_size = 5, .gamma = 0}.validate()),
                       doctest::Contains("gamma must be in (0, 1] (got 0)"), Error);
  CHECK_THROWS_WITH_AS((LrSchedule{.kind = "step", .step_size = 5, .gamma = 1.5}.validate()),
                       doctest::Contains("(got 1.5)"), Error);
}

}  // namespace kiln
