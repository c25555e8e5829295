// Helpers shared by the test suites: random tensors and running a graph on the CPU.
#pragma once

#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "backends/compile.h"
#include "core/philox.h"
#include "gpu/cuda_runtime.h"
#include "graph/autograd.h"
#include "graph/nn/functional.h"
#include "graph/op.h"
#include "graph/ops.h"
#include "graph/optim.h"

namespace kiln::test {

// A classifier's training step in `g`: the cross-entropy of model(x) (input "x" of `x_shape`)
// against input "labels", as output "loss", and the gradient of every parameter as "grad<k>";
// with an optimizer, its update of the parameters too (assignments).
template <class Model>
void add_classifier_step(Graph& g, Model& model, const Shape& x_shape,
                         Optimizer* optimizer = nullptr) {
  const Value loss =
      cross_entropy(model(g.input("x", x_shape)), g.input("labels", {x_shape[0]}, DType::i64));
  std::vector<Value> params;
  for (const VariablePtr& p : model.parameters()) params.push_back(g.variable(p));
  const std::vector<Value> grads = grad(loss, params);
  g.output("loss", loss);
  for (std::size_t k = 0; k < grads.size(); ++k) g.output("grad" + std::to_string(k), grads[k]);
  if (optimizer != nullptr) optimizer->append_update(g, model.parameters(), grads);
}

// Batch norm's backward sums over (N, H, W) as graph outputs "sum_dy", "sum_dy_xhat" and
// "max_dy" of inputs "dy" and "xhat" of `shape` stored in `dtype`: three sibling reductions of
// one group's values.
inline void add_sibling_sums(Graph& g, const Shape& shape, DType dtype) {
  const Value dy = relu(cast(g.input("dy", shape, dtype), DType::f32));
  const Value xhat = cast(g.input("xhat", shape, dtype), DType::f32);
  g.output("sum_dy", sum(dy, {0, 2, 3}));
  g.output("sum_dy_xhat", sum(dy * xhat, {0, 2, 3}));
  g.output("max_dy", max(dy, {0, 2, 3}));
}

// Whether a GPU is there; without one the calling GPU case says why it is skipped.
inline bool have_gpu() {
  if (gpu::cuda_device_count() > 0) return true;
  MESSAGE("skipped: " << gpu::cuda_unavailable_reason());
  return false;
}

// A host tensor with uniform values in [low, high), from `seed`.
inline Tensor random_tensor(const Shape& shape, DType dtype, std::uint64_t seed, double low = -1.0,
                            double high = 1.0) {
  Tensor t = Tensor::empty(shape, dtype);
  Philox rng(seed);
  rng.fill_uniform(t, low, high);
  return t;
}

// Compiles `g` for the CPU and runs it once.
inline Outputs run_once(const Graph& g, const std::vector<Feed>& feeds = {}) {
  return compile(g)->run(feeds);
}

// The tolerance (relative and absolute) of a GPU value against the CPU's in one dtype. Both
// compute in f32 and round where they store, but the GPU's exp, tanh or division may differ
// from the CPU's in the last f32 bit, which flips a 16-bit rounding now and then: one unit in
// the last place is 2^-8 relative for bf16 (8 significant bits) and 2^-11 for f16, and a flip
// feeds the operations after it, hence 4 units.
inline double dtype_tolerance(DType dtype) {
  if (dtype == DType::bf16) return 4.0 / 256;
  if (dtype == DType::f16) return 4.0 / 2048;
  return 1e-5;
}

// Largest |a - b| / (atol + rtol * |b|) over two tensors of the same shape; <= 1 means close.
inline double closeness(const Tensor& a, const Tensor& b, double atol, double rtol) {
  REQUIRE(a.shape() == b.shape());
  double worst = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.at(i), y = b.at(i);
    worst = std::max(worst, std::abs(x - y) / (atol + rtol * std::abs(y)));
  }
  return worst;
}

// The kernels a graph launches unfused or fused: its nodes that compute (not sources, not views).
inline int count_kernels(const Graph& g) {
  int kernels = 0;
  for (const Node& n : g.nodes()) kernels += n.op->kind != OpKind::source && !n.op->alias;
  return kernels;
}

// Random values in [-2, 2] for every floating input of g, class labels in [0, 10) for the others.
inline std::vector<Feed> random_feeds(const Graph& g, std::uint64_t seed) {
  std::vector<Feed> feeds;
  for (const Node& n : g.nodes()) {
    if (n.op->id != OpId::input) continue;
    const TensorType& t = n.outputs[0];
    if (is_floating(t.dtype)) {
      feeds.emplace_back(n.name, random_tensor(t.shape, t.dtype, seed++, -2, 2));
      continue;
    }
    Tensor labels = Tensor::empty(t.shape, t.dtype);
    Philox rng(seed++);
    for (std::int64_t i = 0; i < labels.numel(); ++i)
      labels.data<std::int64_t>()[i] = static_cast<std::int64_t>(rng.next_below(10));
    feeds.emplace_back(n.name, labels);
  }
  return feeds;
}

