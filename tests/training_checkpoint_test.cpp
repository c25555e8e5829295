// The training config in checkpoints: every key round-trips through JSON, checkpoints carry
// it, a resume with settings that would change the data order is refused, and a saved
// classifier loads back with the accuracy it was trained to.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "train/config_file.h"
#include "train/evaluate.h"
#include "train/saved_classifier.h"

namespace kiln {
namespace {

struct TempDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("kiln-train-ckpt-" + std::to_string(::getpid()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() { std::filesystem::remove_all(path); }
};

TrainConfig short_run(const std::filesystem::path& checkpoint) {
  TrainConfig c;
  c.synthetic = true;
  c.progress = false;
  c.epochs = 1;
  c.batch_size = 32;
  c.max_steps = 20;
  c.seed = 3;
  c.checkpoint_path = checkpoint.string();
  return c;
}

}  // namespace

TEST_CASE(
    "train_config_json writes every key, and parse_train_config reads the same settings back") {
  TrainConfig c;
  c.model = "lenet";
  c.epochs = 7;
  c.batch_size = 48;
  c.optimizer = "sgd";
  c.lr = 0.0123;
  c.lr_schedule = "step";
  c.warmup_steps = 5;
  c.lr_step_size = 77;
  c.lr_gamma = 0.3;
  c.clip_grad_norm = 2.5;
  c.momentum = 0.8;
  c.weight_decay = 1e-4;
  c.seed = 12345678901234ULL;
  c.synthetic = true;
  c.max_steps = 99;
  c.save_every = 10;
  c.bidirectional = true;
  c.prime = "Once upon \"a\" time\n";
  c.temperature = 0.7;
  const std::string json = train_config_json(c);
  const nlohmann::json doc = nlohmann::json::parse(json);
  CHECK(doc.size() >= 37);  // every key of the config file
  CHECK(doc["batch-size"] == 48);
  CHECK(doc["clip-grad-norm"] == 2.5);
  const TrainConfig back = parse_train_config(json, "round trip", TrainConfig{});
  CHECK(train_config_json(back) == json);
  CHECK(back.seed == c.seed);
  CHECK(back.prime == c.prime);
  CHECK(back.lr == c.lr);

  // "Off" settings are null and read back as off.
  const nlohmann::json defaults = nlohmann::json::parse(train_config_json(TrainConfig{}));
  CHECK(defaults["max-steps"].is_null());
  CHECK(defaults["save-every"].is_null());
  const TrainConfig off =
      parse_train_config(R"({"max-steps": null, "save-every": null})", "c.json", c);
  CHECK(off.max_steps == -1);
  CHECK(off.save_every == 0);
  CHECK_THROWS_WITH_AS(parse_train_config(R"({"epochs": null})", "c.json", c),
                       doctest::Contains("'epochs' must be an integer, not null"), Error);
}

TEST_CASE(
    "a checkpoint carries the full training config and the data seed, and load_classifier restores "
    "the trained model") {
  TempDir dir;
  const TrainConfig c = short_run(dir.path / "c.safetensors");
  const std::vector<EpochResult> results = train_classifier(c);
  REQUIRE(results.size() == 1);
  const Checkpoint checkpoint(c.checkpoint_path);
  CHECK(checkpoint.metadata_value("model") == "lenet");
  CHECK(checkpoint.metadata_value("kiln.data_seed") == "3");
  CHECK(checkpoint.metadata_value("kiln.config") == train_config_json(c));
  CHECK(checkpoint.position().step == 20);
  CHECK(checkpoint.position().batch == 20);

  SavedClassifier saved = load_classifier(c.checkpoint_path);
  CHECK(saved.step == 20);
  CHECK(train_config_json(saved.config) == train_config_json(c));
  const ModelInfo& info = model_info("lenet");
  Evaluator evaluator(*saved.model, info.input_shape, 300,
                      {});  // another batch size: a tail of 100
  const EvalResult r = evaluator.evaluate(classifier_data(saved.config, info, Split::test));
  CHECK(r.examples == 1000);
  CHECK(r.accuracy == results[0].test_accuracy);
  CHECK(r.loss == doctest::Approx(results[0].test_loss).epsilon(1e-5));
}

TEST_CASE(
    "--resume with another batch size or seed is refused: the saved data position would mean other "
    "batches") {
  TempDir dir;
  const TrainConfig c = short_run(dir.path / "c.safetensors");
  train_classifier(c);
  TrainConfig resumed = c;
  resumed.checkpoint_path.clear();
  resumed.resume_path = c.checkpoint_path;
  resumed.max_steps = 25;
  CHECK_NOTHROW(train_classifier(resumed));

  TrainConfig other = resumed;
  other.batch_size = 64;
  CHECK_THROWS_WITH_AS(train_classifier(other),
                       doctest::Contains("written with batch size 32 but this run has 64"), Error);
  other = resumed;
  other.seed = 4;
  CHECK_THROWS_WITH_AS(train_classifier(other),
                       doctest::Contains("data order comes from seed 3 but this run has --seed 4"),
                       Error);
}

TEST_CASE("load_classifier: clear errors for files that are not a classifier's checkpoint") {
  TempDir dir;
  const std::filesystem::path path = dir.path / "x.safetensors";
  CHECK_THROWS_WITH_AS(load_classifier(path), doctest::Contains(path.string().c_str()), Error);
  save_safetensors(path, {}, {{"kiln.step", "1"}, {"kiln.epoch", "1"}, {"kiln.batch", "0"}});
  CHECK_THROWS_WITH_AS(load_classifier(path), doctest::Contains("its metadata names no model"),
                       Error);
  save_safetensors(path, {},
                   {{"kiln.step", "1"},
                    {"kiln.epoch", "1"},
                    {"kiln.batch", "0"},
                    {"kiln.config", "{\"modle\": 1}"}});
  CHECK_THROWS_WITH_AS(load_classifier(path),
                       doctest::Contains("metadata 'kiln.config': unknown key 'modle'"), Error);
  save_safetensors(
      path, {}, {{"kiln.step", "1"}, {"kiln.epoch", "1"}, {"kiln.batch", "0"}, {"model", "lenet"}});
  CHECK_THROWS_WITH_AS(load_classifier(path),
                       doctest::Contains("has no tensor 'param/conv1.weight'"), Error);
}

}  // namespace kiln
