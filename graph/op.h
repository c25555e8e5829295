// The op table's entry type (DESIGN.md convention 1): everything kiln knows about an op
// lives in its OpDef, declared once in graph/ops/.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace kiln {

enum class OpKind {
  source,       // input, variable, constant: no inputs, produced outside kernels
  elementwise,  // one output element from the same-index (broadcast) input elements
  reduction,    // reduces axes (sum, max)
  layout,       // moves elements (reshape, transpose, broadcast_to)
  matmul,
  conv,
  pool,
  fused,  // a group of ops compiled together; its NodeBody says what it computes
  other,
};
const char* op_kind_name(OpKind kind);

// What a gradient function sees: the forward node's inputs and outputs, the gradients
// arriving at its outputs, and which inputs need a gradient.
struct GradContext {
  Graph& graph;
  const Node& node;
  std::vector<Value> inputs;
  std::vector<Value> outputs;
  std::vector<Value> output_grads;  // invalid where an output received no gradient
  std::vector<bool> needs_grad;
};
// Returns one gradient per input (invalid Value: none). A gradient may have the output's
// broadcast shape; autograd sums it down to the input's shape.
using GradFn = std::function<std::vector<Value>(const GradContext&)>;

// Infers output types from input types and attributes; throws kiln::Error naming the op.
using InferFn =
    std::function<std::vector<TensorType>(std::span<const TensorType> inputs, const Attrs& attrs)>;

// A reference CPU kernel: reads inputs, writes preallocated contiguous outputs.
// Bits of KernelCall::blocked and of the cpu_blocked hooks: input i is bit i, output o is bit
// kBlockedOutputs + o. A value so marked is stored in oneDNN's 16-channel blocked layout
// (aBcd16b: [B][C / 16][H][W][16]) instead of NCHW (backends/cpu/blocked_layout.h).
constexpr std::uint32_t kBlockedOutputs = 16;
struct KernelCall {
  const Node& node;
  std::span<const Tensor> inputs;
  std::span<Tensor> outputs;
  std::uint32_t blocked = 0;
};
using CpuKernel = std::function<void(const KernelCall&)>;

// Elementwise ops evaluate runs of n elements; in_step[k] is 1 for a contiguous input
// and 0 for one broadcast along the run. The CPU evaluator (and later the fused CPU
// evaluator) calls these, so an elementwise op needs no kernel of its own.
template <class T>
using ElementwiseLoop = void (*)(const T* const* in, const std::int64_t* in_step, T* out,
                                 std::int64_t n);
struct ElementwiseLoops {
  ElementwiseLoop<float> f32 = nullptr;
  ElementwiseLoop<double> f64 = nullptr;
};

// The body of a node whose op is defined by the node itself (a fused group, built by
// fusion/fuse): its type rule and CPU evaluation, behind an interface so that graph/
// needs nothing from the layers above it.
class NodeBody {
 public:
  virtual ~NodeBody() = default;
  virtual std::vector<TensorType> infer(std::span<const TensorType> inputs) const = 0;
  virtual void run_cpu(const KernelCall& call) const = 0;
  virtual std::string summary()
      const = 0;  // one line: "fused 7 ops (relu, mul, ...) -> f32[64, 10]"
  // The inputs and outputs its CPU evaluation can take in the blocked layout (the bits of
  // KernelCall::blocked), given the input types.
  virtual std::uint32_t cpu_blocked(std::span<const TensorType> /*inputs*/) const { return 0; }
};

