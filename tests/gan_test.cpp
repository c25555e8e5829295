// GANs: the two steps share their parameters, the MLP GAN trains on Fashion-MNIST without
// collapsing, a resumed run is bitwise equal to an uninterrupted one, grids and FID per epoch.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "graph/nn/functional.h"
#include "train/checkpoint.h"
#include "data/dataset.h"
#include "train/gan_steps.h"
#include "models/lenet.h"
#include "train/gan_task.h"
#include "train/loop.h"
#include "tests/support.h"

namespace kiln {
namespace {

std::vector<Tensor> snapshot(const std::vector<VariablePtr>& vars) {
  std::vector<Tensor> out;
  for (const VariablePtr& v : vars) out.push_back(v->value.clone());
  return out;
}

bool same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].nbytes() != b[i].nbytes() || std::memcmp(a[i].raw(), b[i].raw(), a[i].nbytes()) != 0)
      return false;
  return true;
}

using test::TempDir;

TrainConfig gan_run(const std::filesystem::path& samples_dir) {
  TrainConfig c;
  c.model = "gan";
  c.loop.lr = kGanLr;
  c.loop.lr_schedule = "constant";
  c.loop.progress = false;
  c.loop.epochs = 1;
  c.gan.samples_dir = samples_dir.string();
  return c;
}

std::vector<nlohmann::json> read_metrics(const std::filesystem::path& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

}  // namespace

TEST_CASE(
    "the discriminator and generator steps share the parameter Variables: each sees the other's "
    "updates") {
  Philox rng(4);
  std::unique_ptr<Gan> gan = make_gan("gan", rng);
  const std::int64_t batch = 8;
  GanSteps steps(*gan, batch, {.name = "adam", .lr = 1e-2, .beta1 = kGanBeta1}, {});
  Graph g;  // a third program over the same Variables: D(G(z))
  g.output("logits", gan->discriminator()(gan->generator()(g.input("z", {batch, kGanNoiseDim}))));
  auto d_of_g = compile(g);
  const Tensor real = test::random_tensor({batch, 1, 28, 28}, DType::f32, 1);
  const Tensor z = gan_noise(batch, 0, 0);

  const std::vector<Tensor> g0 = snapshot(gan->generator_parameters()),
                            d0 = snapshot(gan->discriminator_parameters());
  steps.discriminator_step().run({{"real", real}, {"z", z}});
  CHECK(same_bits(g0, snapshot(gan->generator_parameters())));  // D's step leaves G alone...
  CHECK_FALSE(same_bits(d0, snapshot(gan->discriminator_parameters())));
  const Tensor before_g = d_of_g->run({{"z", z}}).at("logits");  // D1(G0(z))

  const std::vector<Tensor> d1 = snapshot(gan->discriminator_parameters());
  steps.generator_step().run({{"z", z}});
  CHECK(
      same_bits(d1, snapshot(gan->discriminator_parameters())));  // ...and G's step leaves D alone
  CHECK_FALSE(same_bits(g0, snapshot(gan->generator_parameters())));
  const Tensor after_g = d_of_g->run({{"z", z}}).at("logits");  // D1(G1(z))
  CHECK(test::closeness(after_g, before_g, 1e-6, 0) > 1);       // the generator step moved D(G(z))
  // The discriminator step's forward pass reads G1 and D1, as the third program does.
  const Tensor fake_logits =
      steps.discriminator_step().run({{"real", real}, {"z", z}}).at("fake_logits");
  CHECK(test::closeness(fake_logits, after_g, 1e-5, 1e-5) <= 1);
}

TEST_CASE(
    "GanSteps::run queues both steps, then waits: the bits of running D's program, then G's") {
  for (const char* name : {"gan", "dcgan"}) {
    CAPTURE(name);
    Philox rng_old(6), rng_new(6);
    std::unique_ptr<Gan> old_gan = make_gan(name, rng_old), new_gan = make_gan(name, rng_new);
    const OptimizerConfig adam{.name = "adam", .lr = kGanLr, .beta1 = kGanBeta1};
    GanSteps old_steps(*old_gan, 8, adam, {}), new_steps(*new_gan, 8, adam, {});
    for (std::uint64_t step = 0; step < 3; ++step) {
      CAPTURE(step);
      const Tensor real = test::random_tensor({8, 1, 28, 28}, DType::f32, 20 + step);
      const Tensor z = gan_noise(8, 3, step);
      const Outputs d = old_steps.discriminator_step().run({{"real", real}, {"z", z}});
      const Outputs g = old_steps.generator_step().run({{"z", z}});
      const GanStepResult queued = new_steps.run(real, z);
      CHECK(queued.d_loss == d.at("loss").item());
      CHECK(queued.g_loss == g.at("loss").item());
      CHECK(queued.d_accuracy == discriminator_accuracy(d));
      CHECK(same_bits(snapshot(new_gan->parameters()), snapshot(old_gan->parameters())));
      CHECK(
          same_bits(snapshot(new_steps.optimizer_state()), snapshot(old_steps.optimizer_state())));
    }
  }
}

