// A checkpoint's metadata as eval, predict, --sample and --resume read it: positions in
// range, settings through the flag table's checks, a model that agrees with its
// kiln.config, bounded nesting, and every error naming the file.
#include <doctest/doctest.h>

#include "train/checkpoint_metadata.h"

namespace kiln {
namespace {

Metadata position(const std::string& step, const std::string& epoch, const std::string& batch) {
  return {{"kiln.step", step}, {"kiln.epoch", epoch}, {"kiln.batch", batch}};
}

}  // namespace

TEST_CASE("checkpoint metadata: a position is read exactly and refused out of range") {
  const TrainingPosition p = checkpoint_position(position("40", "2", "8"), "c.safetensors");
  CHECK(p.step == 40);
  CHECK(p.epoch == 2);
  CHECK(p.batch == 8);
  const std::vector<std::pair<Metadata, std::string>> cases = {
      {position("9223372036854775800", "1", "0"),
       "c.safetensors: metadata 'kiln.step' is '9223372036854775800', not an integer from 0 to "
       "1000000000000000"},
      {position("99999999999999999999", "1", "0"),
       "metadata 'kiln.step' is '99999999999999999999'"},
      {position("1", "0", "0"), "c.safetensors: metadata 'kiln.epoch' is '0', not an integer"},
      {position("1", "1", "-3"), "c.safetensors: metadata 'kiln.batch' is '-3'"},
      {position("1", "1", "2x"), "c.safetensors: metadata 'kiln.batch' is '2x'"},
      {{{"kiln.step", "1"}}, "c.safetensors: not a kiln checkpoint (no 'kiln.epoch'"},
  };
  for (const auto& [metadata, message] : cases) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(checkpoint_position(metadata, "c.safetensors"),
                         doctest::Contains(message.c_str()), Error);
  }
}

TEST_CASE("checkpoint metadata: the settings, checked as the flags are") {
  const std::string config = R"({"model": "char-lstm", "hidden": 32, "seq-len": 16})";
  const TrainConfig c = checkpoint_settings({{"model", "char-lstm"}, {"kiln.config", config}}, "c");
  CHECK(c.model == "char-lstm");
  CHECK(c.lm.hidden == 32);
  CHECK(c.lm.seq_len == 16);
  const TrainConfig legacy = checkpoint_settings(
      {{"model", "char-lstm"}, {"hidden", "48"}, {"seed", "7"}, {"cell", "rnn"}}, "old");
  CHECK(legacy.lm.hidden == 48);
  CHECK(legacy.loop.seed == 7);
  CHECK(legacy.lm.cell == "rnn");
  const std::vector<std::pair<Metadata, std::string>> cases = {
      {{{"model", "lenet"}, {"kiln.config", config}},
       "c: its metadata 'model' is 'lenet' but its kiln.config is of model 'char-lstm'"},
      {{{"model", "char-lstm"}, {"hidden", "-1"}},
       "c: metadata 'hidden' is -1 but must be in [1, 16384]"},
      {{{"model", "char-lstm"}, {"hidden", "abc"}},
       "c: metadata 'hidden': 'abc' is not an integer"},
      {{{"model", "char-lstm"}, {"hidden", "100000000000"}},
       "c: metadata 'hidden' is 100000000000 but must be in [1, 16384]"},
      {{{"model", "char-lstm"}, {"cell", "gru"}},
       "c: metadata 'cell' is 'gru' (one of: lstm, rnn)"},
      {{{"kiln.config", std::string(200000, '[') + std::string(200000, ']')}},
       "c: metadata 'kiln.config': arrays and objects nested more than 32 deep"},
      {{{"kiln.config", R"({"hidden": 0})"}},
       "c: metadata 'kiln.config': 'hidden' is 0 but must be in [1, 16384]"},
      {{{"batch_size", "8"}}, "c: not a training checkpoint (its metadata names no model)"},
  };
  for (const auto& [metadata, message] : cases) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(checkpoint_settings(metadata, "c"), doctest::Contains(message.c_str()),
                         Error);
  }
}

}  // namespace kiln
