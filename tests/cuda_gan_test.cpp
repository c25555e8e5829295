// GANs on the GPU against the CPU: the two steps (sharing device-resident Variables) give the
// CPU's losses and parameters; train_gan runs end to end with grids and FID. Skipped without
// a GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "backends/host_copy.h"
#include "gpu/cuda_runtime.h"
#include "train/checkpoint.h"
#include "train/gan_steps.h"
#include "models/lenet.h"
#include "train/gan_task.h"
#include "train/loop.h"
#include "tests/support.h"

namespace kiln {
namespace {

using test::have_gpu;

}  // namespace

TEST_CASE(
    "GPU: GAN steps (gan, dcgan) match the CPU's losses and parameters, through CUDA-graph "
    "replays") {
  if (!have_gpu()) return;
  for (const char* name : {"gan", "dcgan"}) {
    CAPTURE(name);
    Philox rng_cpu(3), rng_gpu(3);
    std::unique_ptr<Gan> cpu = make_gan(name, rng_cpu), gpu = make_gan(name, rng_gpu);
    const OptimizerConfig adam{.name = "adam", .lr = kGanLr, .beta1 = kGanBeta1};
    GanSteps cpu_steps(*cpu, 16, adam, {}), gpu_steps(*gpu, 16, adam, {.device = Device::cuda()});
    for (std::uint64_t step = 0; step < 4; ++step) {  // the first run, the capture, replays
      CAPTURE(step);
      const Tensor real = test::random_tensor({16, 1, 28, 28}, DType::f32, 40 + step);
      const Tensor z = gan_noise(16, 5, step);
      const GanStepResult c = cpu_steps.run(real, z), g = gpu_steps.run(real, z);
      CHECK(g.d_loss == doctest::Approx(c.d_loss).epsilon(1e-3));
      CHECK(g.g_loss == doctest::Approx(c.g_loss).epsilon(1e-3));
      std::vector<VariablePtr> cv = cpu->parameters(), gv = gpu->parameters();
      for (const VariablePtr& b : cpu->buffers()) cv.push_back(b);
      for (const VariablePtr& b : gpu->buffers()) gv.push_back(b);
      for (std::size_t i = 0; i < cv.size(); ++i) {
        CAPTURE(cv[i]->name);
        // Adam divides by sqrt(v): near-zero gradients amplify rounding differences.
        CHECK(test::closeness(to_host(gv[i]->value), cv[i]->value, 3e-4, 3e-3) <= 1.0);
      }
    }
  }
}

TEST_CASE(
    "GPU: GAN steps queued back to back (with the next batch prefetched) give the bits of the "
    "two programs run one after the other, waiting between them") {
  if (!have_gpu()) return;
  for (const char* name : {"gan", "dcgan"}) {
    CAPTURE(name);
    Philox rng_old(7), rng_new(7);
    std::unique_ptr<Gan> old_gan = make_gan(name, rng_old), new_gan = make_gan(name, rng_new);
    const OptimizerConfig adam{.name = "adam", .lr = kGanLr, .beta1 = kGanBeta1};
    const CompileOptions gpu{.device = Device::cuda()};
    GanSteps old_steps(*old_gan, 16, adam, gpu), new_steps(*new_gan, 16, adam, gpu);
    auto real_of = [](std::uint64_t step) {
      return test::random_tensor({16, 1, 28, 28}, DType::f32, 60 + step);
    };
    Tensor real = real_of(0), z = gan_noise(16, 9, 0);
    for (std::uint64_t step = 0; step < 5; ++step) {  // the first run, the capture, replays
      CAPTURE(step);
      const Tensor next_real = real_of(step + 1), next_z = gan_noise(16, 9, step + 1);
      old_steps.set_lr(kGanLr * static_cast<double>(step + 1));  // uploads from the host
      new_steps.set_lr(kGanLr * static_cast<double>(step + 1));
      const Outputs d = old_steps.discriminator_step().run({{"real", real}, {"z", z}});
      const Outputs g = old_steps.generator_step().run({{"z", z}});
      new_steps.prefetch(next_real, next_z);
      const GanStepResult queued = new_steps.run(real, z);
      CHECK(queued.d_loss == d.at("loss").item());
      CHECK(queued.g_loss == g.at("loss").item());
      CHECK(queued.d_accuracy == discriminator_accuracy(d));
      const std::vector<VariablePtr> ov = old_gan->parameters(), nv = new_gan->parameters();
      for (std::size_t i = 0; i < ov.size(); ++i) {
        CAPTURE(ov[i]->name);
        const Tensor a = to_host(nv[i]->value), b = to_host(ov[i]->value);
        CHECK(std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
      }
      real = next_real;
      z = next_z;
    }
  }
}

TEST_CASE(
    "GPU: GAN steps queued one ahead (the next queued before the last one's values are read, the "
    "rate uploaded from the host each step) give the bits of steps waited for one by one") {
  if (!have_gpu()) return;
  for (const char* name : {"gan", "dcgan"}) {
    CAPTURE(name);
    Philox rng_one(4), rng_ahead(4);
    std::unique_ptr<Gan> one_gan = make_gan(name, rng_one), ahead_gan = make_gan(name, rng_ahead);
    const OptimizerConfig adam{.name = "adam", .lr = kGanLr, .beta1 = kGanBeta1};
    const CompileOptions gpu{.device = Device::cuda()};
    GanSteps one(*one_gan, 16, adam, gpu), ahead(*ahead_gan, 16, adam, gpu);
    const int steps = 6;
    std::vector<Tensor> reals, zs;
    for (std::uint64_t s = 0; s <= steps; ++s) {
      reals.push_back(test::random_tensor({16, 1, 28, 28}, DType::f32, 80 + s));
      zs.push_back(gan_noise(16, 3, s));
    }
    std::vector<GanStepResult> expected, got;
    for (int s = 0; s < steps; ++s) {
      one.set_lr(kGanLr * (1 + s));
      expected.push_back(one.run(reals[s], zs[s]));
    }
    QueuedGanStep queued;
    for (int s = 0; s < steps; ++s) {
      ahead.set_lr(kGanLr * (1 + s));
      ahead.prefetch(reals[s + 1], zs[s + 1]);
      QueuedGanStep step = ahead.enqueue(reals[s], zs[s]);
      if (queued.valid()) got.push_back(queued.wait());
      queued = std::move(step);
    }
    got.push_back(queued.wait());
    REQUIRE(got.size() == expected.size());
    for (int s = 0; s < steps; ++s) {
      CAPTURE(s);
      CHECK(got[s].d_loss == expected[s].d_loss);
      CHECK(got[s].g_loss == expected[s].g_loss);
      CHECK(got[s].d_accuracy == expected[s].d_accuracy);
    }
    const std::vector<VariablePtr> ov = one_gan->parameters(), av = ahead_gan->parameters();
    for (std::size_t i = 0; i < ov.size(); ++i) {
      CAPTURE(ov[i]->name);
      const Tensor a = to_host(av[i]->value), b = to_host(ov[i]->value);
      CHECK(std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
    }
  }
}

TEST_CASE("GPU: train_gan runs on the GPU: finite losses, a grid and an FID per epoch") {
  if (!have_gpu()) return;
  const test::TempDir dir("kiln-gpu-gan-test");
  Philox rng(2);
  LeNet lenet(rng);
  const std::string classifier = (dir.path / "lenet.safetensors").string();
  save_checkpoint(classifier, lenet.parameters(), {}, {}, {{"model", "lenet"}});
  for (const char* name : {"gan", "dcgan"}) {
    CAPTURE(name);
    TrainConfig c;
    c.model = name;
    c.device.name = "cuda";
    c.images.synthetic = true;
    c.loop.progress = false;
    c.loop.lr = kGanLr;
    c.loop.lr_schedule = "constant";
    c.loop.epochs = 1;
    c.loop.max_steps = 20;
    c.gan.samples_dir = dir.path.string();
    c.gan.fid_classifier = classifier;
    const std::vector<EpochReport> results = train(c);
    REQUIRE(results.size() == 1);
    CHECK(std::isfinite(results[0].value("d_loss")));
    CHECK(std::isfinite(results[0].value("g_loss")));
    CHECK(std::isfinite(results[0].value("fid")));
    REQUIRE(results[0].files.size() == 1);
    CHECK(std::filesystem::file_size(results[0].files[0].second) > 1000);
  }
}

}  // namespace kiln
