// The training config in checkpoints: every key round-trips through JSON, checkpoints carry
// it, a resume with settings that would change the data order is refused, and a saved
// classifier loads back with the accuracy it was trained to.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "train/classifier_task.h"
#include "train/config_file.h"
#include "train/evaluate.h"
#include "train/loop.h"
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
  c.images.synthetic = true;
  c.loop.progress = false;
  c.loop.epochs = 1;
  c.loop.batch_size = 32;
  c.loop.max_steps = 20;
  c.loop.seed = 3;
  c.loop.checkpoint = checkpoint.string();
  return c;
}

}  // namespace

TEST_CASE(
    "train_config_json writes every key, and parse_train_config reads the same settings back") {
  TrainConfig c;
  c.model = "lenet";
  c.loop.epochs = 7;
  c.loop.batch_size = 48;
  c.loop.optimizer = "sgd";
  c.loop.lr = 0.0123;
  c.loop.lr_schedule = "step";
  c.loop.warmup_steps = 5;
  c.loop.lr_step_size = 77;
  c.loop.lr_gamma = 0.3;
  c.loop.clip_grad_norm = 2.5;
  c.loop.momentum = 0.8;
  c.loop.weight_decay = 1e-4;
  c.loop.seed = 12345678901234ULL;
  c.images.synthetic = true;
  c.loop.max_steps = 99;
  c.loop.save_every = 10;
  const std::string json = train_config_json(c);
  const nlohmann::json doc = nlohmann::json::parse(json);
  CHECK(doc.size() >= 37);  // every flag of the classifiers but the launcher's
  CHECK(doc["batch-size"] == 48);
  CHECK(doc["clip-grad-norm"] == 2.5);
  CHECK_FALSE(doc.contains("hidden"));  // the language model's
  CHECK_FALSE(doc.contains("ranks"));   // the launcher's, command line only
  const TrainConfig back = parse_train_config(json, "round trip", TrainConfig{});
  CHECK(train_config_json(back) == json);
  CHECK(back.loop.seed == c.loop.seed);
  CHECK(back.loop.lr == c.loop.lr);

  // A language model's config has its own keys, and only those of the image tasks it shares.
  c.model = "char-lstm";
  c.lm.prime = "Once upon \"a\" time\n";
  c.lm.temperature = 0.7;
  const nlohmann::json lm = nlohmann::json::parse(train_config_json(c));
  CHECK(lm["prime"] == c.lm.prime);
  CHECK_FALSE(lm.contains("synthetic"));
  CHECK(parse_train_config(lm.dump(), "lm", TrainConfig{}).lm.temperature == 0.7);

  // "Off" settings are null and read back as off.
  const nlohmann::json defaults = nlohmann::json::parse(train_config_json(TrainConfig{}));
  CHECK(defaults["max-steps"].is_null());
  CHECK(defaults["save-every"].is_null());
  const TrainConfig off =
      parse_train_config(R"({"max-steps": null, "save-every": null})", "c.json", c);
  CHECK(off.loop.max_steps == -1);
  CHECK(off.loop.save_every == 0);
  CHECK_THROWS_WITH_AS(parse_train_config(R"({"epochs": null})", "c.json", c),
                       doctest::Contains("'epochs' must be an integer, not null"), Error);
}

TEST_CASE(
    "a checkpoint carries the full training config and the data seed, and load_classifier restores "
    "the trained model") {
  TempDir dir;
  const TrainConfig c = short_run(dir.path / "c.safetensors");
  const std::vector<EpochReport> results = train(c);
  REQUIRE(results.size() == 1);
  const Checkpoint checkpoint(c.loop.checkpoint);
  CHECK(checkpoint.metadata_value("model") == "lenet");
  CHECK(checkpoint.metadata_value("kiln.data_seed") == "3");
  CHECK(checkpoint.metadata_value("kiln.config") == train_config_json(c));
  CHECK(checkpoint.position().step == 20);
  CHECK(checkpoint.position().batch == 20);

  SavedClassifier saved = load_classifier(c.loop.checkpoint);
  CHECK(saved.step == 20);
  CHECK(train_config_json(saved.config) == train_config_json(c));
  const ModelInfo& info = model_info("lenet");
  Evaluator evaluator(*saved.model, info.input_shape, 300,
                      {});  // another batch size: a tail of 100
  const EvalResult r = evaluator.evaluate(classifier_data(saved.config, info, Split::test));
  CHECK(r.examples == 1000);
  CHECK(r.accuracy == results[0].value("test_accuracy"));
  CHECK(r.loss == doctest::Approx(results[0].value("test_loss")).epsilon(1e-5));
}

TEST_CASE(
    "--resume with another batch size or seed is refused: the saved data position would mean other "
    "batches") {
  TempDir dir;
  const TrainConfig c = short_run(dir.path / "c.safetensors");
  train(c);
  TrainConfig resumed = c;
  resumed.loop.checkpoint.clear();
  resumed.loop.resume = c.loop.checkpoint;
  resumed.loop.max_steps = 25;
  CHECK_NOTHROW(train(resumed));

  TrainConfig other = resumed;
  other.loop.batch_size = 64;
  CHECK_THROWS_WITH_AS(train(other),
                       doctest::Contains("written with batch size 32 but this run has 64"), Error);
  other = resumed;
  other.loop.seed = 4;
  CHECK_THROWS_WITH_AS(train(other),
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
