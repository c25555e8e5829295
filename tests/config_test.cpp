// trainer --config: JSON settings with the flags' names, validated before anything applies.
#include <doctest/doctest.h>

#include "train/config_file.h"

namespace kiln {

TEST_CASE("a config file sets the keys it names and leaves the rest") {
  TrainConfig base;
  base.loop.seed = 7;
  const TrainConfig c =
      parse_train_config(R"({"epochs": 3, "batch-size": 32, "lr": 0.01, "optimizer": "sgd",
    "lr-schedule": "constant", "synthetic": true, "seed": 11})",
                         "c.json", base);
  CHECK(c.loop.epochs == 3);
  CHECK(c.loop.batch_size == 32);
  CHECK(c.loop.lr == doctest::Approx(0.01));
  CHECK(c.loop.optimizer == "sgd");
  CHECK(c.loop.lr_schedule == "constant");
  CHECK(c.images.synthetic);
  CHECK(c.loop.seed == 11);
  CHECK(c.model == base.model);
}

TEST_CASE("a bad config names the file and the problem, and applies nothing") {
  const TrainConfig base;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{", "c.json: not valid JSON"},
      {"[1, 2]", "c.json: a config must be a JSON object"},
      {R"({"epochs": "two"})", "c.json: 'epochs' must be an integer, not \"two\""},
      {R"({"epochs": 0})", "c.json: 'epochs' is 0 but must be at least 1"},
      {R"({"lr": -1})", "c.json: 'lr' is -1 but must be > 0"},
      {R"({"optimizer": "rmsprop"})",
       "c.json: 'optimizer' is 'rmsprop' (one of: sgd, adam, adamw)"},
      {R"({"lrr": 0.1})", "c.json: unknown key 'lrr'"},
      {R"({"synthetic": 1})", "c.json: 'synthetic' must be true or false"},
      {R"({"seed": -3})", "c.json: 'seed' is -3 but must be at least 0"},
      {R"({"epochs": 2, "epochs": 3})", "c.json: the key 'epochs' is given twice"},
      {R"({"ranks": 2})", "c.json: 'ranks' is a command-line flag only"},
      {R"({"momentum": 1.5})", "c.json: 'momentum' is 1.5 but must be in [0, 1]"},
      {R"({"epochs": 5, "batch-size": 1e400})", "c.json: not valid JSON"},
  };
  for (const auto& [text, message] : cases) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(parse_train_config(text, "c.json", base),
                         doctest::Contains(message.c_str()), Error);
  }
  CHECK_THROWS_WITH_AS(read_train_config("/nonexistent/c.json", base),
                       doctest::Contains("/nonexistent/c.json: cannot open"), Error);
}

}  // namespace kiln
