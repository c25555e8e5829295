// Every op of the table in bf16 and in f16 on the GPU against the CPU in the same precision
// (issue 16): one row per op, forward (the op on fresh random low-precision inputs) and
// backward (the gradient graph of a weighted sum of its first output, in the same precision).
// The CPU computes in f32 and rounds each stored value once (backends/cpu/low_precision.h),
// as the GPU kernels do. Without a GPU only the coverage check runs.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "backends/compile.h"
#include "graph/autograd.h"
#include "graph/op_table.h"
#include "graph/ops.h"
#include "tests/support.h"

#ifdef KILN_HAVE_CUDA
#include "backends/cuda/conv.h"
#include "backends/cuda/lstm.h"
#endif

namespace kiln {
namespace {

// The tolerance of one row: |gpu - cpu| <= atol + rtol |cpu| elementwise, with
// rtol = ulps * u(dtype) and atol = rtol / 16 (inputs are of unit scale). u is the largest
// spacing of adjacent values relative to a value: bf16 has 8 significant bits (u = 2^-7),
// f16 11 (u = 2^-10). The two devices compute the same f32 math from the same rounded inputs
// but may sum in another order, so a stored result can land on the neighbouring value: one
// ulp per rounding the result went through. Forward rows allow 2, backward graphs (several
// ops, each storing rounded) 4; the LSTM rows more, since the GPU's recurrence reads back the
// rounded h and c of the step before where the CPU's keeps them in f32 inside the op.
// 0 ulps: the bits must be equal (data movement, one_hot, random_uniform).
double unit_roundoff(DType dtype) { return dtype == DType::bf16 ? 0x1p-7 : 0x1p-10; }

struct Tolerance {
  double atol, rtol;
};
Tolerance tolerance_of(DType dtype, int ulps) {
  if (ulps == 0) return {1e-300, 0.0};
  const double rtol = ulps * unit_roundoff(dtype);
  return {rtol / 16, rtol};
}

using Values = std::vector<Value>;

// The inputs a row's graph makes: floating ones of the row's dtype, uniform in
// [-scale, scale) (the gradient is taken with respect to them), integer labels in [0, 10)
// and scalar steps.
struct Inputs {
  Graph& g;
  DType dtype;
  Values floating;
  std::map<std::string, double> scales;
  Value x(const Shape& shape, double scale = 2.0) {
    const std::string name = "x" + std::to_string(floating.size());
    scales[name] = scale;
    floating.push_back(g.input(name, shape, dtype));
    return floating.back();
  }
  Value labels(const Shape& shape) { return g.input("labels", shape, DType::i64); }
  Value step() { return g.input("step", {}, DType::i64); }
};

struct OpRow {
  OpId op;  // the op of the table this row covers
  std::string label;
  std::function<Values(Inputs&)> build;  // the row's outputs, the first one differentiated
  int ulps = 2;
  bool backward = true;
  std::function<void(bool)> force = nullptr;  // a CUDA path forced on (true) and off again
};

std::vector<Feed> random_feeds(const Inputs& in, std::uint64_t seed) {
  std::vector<Feed> feeds;
  for (const Node& n : in.g.nodes()) {
    if (n.op->id != OpId::input) continue;
    const TensorType& t = n.outputs[0];
    if (is_floating(t.dtype)) {
      const double scale = in.scales.at(n.name);
      feeds.emplace_back(
          n.name, test::random_tensor(t.shape, DType::f32, seed++, -scale, scale).to(t.dtype));
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

// The message of the GPU compiler before the fused code generator handles bf16/f16.
bool codegen_not_yet(const Error& e) {
  return std::string(e.what()).find("does not handle bf16 or f16") != std::string::npos;
}

// Runs g on the CPU and on the GPU (the first run and a CUDA-graph replay) and checks every
// output; false when the GPU cannot compile it yet (said with MESSAGE, never silently).
bool check_on_gpu(const Inputs& in, std::uint64_t seed, Tolerance tol, const std::string& what) {
  const Graph& g = in.g;
  const std::vector<Feed> feeds = random_feeds(in, seed);
  const Outputs cpu = compile(g)->run(feeds);
  std::unique_ptr<Program> gpu;
  try {
    gpu = compile(g, {.device = Device::cuda()});
  } catch (const Error& e) {
    if (!codegen_not_yet(e)) throw;
    MESSAGE("skipped, codegen not yet: " << what);
    return false;
  }
  for (int run = 0; run < 2; ++run) {
    const Outputs out = gpu->run(feeds);
    for (const auto& [name, want] : cpu) {
      CAPTURE(name);
      CAPTURE(run);
      const double closeness = test::closeness(out.at(name), want, tol.atol, tol.rtol);
      CHECK(closeness <= 1.0);
      if (run == 0 && closeness > 0.25) MESSAGE(what << " " << name << ": closeness " << closeness);
    }
  }
  return true;
}

// The row's forward graph: its outputs y0, y1, ...
void build_forward(const OpRow& row, Inputs& in) {
  const Values out = row.build(in);
  for (std::size_t i = 0; i < out.size(); ++i) in.g.output("y" + std::to_string(i), out[i]);
}

// The row's backward graph: the gradients grad0, ... of sum(y0 * weights) with respect to
// the floating inputs, weights a random input of y0's dtype (not differentiated).
void build_backward(const OpRow& row, Inputs& in) {
  const Value y = row.build(in)[0];
  in.scales["weights"] = 1.0;
  // The product is y0's dtype, its sum f32 (as under autocast; the gradient's seed stays f32).
  const Value product = y * in.g.input("weights", y.shape(), y.dtype());
  const Values grads = grad(sum_all(cast(product, DType::f32)), in.floating);
  for (std::size_t i = 0; i < grads.size(); ++i) in.g.output("grad" + std::to_string(i), grads[i]);
}

void force_tensor_cores(bool on);

void check_row(const OpRow& row, DType dtype, std::uint64_t seed) {
  const std::string what = row.label + " in " + std::string(dtype_name(dtype));
  CAPTURE(what);
  // A row without a path of its own runs its convolutions on the tensor cores in bf16/f16.
  const std::function<void(bool)> force = row.force ? row.force : force_tensor_cores;
  force(true);
  {
    Graph g;
    Inputs in{g, dtype, {}, {}};
    build_forward(row, in);
    check_on_gpu(in, seed, tolerance_of(dtype, row.ulps), what + ", forward");
  }
  if (row.backward) {
    Graph g;
    Inputs in{g, dtype, {}, {}};
    build_backward(row, in);
    check_on_gpu(in, seed + 1, tolerance_of(dtype, std::max(row.ulps, 4)), what + ", backward");
  }
  force(false);
}

// Every output of the graph runs on the CPU and is finite.
void check_runs_on_cpu(const Inputs& in, std::uint64_t seed) {
  const Outputs out = compile(in.g)->run(random_feeds(in, seed));
  for (const auto& [name, t] : out) {
    CAPTURE(name);
    for (std::int64_t i = 0; i < t.numel(); ++i) REQUIRE(std::isfinite(t.at(i)));
  }
}

#ifdef KILN_HAVE_CUDA
void force_im2col(bool on) {
  cuda::detail::set_conv_algo_for_testing(on ? cuda::detail::ConvAlgo::im2col_gemm
                                             : cuda::detail::ConvAlgo::automatic);
}
void force_cuda_cores(bool on) {
  cuda::detail::set_conv_algo_for_testing(on ? cuda::detail::ConvAlgo::cuda_cores
                                             : cuda::detail::ConvAlgo::automatic);
}
void force_mma_nchw(bool on) {
  cuda::detail::set_conv_algo_for_testing(on ? cuda::detail::ConvAlgo::mma_nchw
                                             : cuda::detail::ConvAlgo::automatic);
}
// The tensor cores whatever a pass's size (the rows' shapes are below the size rule).
void force_tensor_cores(bool on) {
  cuda::detail::set_conv_algo_for_testing(on ? cuda::detail::ConvAlgo::tensor_cores
                                             : cuda::detail::ConvAlgo::automatic);
}
// The LSTM's step kernels (bf16 and f16 otherwise run on the tensor-core kernels).
void force_lstm_steps(bool on) {
  cuda::detail::set_lstm_persistent_for_testing(on ? cuda::detail::LstmPersistent::never
                                                   : cuda::detail::LstmPersistent::automatic);
}
#else
void force_mma_nchw(bool) {}
void force_tensor_cores(bool) {}
void force_im2col(bool) {}
void force_cuda_cores(bool) {}
void force_lstm_steps(bool) {}
#endif

using V = const Values&;
Values one(Value v) { return {v}; }

// Elementwise ops and reductions: fused groups, generated by the CUDA code generator.
std::vector<OpRow> fused_rows() {
  return {
      {OpId::add, "add, broadcast",
       [](Inputs& in) {
         return one(in.x({4, 8}) + in.x({8}));
       }},
      {OpId::sub, "sub",
       [](Inputs& in) {
         return one(in.x({4, 8}) - in.x({4, 8}));
       }},
      {OpId::mul, "mul",
       [](Inputs& in) {
         return one(in.x({4, 8}) * in.x({4, 1}));
       }},
      {OpId::div, "div",
       [](Inputs& in) {
         Value b = in.x({4, 8});
         return one(in.x({4, 8}) / (b * b + 1.0));
       }},
      {OpId::maximum, "maximum",
       [](Inputs& in) {
         return one(maximum(in.x({5, 7}), in.x({5, 7})));
       }},
      {OpId::greater, "greater",
       [](Inputs& in) {
         return one(greater(in.x({5, 7}), in.x({7})));
       },
       0, false},
      {OpId::equal, "equal",
       [](Inputs& in) {
         Value a = in.x({5, 7});
         return one(equal(relu(a), a));
       },
       0, false},
      {OpId::select, "select by a comparison",
       [](Inputs& in) {
         Value a = in.x({5, 7});
         return one(select(greater(a, in.x({7})), a, in.x({5, 7}) * 3.0));
       }},
      {OpId::neg, "neg",
       [](Inputs& in) {
         return one(-in.x({6, 5}));
       }},
      {OpId::exp, "exp",
       [](Inputs& in) {
         return one(exp(in.x({6, 5})));
       }},
      {OpId::log, "log",
       [](Inputs& in) {
         Value a = in.x({6, 5});
         return one(log(a * a + 0.5));
       }},
      {OpId::sqrt, "sqrt",
       [](Inputs& in) {
         Value a = in.x({6, 5});
         return one(sqrt(a * a + 1.0));
       }},
      {OpId::relu, "relu",
       [](Inputs& in) {
         return one(relu(in.x({6, 5})));
       }},
      {OpId::tanh, "tanh",
       [](Inputs& in) {
         return one(tanh(in.x({6, 5})));
       }},
      {OpId::gelu, "gelu",
       [](Inputs& in) {
         return one(gelu(in.x({6, 5}) * 3.0));
       }},
      {OpId::broadcast_to, "broadcast_to",
       [](Inputs& in) {
         return one(broadcast_to(in.x({1, 8}), {5, 8}));
       }},
      {OpId::detach, "detach",
       [](Inputs& in) {
         Value a = in.x({6, 5});
         return one(detach(a) * a);
       }},
      {OpId::reduce_sum, "reduce_sum",
       [](Inputs& in) {
         return one(sum(in.x({4, 6, 5}), {0, 2}));
       }},
      {OpId::reduce_max, "reduce_max",
       [](Inputs& in) {
         return one(max(in.x({4, 6, 5}), {1}, true));
       }},
      {OpId::reshape, "reshape (alias) of a GEMM",
       [](Inputs& in) {
         return one(reshape(matmul(in.x({4, 6}), in.x({6, 8})), {8, 4}));
       }},
  };
}

std::vector<OpRow> layout_rows() {
  return {
      {OpId::transpose, "transpose",
       [](Inputs& in) {
         return one(transpose(in.x({2, 3, 4}), {2, 0, 1}));
       },
       0},
      {OpId::slice, "slice of a GEMM",
       [](Inputs& in) {
         return one(slice(matmul(in.x({6, 4}), in.x({4, 8})), 1, 2, 5));
       }},
      {OpId::concat, "concat axis 1",
       [](Inputs& in) {
         return one(concat({in.x({2, 3, 4}), in.x({2, 1, 4}), in.x({2, 5, 4})}, 1));
       },
       0},
      {OpId::pad, "pad axis 1",
       [](Inputs& in) {
         return one(pad(in.x({3, 5}), 1, 1, 3));
       },
       0},
      {OpId::one_hot, "one_hot of i64 labels",
       [](Inputs& in) { return one(one_hot(in.labels({9}), 10, in.dtype)); }, 0, false},
      {OpId::random_uniform, "random_uniform",
       [](Inputs& in) {
         const RandomUniform r = random_uniform(in.step(), {1001}, 42, in.dtype);
         return Values{r.values, r.next_step};
       },
       0, false},
      {OpId::cast, "cast to f32 and f64",
       [](Inputs& in) {
         Value a = in.x({7, 3});
         return Values{cast(a, DType::f32), cast(a, DType::f64)};
       },
       0},
      {OpId::all_reduce_mean, "all_reduce_mean, one process",
       [](Inputs& in) {
         return all_reduce_mean({in.x({5, 4}), in.x({3})}, 0);
       },
       0},
  };
}

std::vector<OpRow> gemm_conv_rows() {
  return {
      {OpId::matmul, "matmul",
       [](Inputs& in) {
         return one(matmul(in.x({6, 40}), in.x({40, 7})));
       }},
      {OpId::matmul, "matmul transposed, batched",
       [](Inputs& in) {
         return one(matmul(in.x({2, 33, 6}), in.x({2, 7, 33}), true, true));
       }},
      {OpId::conv2d, "conv2d 3x3 pad 1, 16 channels (implicit GEMM)",
       [](Inputs& in) {
         return one(conv2d(in.x({3, 4, 9, 7}), in.x({16, 4, 3, 3}), 1, 1));
       }},
      {OpId::conv2d, "conv2d stride 2, 3 channels (im2col), 1x1",
       [](Inputs& in) {
         Value x = in.x({2, 3, 9, 8});
         return Values{conv2d(x, in.x({3, 3, 3, 3}), 2, 0), conv2d(x, in.x({5, 3, 1, 1}))};
       }},
      {OpId::conv2d, "conv2d on the tensor cores: 70 5x3 filters, stride 2 (scalar weight loads)",
       [](Inputs& in) {
         return one(conv2d(in.x({3, 3, 17, 13}), in.x({70, 3, 5, 3}), 2, 1));
       }},
      {OpId::conv2d, "conv2d on the tensor cores: 33 filters over 24 channels (partial tiles)",
       [](Inputs& in) {
         return one(conv2d(in.x({2, 24, 11, 9}), in.x({33, 24, 3, 3}), 1, 1));
       }},
      {OpId::conv2d, "conv2d on the tensor cores: 18 K steps, 96 filters",
       [](Inputs& in) {
         return one(conv2d(in.x({4, 64, 10, 10}, 1.0), in.x({96, 64, 3, 3}, 0.5), 1, 1));
       }},
      {OpId::conv2d, "conv2d on the tensor cores in tiles of 128 filters (130 of them; K 144, 45)",
       [](Inputs& in) {
         return Values{conv2d(in.x({5, 16, 30, 30}, 1.0), in.x({130, 16, 3, 3}, 0.5), 1, 1),
                       conv2d(in.x({5, 5, 30, 30}, 1.0), in.x({130, 5, 3, 3}, 0.5), 1, 1)};
       },
       2, false},
      {OpId::conv2d, "conv2d forced to the CUDA-core implicit GEMM",
       [](Inputs& in) {
         return one(conv2d(in.x({2, 24, 11, 9}), in.x({33, 24, 3, 3}), 1, 1));
       },
       2, false, force_cuda_cores},
      {OpId::conv2d, "conv2d, every pass forced to im2col + cuBLAS",
       [](Inputs& in) {
         return one(conv2d(in.x({3, 4, 9, 7}), in.x({16, 4, 3, 3}), 1, 1));
       },
       2, true, force_im2col},
      {OpId::conv2d_grad_input, "conv2d_grad_input stride 1 and 2",
       [](Inputs& in) {
         Value w = in.x({16, 24, 3, 3});
         return Values{conv2d_grad_input(in.x({2, 16, 7, 7}), w, {2, 24, 7, 7}, 1, 1),
                       conv2d_grad_input(in.x({2, 16, 5, 5}), w, {2, 24, 9, 9}, 2, 1)};
       },
       2, false},
      {OpId::conv2d_grad_weight, "conv2d_grad_weight, split K",
       [](Inputs& in) {
         return one(conv2d_grad_weight(in.x({8, 16, 12, 12}), in.x({8, 32, 12, 12}), {32, 16, 3, 3},
                                       1, 1));
       },
       2, false},
      // The tensor-core grad_input (stride 1, transposed weights, mirrored taps): partial tiles of
      // 33 and 130 channels (64 and 128 a tile), a 5x3 filter with padding 2 and 1, batch 1.
      {OpId::conv2d_grad_input, "conv2d_grad_input on the tensor cores: 33 and 130 channels",
       [](Inputs& in) {
         return Values{
             conv2d_grad_input(in.x({1, 20, 11, 11}), in.x({20, 33, 5, 3}), {1, 33, 11, 9}, 1, 2),
             conv2d_grad_input(in.x({5, 24, 30, 30}), in.x({24, 130, 3, 3}, 0.5), {5, 130, 30, 30},
                               1, 1)};
       },
       2, false},
      // At stride 2 the tensor cores read dy as if dilated: a 1x1 filter over odd and even sizes
      // (7 and 8: the last row and column get nothing), 3x3 with padding over 130 channels.
      {OpId::conv2d_grad_input, "conv2d_grad_input on the tensor cores at stride 2",
       [](Inputs& in) {
         Value w1 = in.x({20, 40, 1, 1});
         return Values{conv2d_grad_input(in.x({3, 20, 4, 4}), w1, {3, 40, 7, 7}, 2, 0),
                       conv2d_grad_input(in.x({3, 20, 4, 4}), w1, {3, 40, 8, 8}, 2, 0),
                       conv2d_grad_input(in.x({2, 24, 8, 8}), in.x({24, 130, 3, 3}, 0.5),
                                         {2, 130, 16, 16}, 2, 1)};
       },
       2, false},
      // The tensor-core grad_weight: odd pixel counts (dy by scalar loads), stride 2, 70 and 130
      // filters, one split and many (a K of 8 * 32 * 32 pixels).
      {OpId::conv2d_grad_weight, "conv2d_grad_weight on the tensor cores: odd sizes, split K",
       [](Inputs& in) {
         return Values{
             conv2d_grad_weight(in.x({1, 5, 13, 11}), in.x({1, 70, 7, 6}), {70, 5, 3, 3}, 2, 1),
             conv2d_grad_weight(in.x({8, 3, 32, 32}), in.x({8, 130, 32, 32}, 0.5), {130, 3, 3, 3},
                                1, 1),
             conv2d_grad_weight(in.x({2, 40, 8, 8}), in.x({2, 64, 8, 8}), {64, 40, 3, 3}, 1, 1)};
       },
       2, false},
      // The channels-last passes (image channels % 8 == 0): 8 channels, so that each 32-row K
      // step spans several taps; 5x5 at stride 2 and padding 2 over batch 1; no padding; filter
      // counts that leave partial tiles.
      {OpId::conv2d, "conv2d channels-last: 8 and 16 channels, 5x5 stride 2, no padding",
       [](Inputs& in) {
         return Values{conv2d(in.x({1, 8, 13, 11}), in.x({40, 8, 5, 5}), 2, 2),
                       conv2d(in.x({3, 16, 7, 9}), in.x({72, 16, 3, 3}), 1, 0)};
       },
       2, false},
      // ... and grad_input over dy of 8 and 16 channels, at stride 2 (dilated) and stride 1.
      {OpId::conv2d_grad_input, "conv2d_grad_input channels-last: 8 and 16 dy channels",
       [](Inputs& in) {
         return Values{
             conv2d_grad_input(in.x({2, 8, 6, 5}), in.x({8, 40, 3, 3}), {2, 40, 11, 9}, 2, 1),
             conv2d_grad_input(in.x({1, 16, 9, 9}), in.x({16, 24, 5, 5}), {1, 24, 9, 9}, 1, 2)};
       },
       2, false},
      // The weights' channels-last copies in several chunks of a row, partial ones at the end:
      // 72 filters by 40 channels of 3x3, 130 by 72 of 1x1 (chunks of 64), 7x7 (smaller chunks for
      // its 49 taps), forward and mirrored for grad_input.
      {OpId::conv2d, "conv2d channels-last: weight copies of several chunks, 1x1 to 7x7",
       [](Inputs& in) {
         return Values{conv2d(in.x({2, 40, 6, 5}), in.x({72, 40, 3, 3}, 0.5), 1, 1),
                       conv2d(in.x({1, 72, 5, 4}), in.x({130, 72, 1, 1}, 0.5), 1, 0),
                       conv2d(in.x({1, 16, 9, 8}), in.x({24, 16, 7, 7}, 0.5), 1, 3)};
       },
       2, false},
      {OpId::conv2d_grad_input, "conv2d_grad_input channels-last: mirrored weight copies in chunks",
       [](Inputs& in) {
         return Values{
             conv2d_grad_input(in.x({2, 72, 6, 5}), in.x({72, 40, 3, 3}, 0.5), {2, 40, 6, 5}, 1, 1),
             conv2d_grad_input(in.x({1, 136, 5, 4}), in.x({136, 72, 1, 1}, 0.5), {1, 72, 5, 4}, 1,
                               0),
             conv2d_grad_input(in.x({1, 24, 9, 8}), in.x({24, 16, 7, 7}, 0.5), {1, 16, 9, 8}, 1,
                               3)};
       },
       2, false},
      // Stride-2 grad_input over dy read as if dilated: 5x5 with padding 2, 1x1 (odd rows and
      // columns of dx get nothing) over odd and even sides, 2x2 and 4x4, 72 dy channels into 40,
      // batch 1.
      {OpId::conv2d_grad_input, "conv2d_grad_input channels-last at stride 2: 1x1 to 5x5",
       [](Inputs& in) {
         return Values{
             conv2d_grad_input(in.x({2, 16, 5, 6}), in.x({16, 24, 5, 5}, 0.5), {2, 24, 10, 12}, 2,
                               2),
             conv2d_grad_input(in.x({1, 72, 4, 4}), in.x({72, 40, 1, 1}, 0.5), {1, 40, 7, 7}, 2, 0),
             conv2d_grad_input(in.x({3, 8, 4, 4}), in.x({8, 16, 1, 1}), {3, 16, 8, 8}, 2, 0),
             conv2d_grad_input(in.x({1, 24, 4, 5}), in.x({24, 16, 2, 2}), {1, 16, 9, 10}, 2, 0),
             conv2d_grad_input(in.x({2, 8, 5, 4}), in.x({8, 24, 4, 4}, 0.5), {2, 24, 10, 9}, 2, 1)};
       },
       2, false},
      // Few tiles over a long K: 256 channels of 3x3 into 40 filters, grad_input over 136 dy
      // channels, at stride 1 and at stride 2.
      {OpId::conv2d, "conv2d channels-last, few tiles over a long K",
       [](Inputs& in) {
         return Values{conv2d(in.x({2, 256, 4, 4}, 0.5), in.x({40, 256, 3, 3}, 0.5), 1, 1),
                       conv2d_grad_input(in.x({2, 136, 4, 4}), in.x({136, 64, 3, 3}, 0.5),
                                         {2, 64, 4, 4}, 1, 1),
                       conv2d_grad_input(in.x({1, 256, 3, 3}), in.x({256, 24, 3, 3}, 0.5),
                                         {1, 24, 6, 6}, 2, 1)};
       },
       2, false},
      // grad_weight over small grids (4x4, 2x4: several images per 32-pixel K step), stride 2
      // with padding, 8 and 40 channels, 1 split and many, 70 and 130 filters.
      {OpId::conv2d_grad_weight, "conv2d_grad_weight on the tensor cores: small grids, split K",
       [](Inputs& in) {
         return Values{
             conv2d_grad_weight(in.x({3, 8, 8, 8}), in.x({3, 70, 4, 4}), {70, 8, 3, 3}, 2, 1),
             conv2d_grad_weight(in.x({2, 40, 5, 7}), in.x({2, 16, 2, 4}), {16, 40, 5, 3}, 2, 1),
             conv2d_grad_weight(in.x({8, 16, 32, 32}, 0.5), in.x({8, 130, 32, 32}, 0.5),
                                {130, 16, 3, 3}, 1, 1)};
       },
       2, false},
      {OpId::conv2d, "conv2d, forward and backward forced to the NCHW tensor-core gather",
       [](Inputs& in) {
         return one(conv2d(in.x({2, 24, 11, 9}), in.x({40, 24, 3, 3}), 2, 1));
       },
       2, true, force_mma_nchw},
      {OpId::conv2d, "conv2d backward forced to the CUDA-core implicit GEMM",
       [](Inputs& in) {
         return one(conv2d(in.x({2, 20, 9, 9}), in.x({24, 20, 3, 3}), 1, 1));
       },
       2, true, force_cuda_cores},
  };
}

Values lstm_grad_row(Inputs& in) {
  const LstmSequenceGrad d =
      lstm_sequence_grad(in.x({15, 16}, 1.0), in.x({15, 16}, 1.0), in.x({16, 64}, 0.5),
                         in.x({5, 16}, 1.0), in.x({15, 16}, 1.0), in.x({15, 64}, 1.0), 3, false);
  return Values{d.d_projected, d.dh0, d.dc0};
}

std::vector<OpRow> pool_norm_lstm_rows() {
  return {
      {OpId::max_pool2d, "max_pool2d 2, 3/1, 3/2 pad 1",
       [](Inputs& in) {
         Value x = in.x({2, 3, 8, 6});
         return Values{max_pool2d(x, 2), max_pool2d(x, 3, 1), max_pool2d(x, 3, 2, 1)};
       },
       0},
      {OpId::max_pool2d_grad, "max_pool2d_grad 2 and 3/1",
       [](Inputs& in) {
         Value x = in.x({2, 3, 8, 6});
         return Values{max_pool2d_grad(x, in.x({2, 3, 4, 3}), 2, 2),
                       max_pool2d_grad(x, in.x({2, 3, 6, 4}), 3, 1)};
       },
       2, false},
      {OpId::max_pool2d_select, "max_pool2d_select 3/2 pad 1",
       [](Inputs& in) {
         return one(max_pool2d_select(in.x({2, 3, 7, 6}), in.x({2, 3, 7, 6}), 3, 2, 1));
       },
       0, false},
      {OpId::avg_pool2d, "avg_pool2d 2 and 3/1 pad 1",
       [](Inputs& in) {
         Value x = in.x({2, 3, 6, 7});
         return Values{avg_pool2d(x, 3, 1, 1), avg_pool2d(x, 2)};
       }},
      {OpId::avg_pool2d_grad, "avg_pool2d_grad 3/2 pad 1",
       [](Inputs& in) {
         return one(avg_pool2d_grad(in.x({2, 3, 4, 3}), {2, 3, 7, 6}, 3, 2, 1));
       },
       2, false},
      {OpId::layer_norm, "layer_norm, rows of 37 and of 300",
       [](Inputs& in) {
         const LayerNorm a = layer_norm_with_stats(in.x({6, 37}), 1e-5);
         const LayerNorm b = layer_norm_with_stats(in.x({2, 3, 300}), 1e-3);
         return Values{a.y, a.mean, a.rstd, b.y, b.mean, b.rstd};
       }},
      {OpId::layer_norm_grad, "layer_norm_grad",
       [](Inputs& in) {
         Value x = in.x({6, 37});
         const LayerNorm s = layer_norm_with_stats(x, 1e-5);
         return one(layer_norm_grad(in.x({6, 37}), x, s.mean, s.rstd));
       },
       4, false},
      {OpId::lstm_sequence, "lstm_sequence, 3 steps of 5 rows, 16 units (per-step kernels)",
       [](Inputs& in) {
         const LstmSequence s = lstm_sequence(in.x({15, 64}, 1.0), in.x({16, 64}, 0.5),
                                              in.x({5, 16}, 1.0), in.x({5, 16}, 1.0), 3, false);
         return Values{s.hs, s.cs, s.acts};
       },
       8, true, force_lstm_steps},
      {OpId::lstm_sequence, "lstm_sequence reversed, 64 units (tensor-core kernels)",
       [](Inputs& in) {
         const LstmSequence s = lstm_sequence(in.x({64, 256}, 1.0), in.x({64, 256}, 0.25),
                                              in.x({16, 64}, 1.0), in.x({16, 64}, 1.0), 4, true);
         return Values{s.hs, s.cs, s.acts};
       },
       8},
      {OpId::lstm_sequence_grad, "lstm_sequence_grad, 3 steps (tensor-core kernel)",
       [](Inputs& in) { return lstm_grad_row(in); }, 8, false},
      {OpId::lstm_sequence_grad, "lstm_sequence_grad, 3 steps (per-step kernels)",
       [](Inputs& in) { return lstm_grad_row(in); }, 8, false, force_lstm_steps},
      // (last: a row added moves the seeds of the rows after it, and the f16 LSTM gradient's
      // closeness is within a few percent of its bound on some of them)
      {OpId::max_pool2d_grad, "max_pool2d_grad relu=1, 2 and 3/2 pad 1",
       [](Inputs& in) {
         Value x = in.x({2, 3, 8, 6});
         return Values{max_pool2d_grad(x, in.x({2, 3, 4, 3}), 2, 2, 0, true),
                       max_pool2d_grad(x, in.x({2, 3, 4, 3}), 3, 2, 1, true)};
       },
       2, false},
  };
}

std::vector<OpRow> all_rows() {
  std::vector<OpRow> rows;
  for (auto* part : {fused_rows, layout_rows, gemm_conv_rows, pool_norm_lstm_rows})
    for (OpRow& r : part()) rows.push_back(std::move(r));
  return rows;
}

// Ops without a row, and why.
bool exempt(const OpDef& op) {
  return op.kind == OpKind::source ||      // input, variable, fill, tensor_constant: no kernel
         op.kind == OpKind::fused ||       // fusion's output: every elementwise row makes one
         op.id == OpId::matmul_bias ||     // the epilogue pass's: gemm_epilogue_test checks bf16
         op.id == OpId::conv2d_bias ||     // the CPU's epilogue pass's: conv_epilogue_test, bf16
         op.id == OpId::conv2d_moments ||  // the conv-statistics pass's: conv_statistics_test
         op.id == OpId::conv_filter_layout ||  // the filter layout pass's: filter_layouts_test
         op.id == OpId::gather_rows ||         // the one-hot products pass makes these two for f32
         op.id == OpId::scatter_add_rows;      // and f64 products only
}

}  // namespace

TEST_CASE("every op of the table has a bf16/f16 GPU row or a reason not to") {
  std::set<OpId> covered;
  for (const OpRow& row : all_rows()) covered.insert(row.op);
  for (const OpDef* op : all_ops()) {
    CAPTURE(op->name);
    CHECK((covered.count(op->id) == 1 || exempt(*op)));
  }
}

TEST_CASE("every row's graphs, forward and backward, run on the CPU in bf16 and f16") {
  std::uint64_t seed = 1000;
  for (const OpRow& row : all_rows())
    for (DType dtype : {DType::bf16, DType::f16}) {
      CAPTURE(row.label);
      CAPTURE(dtype_name(dtype));
      Graph forward;
      Inputs in{forward, dtype, {}, {}};
      build_forward(row, in);
      check_runs_on_cpu(in, seed += 10);
      if (!row.backward) continue;
      Graph backward;
      Inputs back{backward, dtype, {}, {}};
      build_backward(row, back);
      check_runs_on_cpu(back, seed + 1);
    }
}

TEST_CASE(
    "GPU: every op, forward and backward, in bf16 and f16 matches the CPU in the same precision") {
  if (!test::have_gpu()) return;
  std::uint64_t seed = 1000;
  for (const OpRow& row : all_rows())
    for (DType dtype : {DType::bf16, DType::f16}) check_row(row, dtype, seed += 10);
}

}  // namespace kiln
