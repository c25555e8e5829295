// A model defined outside kiln with its C++ API: a small CNN trained on Fashion-MNIST.
//   tiny_cnn [--max-steps N] [--batch-size N] [--data-dir DIR] [--device cpu|cuda]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/compile.h"
#include "data/dataset.h"
#include "graph/nn/functional.h"
#include "tiny_cnn.h"
#include "train/evaluate.h"

struct Args {
  std::int64_t max_steps = 300;
  std::int64_t batch_size = 64;
  std::string data_dir = kiln::kFashionMnistDir;
  kiln::Device device = kiln::Device::cpu();
};

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--max-steps")
      args.max_steps = std::stoll(value);
    else if (flag == "--batch-size")
      args.batch_size = std::stoll(value);
    else if (flag == "--data-dir")
      args.data_dir = value;
    else if (flag == "--device")
      args.device = value == "cuda" ? kiln::Device::cuda() : kiln::Device::cpu();
    else
      throw kiln::Error("unknown flag " + flag +
                        " (--max-steps, --batch-size, --data-dir, --device)");
  }
  if (argc % 2 == 0) throw kiln::Error(std::string("flag ") + argv[argc - 1] + " needs a value");
  return args;
}

int main(int argc, char** argv) try {
  const Args args = parse_args(argc, argv);
  const kiln::Dataset train = kiln::load_fashion_mnist(args.data_dir, kiln::Split::train);
  const kiln::Dataset test = kiln::load_fashion_mnist(args.data_dir, kiln::Split::test);

  kiln::Philox rng(42);
  TinyCnn model(rng);
  kiln::Graph g;
  const kiln::Value x = g.input("x", {args.batch_size, 1, 28, 28});
  const kiln::Value y = g.input("y", {args.batch_size}, kiln::DType::i64);
  kiln::Adam adam({.lr = 2e-3});
  auto step = kiln::compile_training(kiln::cross_entropy(model(x), y), model.parameters(), adam,
                                     {.device = args.device});

  kiln::Batcher batcher(train, args.batch_size, /*shuffle=*/true, /*seed=*/1);
  kiln::Tensor images = kiln::Tensor::empty({args.batch_size, 1, 28, 28}, kiln::DType::f32);
  kiln::Tensor labels = kiln::Tensor::empty({args.batch_size}, kiln::DType::i64);
  const auto start = std::chrono::steady_clock::now();
  double loss = 0;
  for (std::int64_t s = 0; s < args.max_steps; ++s) {
    const std::int64_t batch = s % batcher.batches_per_epoch();
    if (batch == 0) batcher.start_epoch(s / batcher.batches_per_epoch() + 1);
    batcher.fill(batch, images, labels);
    loss = step->run({{x, images}, {y, labels}}).at("loss").item();
    if ((s + 1) % 100 == 0)
      std::printf("step %lld: loss %.4f\n", static_cast<long long>(s + 1), loss);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  kiln::Evaluator evaluator(model, {1, 28, 28}, 1000, {.device = args.device});
  const kiln::EvalResult result = evaluator.evaluate(test);
  std::printf("%lld steps in %.1f s, final loss %.4f\n", static_cast<long long>(args.max_steps),
              seconds, loss);
  std::printf("test accuracy %.4f (%lld of %lld)\n", result.accuracy,
              static_cast<long long>(result.correct), static_cast<long long>(result.examples));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "tiny_cnn: error: %s\n", e.what());
  return 1;
}