// Runs g on the CPU once and on the GPU three times with the same feeds (the first run, then
// CUDA-graph replays, which must not depend on what an earlier run left behind); every
// output must be close to the CPU's.
inline void check_gpu_matches_cpu(const Graph& g, const std::vector<Feed>& feeds,
                                  double tolerance) {
  const Outputs cpu = compile(g)->run(feeds);
  auto gpu_program = compile(g, {.device = Device::cuda()});
  for (int run = 0; run < 3; ++run) {
    const Outputs gpu = gpu_program->run(feeds);
    for (const auto& [name, tensor] : cpu) {
      CAPTURE(name);
      CAPTURE(run);
      CHECK(closeness(gpu.at(name), tensor, tolerance, tolerance) <= 1.0);
    }
  }
}

// A scratch directory "<name>-<pid>" under the system's temp directory (per process, so that
// suites of several worktrees can run at once), removed with everything in it at the end.
struct TempDir {
  explicit TempDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / (name + "-" + std::to_string(getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path path;
};

// One convolution layer of a test: its image's channels, its filters, the kernel's side, stride
// and padding; and the output side of an image `size` pixels square.
struct ConvLayer {
  std::int64_t channels, filters, kernel, stride, padding;
  std::int64_t out(std::int64_t size) const { return (size + 2 * padding - kernel) / stride + 1; }
};
inline std::ostream& operator<<(std::ostream& os, const ConvLayer& l) {
  return os << l.channels << " -> " << l.filters << ", " << l.kernel << "x" << l.kernel
            << " stride " << l.stride << " padding " << l.padding;
}
// The GPU's TMA passes at batch 128 over 16 x 16 images: the halo form (64 -> 64), the plain
// pass (64 -> 128), the input gradient by classes of pixels (stride 2) and a strided 1 x 1 (at
// batch 128 its forward, 128 x 8192 x 64, is at the tensor cores' size rule, mma_min_macs).
inline std::vector<ConvLayer> tma_conv_layers() {
  return {{64, 64, 3, 1, 1}, {64, 128, 3, 1, 1}, {64, 128, 3, 2, 1}, {64, 128, 1, 2, 0}};
}

// How many nodes of op `id` a graph holds.
inline int count_nodes(const Graph& g, OpId id) {
  int count = 0;
  for (const Node& n : g.nodes()) count += n.op->id == id;
  return count;
}

// The `extern "C" __global__` functions of a kernel source; each must begin with
// KILN_AFTER_PRIOR_GRIDS() (gpu/kernel_source.h), before anything touches global memory.
inline int kernels_after_prior_grids(const std::string& code) {
  const std::string global = "extern \"C\" __global__";
  int kernels = 0;
  for (std::size_t at = code.find(global); at != std::string::npos;
       at = code.find(global, at + 1)) {
    int depth = 0;  // the body's brace: the first at parenthesis depth 0 (after the parameters)
    std::size_t body = at;
    for (; body < code.size() && !(code[body] == '{' && depth == 0); ++body)
      depth += code[body] == '(' ? 1 : code[body] == ')' ? -1 : 0;
    const std::size_t first = code.find_first_not_of(" \n", body + 1);
    const bool begins =
        first != std::string::npos && code.compare(first, 25, "KILN_AFTER_PRIOR_GRIDS();") == 0;
    CHECK_MESSAGE(begins, "a kernel does not begin with KILN_AFTER_PRIOR_GRIDS(): " << code.substr(
                              at, body + 40 - at));
    ++kernels;
  }
  return kernels;
}

// Two tensors of one shape with the same values, element by element.
inline void check_same_bits(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  std::int64_t differ = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) differ += a.at(i) != b.at(i);
  CHECK(differ == 0);
}

// The outputs of one CPU run of g, then the values it assigned ("assigned <name>"), the
// variables restored after.
inline std::map<std::string, Tensor> run_and_restore(const Graph& g,
                                                     const std::vector<Feed>& feeds) {
  std::map<VariablePtr, Tensor> before;
  for (const auto& [var, ref] : g.assignments()) before[var] = var->value.clone();
  std::map<std::string, Tensor> results = run_once(g, feeds);
  for (auto& [var, value] : before) {
    results["assigned " + var->name] = var->value.clone();
    var->value.copy_from(value);
  }
  return results;
}

}  // namespace kiln::test
