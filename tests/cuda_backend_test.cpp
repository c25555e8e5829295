// The CUDA backend against the CPU backend: every op forward and backward, random DAGs,
// and whole LeNet training steps (loss and every parameter). Without a GPU, only the
// checks that need none run (launcher coverage, the error for --device cuda).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/compile.h"
#include "backends/device_warm_up.h"
#include "gpu/cuda_runtime.h"
#include "graph/autograd.h"
#include "graph/op_table.h"
#include "train/step_graph.h"
#include "graph/testing/lstm_step_graph.h"
#include "graph/testing/random_graph.h"
#include "tests/support.h"

#ifdef KILN_HAVE_CUDA
#include "backends/cuda/op_entry.h"
#include "backends/cuda/device_allocator.h"
#include "backends/cuda/transfer.h"
#endif

namespace kiln {
namespace {

using test::have_gpu;

using test::random_feeds;

// Runs g on the CPU and on the GPU with random feeds (test::check_gpu_matches_cpu).
void check_gpu_matches_cpu(const Graph& g, std::uint64_t seed, double tolerance) {
  test::check_gpu_matches_cpu(g, random_feeds(g, seed), tolerance);
}

// One op (by its builder) on random inputs: its value and the gradients of a weighted sum.
void check_op(const std::string& label, const std::vector<Shape>& shapes,
              const std::function<Value(const std::vector<Value>&)>& build) {
  CAPTURE(label);
  Graph g;
  std::vector<Value> inputs;
  for (std::size_t i = 0; i < shapes.size(); ++i)
    inputs.push_back(g.input("in" + std::to_string(i), shapes[i]));
  const Value y = build(inputs);
  g.output("y", y);
  const std::vector<Value> grads =
      grad(sum_all(y * g.constant(test::random_tensor(y.shape(), DType::f32, 77))), inputs);
  for (std::size_t i = 0; i < grads.size(); ++i) g.output("grad" + std::to_string(i), grads[i]);
  check_gpu_matches_cpu(g, 11, 1e-4);
}

}  // namespace

TEST_CASE("without a GPU, --device cuda is a clear error") {
  if (gpu::cuda_device_count() > 0) return;
  Graph g;
  g.output("y", g.input("x", {4}) * 2.0);
  CHECK_THROWS_WITH_AS(compile(g, {.device = Device::cuda()}), doctest::Contains("device cuda"),
                       Error);
}

#ifdef KILN_HAVE_CUDA
TEST_CASE("every op that is not a fused group has a CUDA op entry") {
  for (const OpDef* op : all_ops()) {
    if (op->kind == OpKind::source || op->kind == OpKind::elementwise ||
        op->kind == OpKind::reduction || op->kind == OpKind::fused || op->alias)
      continue;  // elementwise ops and reductions run as generated (fused) kernels
    CAPTURE(op->name);
    const cuda::CudaOpEntry* entry = cuda::cuda_op(op->id);
    REQUIRE(entry != nullptr);
    CHECK(entry->prepare);
  }
}

TEST_CASE("GPU: every op, forward and backward, matches the CPU backend") {
  if (!have_gpu()) return;
  using V = const std::vector<Value>&;
  check_op("gelu", {{4, 8}}, [](V v) { return gelu(v[0] * 3.0); });
  check_op("layer_norm, rows of 37 and of 300", {{6, 37}, {2, 3, 300}}, [](V v) {
    return sum(layer_norm(v[0]) * v[0], {1}, true) + sum(layer_norm(v[1], 1e-3) * v[1], {1, 2});
  });
  check_op("elementwise chain", {{4, 8}, {8}}, [](V v) {
    return tanh(relu(v[0] * v[1] + 1.0)) * 0.5 - exp(-v[0] * v[0]) + sqrt(v[1] * v[1] + 1.0);
  });
  check_op("maximum, div, log", {{3, 5}, {3, 1}},
           [](V v) { return maximum(v[0], v[1]) / (v[1] * v[1] + 1.0) + log(v[0] * v[0] + 0.5); });
  check_op("reductions", {{4, 6, 5}}, [](V v) {
    return sum(v[0], {0, 2}, true) * max(v[0], {1}, true);
  });
  // Leading axes reduced, trailing kept (bias gradients): the column body, with and without
  // splits of the rows, a partial tile of 32 outputs, a max, and a full-shape output beside.
  check_op("column sums", {{700, 70}}, [](V v) { return sum(v[0] * v[0], {0}); });
  check_op("column sums, split rows", {{4096, 40}},
           [](V v) { return sum(tanh(v[0]), {0}, true) * 2.0; });
  check_op("column sums over two leading axes", {{8, 80, 33}}, [](V v) {
    return sum(v[0], {0, 1});
  });
  check_op("column max beside an output", {{513, 96}},
           [](V v) { return max(exp(v[0]), {0}, true) + exp(v[0]); });
  check_op("matmul", {{6, 5}, {5, 7}}, [](V v) { return matmul(v[0], v[1]); });
  check_op("matmul transposed, batched", {{2, 5, 6}, {2, 7, 5}},
           [](V v) { return matmul(v[0], v[1], true, true); });
  check_op("conv2d stride 1 pad 1", {{3, 2, 7, 5}, {4, 2, 3, 3}},
           [](V v) { return conv2d(v[0], v[1], 1, 1); });
  check_op("conv2d stride 2 pad 0", {{2, 3, 9, 8}, {2, 3, 3, 3}},
           [](V v) { return conv2d(v[0], v[1], 2, 0); });
  check_op("max_pool2d 2", {{2, 3, 8, 6}}, [](V v) { return max_pool2d(v[0], 2); });
  check_op("max_pool2d 3/1 overlapping", {{1, 2, 7, 7}},
           [](V v) { return max_pool2d(v[0], 3, 1); });
  check_op("max_pool2d 3/1 pad 1", {{2, 3, 6, 7}}, [](V v) { return max_pool2d(v[0], 3, 1, 1); });
  check_op("max_pool2d 3/2 pad 1", {{2, 3, 7, 6}}, [](V v) { return max_pool2d(v[0], 3, 2, 1); });
  check_op("avg_pool2d 2", {{2, 3, 8, 6}}, [](V v) { return avg_pool2d(v[0], 2); });
  check_op("avg_pool2d 3/1 pad 1", {{2, 3, 6, 7}}, [](V v) { return avg_pool2d(v[0], 3, 1, 1); });
  check_op("avg_pool2d 3/2 pad 1", {{2, 3, 7, 6}}, [](V v) { return avg_pool2d(v[0], 3, 2, 1); });
  check_op("global_avg_pool", {{2, 3, 7, 6}}, [](V v) { return global_avg_pool(v[0]); });
  check_op("transpose", {{2, 3, 4}}, [](V v) { return transpose(v[0], {2, 0, 1}); });
  check_op("log_softmax", {{5, 10}}, [](V v) { return log_softmax(v[0], 1); });
  check_op("slice axis 1", {{3, 7, 5}}, [](V v) { return slice(v[0], 1, 2, 4); });
  check_op("slice axis 0 of a GEMM, unfused consumer", {{6, 4}, {4, 8}},
           [](V v) { return matmul(slice(matmul(v[0], v[1]), 0, 2, 3), v[1], false, true); });
  check_op("concat axis 1 (gradient: slices)", {{2, 3, 4}, {2, 1, 4}, {2, 5, 4}}, [](V v) {
    return concat({v[0], v[1], v[2]}, 1);
  });
  check_op("concat axis -1", {{3, 2}, {3, 5}}, [](V v) { return concat({v[0], v[1]}, -1); });
  check_op("pad axis 0", {{3, 5}}, [](V v) { return pad(v[0], 0, 2, 1); });
  check_op("pad axis 1 of a GEMM", {{3, 5}, {5, 2}},
           [](V v) { return pad(matmul(v[0], v[1]), 1, 1, 3); });
  // 300 indices into `rows` rows, the last row never named.
  const auto indices = [](const Value& like, std::int64_t rows) {
    Tensor t = Tensor::empty({300}, DType::i64);
    for (std::int64_t i = 0; i < 300; ++i) t.data<std::int64_t>()[i] = (i * 7 + 3) % (rows - 1);
    return like.graph().constant(t);
  };
  check_op("gather_rows: 300 rows of a table of 7, one unused", {{7, 130}},
           [&](V v) { return gather_rows(v[0], indices(v[0], 7)); });
  check_op("scatter_add_rows: 300 rows into 7, one empty (sorted)", {{300, 130}},
           [&](V v) { return scatter_add_rows(v[0], indices(v[0], 7), 7); });
  check_op("scatter_add_rows: 300 rows into 9000, most empty (scanned)", {{300, 3}},
           [&](V v) { return scatter_add_rows(v[0], indices(v[0], 9000), 9000); });
  Graph g;
  g.output("loss", cross_entropy(g.input("x", {8, 10}), g.input("y", {8}, DType::i64)));
  check_gpu_matches_cpu(g, 5, 1e-5);
}

TEST_CASE(
    "GPU: two LSTM steps (gate slices read in place, gradients joined by concat) match the CPU "
    "backend") {
  if (!have_gpu()) return;
  Graph g;
  testing::lstm_step_graph(g, 6, 10, 16, true);
  check_gpu_matches_cpu(g, 31, 1e-4);
}

TEST_CASE(
    "GPU: an embedding and its projection as gathers and scatters (the one-hot products pass) "
    "match the CPU") {
  if (!have_gpu()) return;
  Graph g;
  const Value tokens = g.input("tokens", {48}, DType::i64);  // random_feeds: labels in [0, 10)
  const Value table = g.input("table", {10, 5}), w = g.input("w", {5, 12}), b = g.input("b", {12});
  const Value x = reshape(matmul(one_hot(tokens, 10), table), {6, 8, 5});
  const Value p = matmul(reshape(x, {48, 5}), w) + b;
  const Value loss = sum_all(tanh(p) * g.constant(test::random_tensor(p.shape(), DType::f32, 5)));
  const std::vector<Value> grads = grad(loss, {table, w, b});
  g.output("loss", loss);
  g.output("d_table", grads[0]);
  g.output("d_w", grads[1]);
  g.output("d_b", grads[2]);
  check_gpu_matches_cpu(g, 41, 1e-4);
}

TEST_CASE("GPU: gather_rows and scatter_add_rows report a bad index as the CPU kernels do") {
  if (!have_gpu()) return;
  for (const bool scatter : {false, true}) {
    CAPTURE(scatter);
    Graph g;
    const Value values = g.input("values", {48, 5});
    const Value indices = g.input("indices", {48}, DType::i64);
    g.output("y", scatter ? scatter_add_rows(values, indices, 10)
                          : gather_rows(slice(values, 0, 0, 10), indices));
    Tensor bad = Tensor::empty({48}, DType::i64);
    for (std::int64_t i = 0; i < 48; ++i) bad.data<std::int64_t>()[i] = i == 13 ? 10 : i % 10;
    const std::vector<Feed> feeds = {{"values", test::random_tensor({48, 5}, DType::f32, 3)},
                                     {"indices", bad}};
    const std::string message = std::string(scatter ? "scatter_add_rows" : "gather_rows") +
                                ": index 10 at position 13 is outside [0, 10)";
    CHECK_THROWS_WITH_AS(compile(g, {})->run(feeds), message.c_str(), Error);
    CHECK_THROWS_WITH_AS(compile(g, {.device = Device::cuda()})->run(feeds), message.c_str(),
                         Error);
  }
}

TEST_CASE("GPU: random elementwise DAGs match the CPU backend") {
  if (!have_gpu()) return;
  for (int s = 0; s < 40; ++s) {
    CAPTURE(s);
    Graph g;
    testing::RandomGraphBuilder builder(3000 + static_cast<std::uint64_t>(s));
    const testing::RandomGraph r = builder.build(g, 5 + s % 20);
    for (std::size_t i = 0; i < r.outputs.size(); ++i)
      g.output("o" + std::to_string(i), r.outputs[i]);
    check_gpu_matches_cpu(g, 20 + static_cast<std::uint64_t>(s), 2e-5);
  }
}

TEST_CASE("GPU: LeNet training steps match the CPU step: the loss and every parameter") {
  if (!have_gpu()) return;
  for (const char* optimizer : {"sgd", "adam"}) {
    CAPTURE(optimizer);
    ModelGraph cpu =
        build_model_graph("lenet", Stage::train, 64, {.name = optimizer, .lr = 0.01}, 3);
    ModelGraph gpu =
        build_model_graph("lenet", Stage::train, 64, {.name = optimizer, .lr = 0.01}, 3);
    auto cpu_step = compile(*cpu.graph);
    auto gpu_step = compile(*gpu.graph, {.device = Device::cuda()});
    for (int step = 0; step < 4; ++step) {  // the first run, the capture, then replays
      const std::vector<Feed> feeds =
          random_feeds(*cpu.graph, 100 + static_cast<std::uint64_t>(step));
      const double cpu_loss = cpu_step->run(feeds).at("loss").item();
      const double gpu_loss = gpu_step->run(feeds).at("loss").item();
      CAPTURE(step);
      CHECK(gpu_loss == doctest::Approx(cpu_loss).epsilon(1e-4));
      const auto cpu_params = cpu.model->parameters(), gpu_params = gpu.model->parameters();
      for (std::size_t p = 0; p < cpu_params.size(); ++p) {
        CAPTURE(cpu_params[p]->name);
        CHECK(gpu_params[p]->value.device() == Device::cuda());
        // Adam divides by sqrt(v): where a gradient is near zero, float rounding in the two
        // backends' sums moves the update by more than it moves the gradient.
        CHECK(test::closeness(cuda::to_host(gpu_params[p]->value), cpu_params[p]->value, 3e-4,
                              3e-3) <= 1.0);
      }
    }
  }
}

TEST_CASE(
    "GPU: LeNet steps with gradient clipping match the CPU step: the norm, the loss and every "
    "parameter") {
  if (!have_gpu()) return;
  // A threshold far below LeNet's gradient norm, so that every step is clipped.
  const TrainStepOptions clip{.clip_grad_norm = 0.05};
  ModelGraph cpu = build_model_graph("lenet", Stage::train, 64,
                                     {.name = "sgd", .lr = 0.1, .momentum = 0.9}, 4, clip);
  ModelGraph gpu = build_model_graph("lenet", Stage::train, 64,
                                     {.name = "sgd", .lr = 0.1, .momentum = 0.9}, 4, clip);
  auto cpu_step = compile(*cpu.graph);
  auto gpu_step = compile(*gpu.graph, {.device = Device::cuda()});
  for (int step = 0; step < 4; ++step) {  // the first run, the capture, then replays
    CAPTURE(step);
    const std::vector<Feed> feeds =
        random_feeds(*cpu.graph, 300 + static_cast<std::uint64_t>(step));
    const Outputs c = cpu_step->run(feeds), g = gpu_step->run(feeds);
    CHECK(c.at("grad_norm").item() > 0.05);
    CHECK(g.at("grad_norm").item() == doctest::Approx(c.at("grad_norm").item()).epsilon(1e-4));
    CHECK(g.at("loss").item() == doctest::Approx(c.at("loss").item()).epsilon(1e-4));
    const auto cpu_params = cpu.model->parameters(), gpu_params = gpu.model->parameters();
    for (std::size_t p = 0; p < cpu_params.size(); ++p) {
      CAPTURE(cpu_params[p]->name);
      CHECK(test::closeness(cuda::to_host(gpu_params[p]->value), cpu_params[p]->value, 1e-5,
                            1e-3) <= 1.0);
    }
  }
}

// TF32 is a process-wide switch read while launching: an fp32 program compiled before a tf32 one
// and first run after it must still run in fp32 (its workspace sized for that, not the TF32
// channels-last passes), with the bits of an fp32 program run alone; a stride-2 convolution's
// grad_input among them (TF32 over dy read as if dilated, 32-bit weight copies).
TEST_CASE("GPU: an fp32 program run after a tf32 one was compiled stays fp32") {
  if (!have_gpu()) return;
  Graph g;
  const Value x = g.input("x", {4, 16, 10, 10});
  const Value w = g.input("w", {16, 16, 3, 3});
  const Value w2 = g.input("w2", {12, 16, 3, 3});
  const Value y = conv2d(x, w, 1, 1), y2 = conv2d(x, w2, 2, 1);
  g.output("y", y);
  g.output("dx", grad(sum_all(y * y) + sum_all(y2 * y2), {x})[0]);
  const std::vector<Feed> feeds = random_feeds(g, 3);
  const Outputs alone = compile(g, {.device = Device::cuda()})->run(feeds);
  auto fp32 = compile(g, {.device = Device::cuda()});
  auto tf32 = compile(g, {.device = Device::cuda(), .precision = Precision::tf32});
  const Outputs after = fp32->run(feeds);
  const Outputs with_tf32 = tf32->run(feeds);
  for (const auto& [name, tensor] : alone) {
    CAPTURE(name);
    CHECK(std::memcmp(after.at(name).raw(), tensor.raw(), tensor.nbytes()) == 0);
    // TF32 rounds each input to 10 bits: errors scale with the largest value, not each one.
    double largest = 0;
    for (std::int64_t i = 0; i < tensor.numel(); ++i)
      largest = std::max(largest, std::abs(tensor.at(i)));
    CHECK(test::closeness(with_tf32.at(name), tensor, 4e-3 * largest, 0) <= 1.0);
    CHECK(std::memcmp(with_tf32.at(name).raw(), tensor.raw(), tensor.nbytes()) != 0);  // TF32 ran
  }
}

TEST_CASE("GPU: two runs of the same steps give bitwise-identical parameters") {
  if (!have_gpu()) return;
  std::vector<std::vector<Tensor>> runs;
  for (int run = 0; run < 2; ++run) {
    ModelGraph m = build_model_graph("lenet", Stage::train, 64, {.name = "adam", .lr = 0.01}, 9);
    auto step = compile(*m.graph, {.device = Device::cuda(), .deterministic = true});
    for (int s = 0; s < 5; ++s)
      step->run(random_feeds(*m.graph, 40 + static_cast<std::uint64_t>(s)));
    std::vector<Tensor> params;
    for (const VariablePtr& p : m.model->parameters()) params.push_back(cuda::to_host(p->value));
    runs.push_back(params);
  }
  for (std::size_t i = 0; i < runs[0].size(); ++i) {
    CAPTURE(i);
    CHECK(std::memcmp(runs[0][i].raw(), runs[1][i].raw(), runs[0][i].nbytes()) == 0);
  }
}

TEST_CASE(
    "GPU: LeNet steps with the optimizer updates merged into horizontal launches give the bits of "
    "the same steps without them (SGD momentum and Adam, fp32 and bf16 with weight copies)") {
  if (!have_gpu()) return;
  for (const char* optimizer : {"sgd", "adam"})
    for (const Precision precision : {Precision::fp32, Precision::bf16}) {
      CAPTURE(optimizer);
      CAPTURE(precision_name(precision));
      std::vector<std::vector<Tensor>> params(2);
      std::vector<std::vector<double>> losses(2);
      for (int merged = 0; merged < 2; ++merged) {
        ModelGraph m = build_model_graph("lenet", Stage::train, 64,
                                         {.name = optimizer, .lr = 0.01, .momentum = 0.9}, 5);
        if (!merged) setenv("KILN_HORIZONTAL", "0", 1);
        auto step = compile(
            *m.graph, {.device = Device::cuda(), .precision = precision, .deterministic = true});
        unsetenv("KILN_HORIZONTAL");
        for (int s = 0; s < 4; ++s)  // the first run, the capture, then replays
          losses[static_cast<std::size_t>(merged)].push_back(
              step->run(random_feeds(*m.graph, 70 + static_cast<std::uint64_t>(s)))
                  .at("loss")
                  .item());
        for (const VariablePtr& p : m.model->parameters())
          params[static_cast<std::size_t>(merged)].push_back(cuda::to_host(p->value));
      }
      CHECK(losses[0] == losses[1]);  // the bf16 copies the updates wrote fed each next step
      for (std::size_t i = 0; i < params[0].size(); ++i) {
        CAPTURE(i);
        CHECK(std::memcmp(params[0][i].raw(), params[1][i].raw(), params[0][i].nbytes()) == 0);
      }
    }
}

TEST_CASE("GPU: prefetched batches give the same steps as batches copied at run time") {
  if (!have_gpu()) return;
  std::vector<std::vector<Feed>> batches;
  ModelGraph probe = build_model_graph("lenet", Stage::train, 64, {.name = "sgd"}, 2);
  for (int s = 0; s < 6; ++s)
    batches.push_back(random_feeds(*probe.graph, 300 + static_cast<std::uint64_t>(s)));
  std::vector<double> losses[2];
  for (int prefetch = 0; prefetch < 2; ++prefetch) {
    ModelGraph m = build_model_graph("lenet", Stage::train, 64, {.name = "sgd"}, 2);
    auto step = compile(*m.graph, {.device = Device::cuda()});
    for (std::size_t s = 0; s < batches.size(); ++s) {
      if (prefetch && s + 1 < batches.size()) step->prefetch(batches[s + 1]);
      losses[prefetch].push_back(step->run(batches[s]).at("loss").item());
    }
  }
  for (std::size_t s = 0; s < losses[0].size(); ++s) CHECK(losses[0][s] == losses[1][s]);
}

TEST_CASE("GPU: out of memory is a kiln::Error with the request and what is in use") {
  if (!have_gpu()) return;
  CHECK_THROWS_WITH_AS(cuda::device_allocator().allocate(std::size_t{1} << 50),
                       doctest::Contains("CUDA out of memory: a request of"), Error);
  const auto small = cuda::device_allocator().allocate(1000);  // still usable afterwards
  CHECK(small->data() != nullptr);
}

TEST_CASE("GPU: the caching allocator makes no cudaMalloc in the steady state") {
  if (!have_gpu()) return;
  ModelGraph m = build_model_graph("lenet", Stage::train, 64, {.name = "sgd"}, 1);
  auto step = compile(*m.graph, {.device = Device::cuda()});
  const std::vector<Feed> feeds = random_feeds(*m.graph, 1);
  step->run(feeds);
  step->run(feeds);
  const std::size_t mallocs = cuda::device_allocator().stats().device_mallocs;
  for (int i = 0; i < 10; ++i) step->run(feeds);
  CHECK(cuda::device_allocator().stats().device_mallocs == mallocs);
}
#endif

TEST_CASE(
    "GPU: a program compiled and run while DeviceWarmUp's thread starts the device matches the "
    "CPU") {
  if (!have_gpu()) return;
  Graph g;
  const Value x = g.input("x", {33, 20}), w = g.input("w", {20, 17});
  g.output("y", tanh(matmul(x, w)) * 2.0);
  const std::vector<Feed> feeds = {{"x", test::random_tensor({33, 20}, DType::f32, 70)},
                                   {"w", test::random_tensor({20, 17}, DType::f32, 71)}};
  for (int i = 0; i < 3; ++i) {  // the warm-up's GEMM and context calls race the program's own
    const DeviceWarmUp warming(Device::cuda());
    test::check_gpu_matches_cpu(g, feeds, 1e-5);
  }
}

}  // namespace kiln