TEST_CASE(
    "the MLP GAN trains on Fashion-MNIST: finite losses, the discriminator neither lost nor "
    "perfect") {
  if (!std::filesystem::exists(kFashionMnistDir)) {
    MESSAGE("skipped: Fashion-MNIST is not installed at " << kFashionMnistDir);
    return;
  }
  TempDir dir("kiln-gan-train-test");
  TrainConfig c = gan_run(dir.path);
  c.loop.max_steps = 60;
  c.loop.metrics = (dir.path / "metrics.jsonl").string();
  c.loop.metrics_every = 1;
  const std::vector<EpochReport> results = train(c);
  REQUIRE(results.size() == 1);
  const EpochReport& r = results[0];
  MESSAGE("60 steps: D loss " << r.value("d_loss") << ", G loss " << r.value("g_loss")
                              << ", D accuracy " << r.value("d_accuracy") << ", "
                              << r.seconds * 1e3 / 60 << " ms per D+G step");
  CHECK(r.steps == 60);
  CHECK(std::isfinite(r.value("d_loss")));
  CHECK(std::isfinite(r.value("g_loss")));
  const std::vector<nlohmann::json> lines = read_metrics(c.loop.metrics);
  REQUIRE(lines.size() == 61);  // 60 steps and the epoch
  double late_accuracy = 0;     // the last 20 steps: D must not have won or lost outright
  for (std::size_t i = 40; i < 60; ++i) {
    CHECK(lines[i]["kind"] == "step");
    CHECK(lines[i]["g_loss"].is_number());
    late_accuracy += lines[i]["d_accuracy"].get<double>() / 20.0;
  }
  MESSAGE("D accuracy over steps 41-60: " << late_accuracy);
  CHECK(late_accuracy > 0.1);
  CHECK(late_accuracy < 0.99);
  CHECK(lines[60]["kind"] == "epoch");
  CHECK(lines[60]["samples"] == gan_samples_path(c, 1));
  CHECK(std::filesystem::file_size(gan_samples_path(c, 1)) > 1000);
}

TEST_CASE(
    "GAN checkpoints: save at step N, resume, train to 2N: the same bits as an uninterrupted run") {
  TempDir dir("kiln-gan-resume-test");
  TrainConfig base = gan_run(dir.path);
  base.images.synthetic = true;  // 4096 images: 64 steps of 64 per epoch
  base.loop.epochs = 2;
  auto final_params = [](const TrainConfig& c) {
    std::vector<Tensor> out;
    train(c, {}, [&](const TaskState& state) {
      const std::vector<VariablePtr>& p = state.parameters;
      out = snapshot(p);
    });
    return out;
  };
  TrainConfig whole = base;
  whole.loop.max_steps = 80;  // crosses the epoch boundary
  const std::vector<Tensor> uninterrupted = final_params(whole);
  TrainConfig first = base;
  first.loop.max_steps = 40;
  first.loop.checkpoint = (dir.path / "half.safetensors").string();
  const std::vector<Tensor> halfway = final_params(first);
  TrainConfig second = whole;
  second.loop.resume = first.loop.checkpoint;
  const std::vector<Tensor> resumed = final_params(second);
  CHECK_FALSE(same_bits(halfway, uninterrupted));
  CHECK(same_bits(resumed, uninterrupted));
  // The checkpoint holds both networks and both optimizers, each under its own name.
  Philox rng(0);
  std::unique_ptr<Gan> gan = make_gan("gan", rng);
  GanSteps steps(*gan, 64, {.name = "adam"}, {});
  const TrainingPosition at =
      load_checkpoint(first.loop.checkpoint, gan->parameters(), steps.optimizer_state());
  CHECK(at.step == 40);
  CHECK(at.batch == 40);
  CHECK(same_bits(snapshot(gan->parameters()), halfway));
}

TEST_CASE("a GAN run writes a grid per epoch and, with --fid-classifier, the FID in its metrics") {
  TempDir dir("kiln-gan-fid-test");
  Philox rng(2);
  LeNet lenet(rng);  // an untrained classifier's features serve the plumbing
  const std::string classifier = (dir.path / "lenet.safetensors").string();
  save_checkpoint(classifier, lenet.parameters(), {}, {}, {{"model", "lenet"}});
  TrainConfig c = gan_run(dir.path);
  c.images.synthetic = true;
  c.loop.epochs = 2;
  c.loop.max_steps = 10;
  c.loop.batch_size = 8;  // synthetic: 512 steps per epoch, so max_steps ends epoch 1
  c.gan.fid_classifier = classifier;
  c.loop.metrics = (dir.path / "metrics.jsonl").string();
  std::vector<EpochReport> results = train(c);
  REQUIRE(results.size() == 1);
  CHECK(std::isfinite(results[0].value("fid")));
  CHECK(results[0].value("fid") > 0);
  const std::vector<nlohmann::json> lines = read_metrics(c.loop.metrics);
  CHECK(lines.back()["fid"].get<double>() == results[0].value("fid"));
  CHECK(std::filesystem::exists(gan_samples_path(c, 1)));
}