// How a reduction combines values (reductions only), so that the fuse pass, the code
// generator and the CPU evaluators read the op's entry instead of naming the op. Made by
// make_reduction_rule (graph/reduction_rule.h) from one combine function.
enum class NanRule {
  arithmetic,  // IEEE arithmetic carries a NaN to the result by itself (sum)
  propagate,   // the combine must be told: a NaN value wins over any accumulator (max)
};
struct ReductionRule {
  double identity = 0.0;  // the accumulator's start value
  NanRule nan = NanRule::arithmetic;
  // CUDA C combining accumulator {0} with value {1}, without the NaN rule (codegen adds it).
  std::string cuda_combine;
  // The CPU's combine with the NaN rule applied, in double: one value, a strided run folded
  // into one accumulator, and a strided run combined element by element into accumulators.
  double (*combine)(double acc, double value) = nullptr;
  double (*fold_f32)(double acc, const float* x, std::int64_t n, std::int64_t step) = nullptr;
  double (*fold_f64)(double acc, const double* x, std::int64_t n, std::int64_t step) = nullptr;
  void (*accumulate_f32)(double* acc, std::int64_t acc_step, const float* x, std::int64_t n,
                         std::int64_t step) = nullptr;
  void (*accumulate_f64)(double* acc, std::int64_t acc_step, const double* x, std::int64_t n,
                         std::int64_t step) = nullptr;
  // Rows of 16 contiguous f32 values combined element by element into acc[0, 16).
  void (*accumulate_rows16_f32)(double* acc, const float* x, std::int64_t rows) = nullptr;
};

// How the autocast pass (graph/passes/autocast.h) stores an op's values when a step runs in
// bf16 or f16 (DESIGN.md, Precision).
enum class AutocastPolicy {
  follow,  // elementwise, layout, pooling, norms: the dtype of the inputs of the output's own
           // size (f32 wins over bf16/f16); broadcast inputs and fills take that dtype
  low,     // GEMMs, convolutions, LSTMs: bf16/f16 inputs and output, fp32 accumulation inside
  fp32,    // reductions: fp32 inputs (widened where they are loaded) and output
  exact,   // comparisons: computed as `follow`, then stored low (0 and 1 are exact in any dtype)
  keep,    // sources, casts, collectives, one_hot, random numbers: left as they are
};

struct OpDef {
  OpId id = OpId::input;
  std::string name;  // op_id_name(id), filled in by the table
  OpKind kind = OpKind::other;
  int arity = 0;                   // number of inputs, -1 for variadic
  std::vector<std::string> attrs;  // attribute names the op requires
  InferFn infer;
  GradFn grad;             // empty: the op has no gradient (integer or piecewise-constant output)
  CpuKernel cpu;           // empty for sources and for elementwise ops (see loops)
  ElementwiseLoops loops;  // elementwise ops only
  std::string cuda;  // elementwise ops: CUDA C expression, {0} {1} the inputs, T the element type
  // Elementwise ops with a costly `cuda` (tanh, exp): a hardware approximation used where the
  // value is stored in bf16, whose 8 significant bits it exceeds (relative error 2^-11).
  std::string cuda_bf16;
  // Elementwise ops whose value is one of their inputs' values, its negation, 0 or 1 (relu,
  // maximum, select, neg, the comparisons, broadcast_to): on values representable in a dtype
  // the result is too, so generated bf16/f16 code does not round it again.
  bool exact = false;
  bool alias = false;  // output shares input 0's storage (reshape, detach)
  // Ops whose CPU kernel depends on the shapes, the dtype or the processor (convolutions:
  // oneDNN's Winograd or direct kernels, or kiln's own): the kernel this call runs, which
  // KILN_PROFILE=groups prints beside the op.
  std::function<std::string(const KernelCall&)> cpu_kernel_name;
  // Ops whose CPU kernel can read or write some of its values in the blocked layout
  // (convolutions through oneDNN): which (the bits of KernelCall::blocked) for these input
  // types, when the kernel is not in its reproducible mode.
  std::function<std::uint32_t(const Node&, std::span<const TensorType>)> cpu_blocked;
  ReductionRule reduction;  // reductions only
  AutocastPolicy autocast = AutocastPolicy::follow;
  // Ops that multiply (the products, the convolutions): the floating-point operations of one
  // call, two a multiply-add, from the node and its input types, so that a trace shows each
  // launch's rate (node_flops); empty: none counted.
  std::function<double(const Node&, std::span<const TensorType>)> flops;
};

}  // namespace kiln
