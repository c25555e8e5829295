// trainer --config: JSON settings with the flags' names, validated before anything applies.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "train/config_file.h"
#include "train/flags.h"

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
      {R"({"epochs": 0})", "c.json: 'epochs' is 0 but must be in [1, 1e+09]"},
      {R"({"lr": -1})", "c.json: 'lr' is -1 but must be in (0, 1e+12]"},
      {R"({"lr": 1e-310})", "c.json: 'lr' is 1e-310, too close to 0 to be held exactly"},
      {R"({"hidden": 100000000000})", "c.json: 'hidden' is 100000000000 but must be in [1, 16384]"},
      {R"({"seed": 99999999999999999999999})",
       "c.json: 'seed' must be an integer, not 9.999999999999999e+22"},
      {R"({"lr": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]})",
       "c.json: arrays and objects nested more than 32 deep"},
      {R"({"prime": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]})",
       "c.json: 'prime' must be a string, not "
       "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]..."},
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

namespace kiln {

TEST_CASE("the flag table: unique names, defaults in range, every saved flag in some task's JSON") {
  std::set<std::string> names;
  for (const Flag& f : training_flags()) {
    CAPTURE(f.name);
    CHECK(names.insert(f.name).second);
    CHECK(!f.help.empty());
  }
  CHECK_NOTHROW(validate_config(TrainConfig{}));
  std::set<std::string> saved;
  for (const char* model : {"lenet", "gan", "char-lstm"}) {
    TrainConfig c;
    c.model = model;
    const nlohmann::json doc = nlohmann::json::parse(train_config_json(c));
    for (const auto& [key, value] : doc.items()) saved.insert(key);
  }
  for (const Flag& f : training_flags()) CHECK(saved.count(f.name) == (f.saved ? 1u : 0u));
}

TEST_CASE("a value from the command line goes through the same check as from JSON") {
  TrainConfig c;
  const Flag& lr = training_flag("lr");
  set_flag(lr, c, flag_text_value(lr, "0.25", "--lr"), "--lr");
  CHECK(c.loop.lr == 0.25);
  CHECK_THROWS_WITH_AS(flag_text_value(lr, "fast", "--lr"),
                       doctest::Contains("--lr: 'fast' is not a number"), Error);
  CHECK_THROWS_WITH_AS(set_flag(lr, c, flag_text_value(lr, "0", "--lr"), "--lr"),
                       doctest::Contains("--lr is 0.0 but must be in (0, 1e+12]"), Error);
  const Flag& max_steps = training_flag("max-steps");
  CHECK_THROWS_WITH_AS(
      set_flag(max_steps, c, flag_text_value(max_steps, "0", "--max-steps"), "--max-steps"),
      doctest::Contains("--max-steps is 0 but must be in [1, 1e+15]"), Error);
  c.loop.epochs = 0;  // a config built in code is checked by the same table
  CHECK_THROWS_WITH_AS(validate_config(c),
                       doctest::Contains("--epochs is 0 but must be in [1, 1e+09]"), Error);
}

TEST_CASE("command-line numbers are parsed exactly: never wrapped, clamped or rounded to 0") {
  const Flag& seed = training_flag("seed");
  const Flag& lr = training_flag("lr");
  TrainConfig c;
  set_flag(seed, c, flag_text_value(seed, "18446744073709551615", "--seed"), "--seed");
  CHECK(c.loop.seed == 18446744073709551615u);
  for (const char* text : {"18446744073709551616", "99999999999999999999999"}) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(flag_text_value(seed, text, "--seed"),
                         doctest::Contains("is out of range (an integer from 0 to "
                                           "18446744073709551615)"),
                         Error);
  }
  CHECK_THROWS_WITH_AS(set_flag(seed, c, flag_text_value(seed, "-1", "--seed"), "--seed"),
                       doctest::Contains("--seed is -1 but must be at least 0"), Error);
  CHECK(c.loop.seed == 18446744073709551615u);  // nothing applied
  CHECK_THROWS_WITH_AS(flag_text_value(lr, "1e-310", "--lr"),
                       doctest::Contains("--lr: '1e-310' is too close to 0 to be held exactly"),
                       Error);
  CHECK_THROWS_WITH_AS(flag_text_value(lr, "1e400", "--lr"),
                       doctest::Contains("--lr: '1e400' is out of range"), Error);
  CHECK_THROWS_WITH_AS(flag_text_value(lr, " 1", "--lr"),
                       doctest::Contains("--lr: ' 1' is not a number"), Error);
  const Flag& threads = training_flag("threads");
  CHECK_THROWS_WITH_AS(
      set_flag(threads, c, flag_text_value(threads, "100000", "--threads"), "--threads"),
      doctest::Contains("--threads is 100000 but must be in [0, 4096]"), Error);
}

TEST_CASE("every numeric flag has a range the program can run") {
  for (const Flag& f : training_flags()) {
    CAPTURE(f.name);
    const bool text_or_bool = f.field.index() == 3 || f.field.index() == 4;
    const bool seed = f.name == "seed";  // any 64-bit value: the type is its range
    if (!text_or_bool && !seed) CHECK(f.max < 1e300);
  }
}

TEST_CASE("a config whose values are long or deep is refused in one short line") {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  CHECK_THROWS_WITH_AS(parse_train_config(deep, "c.json", TrainConfig{}),
                       "c.json: arrays and objects nested more than 32 deep", Error);
  const std::string long_text = R"({"optimizer": ")" + std::string(100000, 'x') + R"("})";
  try {
    parse_train_config(long_text, "c.json", TrainConfig{});
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).size() < 200);
  }
}

TEST_CASE("flags that do not apply to the model are named with the models they are for") {
  CHECK_NOTHROW(check_flags_apply({"lr", "epochs", "synthetic"}, "gan"));
  CHECK_THROWS_WITH_AS(check_flags_apply({"hidden"}, "resnet"),
                       doctest::Contains("--hidden does not apply to model resnet (it is for: "
                                         "char-lstm)"),
                       Error);
  CHECK_THROWS_WITH_AS(check_flags_apply({"eval-batch"}, "dcgan"),
                       doctest::Contains("--eval-batch does not apply to model dcgan"), Error);
}

}  // namespace kiln