TEST_CASE(
    "GAN settings errors name the value: a missing samples directory, a lenet checkpoint to "
    "resume") {
  TempDir dir("kiln-gan-errors-test");
  TrainConfig c = gan_run(dir.path);
  c.images.synthetic = true;
  c.gan.samples_dir = (dir.path / "missing").string();
  CHECK_THROWS_WITH_AS(train(c), doctest::Contains("--samples-dir"), Error);
  c.gan.samples_dir = dir.path.string();
  Philox rng(2);
  LeNet lenet(rng);
  c.loop.resume = (dir.path / "lenet.safetensors").string();
  save_checkpoint(c.loop.resume, lenet.parameters(), {}, {}, {{"model", "lenet"}});
  CHECK_THROWS_WITH_AS(train(c), doctest::Contains("a checkpoint of model 'lenet'"), Error);
  save_checkpoint(c.loop.resume, lenet.parameters(), {}, {}, {});  // no model named
  CHECK_THROWS_WITH_AS(train(c), doctest::Contains("has no tensor 'param/generator."), Error);
}

}  // namespace kiln

namespace kiln {

TEST_CASE(
    "DCGAN: 28x28 samples, finite losses over a few steps, running statistics updated and used for "
    "sampling") {
  Philox rng(6);
  std::unique_ptr<Gan> gan = make_gan("dcgan", rng);
  const std::int64_t batch = 8;
  GanSteps steps(*gan, batch, {.name = "adam", .lr = kGanLr, .beta1 = kGanBeta1}, {});
  const std::vector<Tensor> buffers0 = snapshot(gan->buffers());
  REQUIRE(buffers0.size() == 6);  // running mean and variance of three batch norms
  const Tensor real = test::random_tensor({batch, 1, 28, 28}, DType::f32, 2);
  for (std::uint64_t s = 0; s < 3; ++s) {
    const GanStepResult r = steps.run(real, gan_noise(batch, 1, s));
    CHECK(std::isfinite(r.d_loss));
    CHECK(std::isfinite(r.g_loss));
  }
  CHECK_FALSE(same_bits(buffers0, snapshot(gan->buffers())));
  // The generator in eval mode normalises with the running statistics, not the batch's.
  Graph train_graph, eval_graph;
  train_graph.output("images", gan->generator()(train_graph.input("z", {batch, kGanNoiseDim})));
  gan->generator().set_training(false);
  eval_graph.output("images", gan->generator()(eval_graph.input("z", {batch, kGanNoiseDim})));
  gan->generator().set_training(true);
  const Tensor z = gan_noise(batch, 2, 0);
  const Tensor train_images = test::run_once(train_graph, {{"z", z}}).at("images");
  const Tensor eval_images = test::run_once(eval_graph, {{"z", z}}).at("images");
  REQUIRE(eval_images.shape() == Shape{batch, 1, 28, 28});
  for (std::int64_t i = 0; i < eval_images.numel(); ++i)
    REQUIRE(std::abs(eval_images.at(i)) <= 1.0);
  CHECK(test::closeness(eval_images, train_images, 1e-4, 0) > 1);
}

TEST_CASE(
    "DCGAN checkpoints carry batch norm's running statistics: a resumed run is bitwise equal") {
  TempDir dir("kiln-dcgan-resume-test");
  TrainConfig base = gan_run(dir.path);
  base.model = "dcgan";
  base.images.synthetic = true;
  base.loop.batch_size = 8;
  auto final_variables = [](const TrainConfig& c) {
    std::vector<Tensor> out;
    train(c, {}, [&](const TaskState& state) {
      const std::vector<VariablePtr>& v = state.parameters;
      out = snapshot(v);
    });
    return out;
  };
  TrainConfig whole = base;
  whole.loop.max_steps = 4;
  const std::vector<Tensor> uninterrupted = final_variables(whole);
  TrainConfig first = base;
  first.loop.max_steps = 2;
  first.loop.checkpoint = (dir.path / "half.safetensors").string();
  final_variables(first);
  TrainConfig second = whole;
  second.loop.resume = first.loop.checkpoint;
  CHECK(same_bits(final_variables(second), uninterrupted));
}

}  // namespace kiln

namespace kiln {

TEST_CASE(
    "gan: noise drawn one step ahead (by one or several threads) is gan_noise of each step, in "
    "sequence and out of it") {
  for (std::size_t parts : {0, 1, 3}) {
    CAPTURE(parts);
    NoiseAhead noise(8, 3, parts > 0, parts);
    for (std::uint64_t step : {5u, 6u, 7u, 2u, 3u, 3u}) {
      CAPTURE(step);
      const Tensor want = gan_noise(8, 3, step), got = noise.take(step);
      REQUIRE(got.numel() == want.numel());
      CHECK(std::memcmp(got.raw(), want.raw(), want.nbytes()) == 0);
    }
  }
}

}  // namespace kiln
