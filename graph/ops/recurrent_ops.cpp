// lstm_sequence and lstm_sequence_grad: a whole LSTM direction's recurrence as one op each
// (docs/lstm_ops.md is the contract with the CUDA launchers). The gradient of
// lstm_sequence is lstm_sequence_grad plus one GEMM for the recurrent weights.
#include "graph/kernels/lstm_cpu.h"
#include "graph/ops.h"
#include "graph/ops/register.h"

namespace kiln {
namespace {

// T, B and H from the attributes, u [H, 4H] and a [T*B, ...] input, checking them.
kernels::LstmDims lstm_dims(const char* op, const Attrs& attrs, const TensorType& u,
                            const TensorType& rows) {
  const std::int64_t steps = attrs.integer("steps"), reverse = attrs.integer("reverse");
  KILN_CHECK(steps >= 1, "{}: steps is {} but must be at least 1", op, steps);
  KILN_CHECK(reverse == 0 || reverse == 1, "{}: reverse is {} but must be 0 or 1", op, reverse);
  const Shape& us = u.shape;
  KILN_CHECK(us[0] >= 1 && us[1] == 4 * us[0], "{}: u is {} but [H, 4H] with H >= 1 was expected",
             op, u.str());
  const std::int64_t n = rows.shape[0];
  KILN_CHECK(n % steps == 0, "{}: {} rows (T*B) are not a multiple of steps {}", op, n, steps);
  return {steps, n / steps, us[0], reverse == 1};
}

void check_shape(const char* op, const char* what, const TensorType& type, const Shape& expected) {
  KILN_CHECK(type.shape == expected, "{}: {} is {} but {} was expected", op, what, type.str(),
             expected.str());
}

void check_ranks(const char* op, std::span<const TensorType> in,
                 std::initializer_list<const char*> names) {
  std::size_t i = 0;
  for (const char* name : names) ops::check_rank(op, name, in[i++], 2);
}

// in: projected [T*B, 4H], u [H, 4H], h0 [B, H], c0 [B, H] -> hs, cs [T*B, H], acts [T*B, 4H]
std::vector<TensorType> infer_lstm_sequence(std::span<const TensorType> in, const Attrs& attrs) {
  const char* op = "lstm_sequence";
  ops::check_floating_inputs(op, in);
  check_ranks(op, in, {"projected", "u", "h0", "c0"});
  const kernels::LstmDims d = lstm_dims(op, attrs, in[1], in[0]);
  const std::int64_t n = d.steps * d.batch, h = d.hidden;
  check_shape(op, "projected", in[0], Shape({n, 4 * h}));
  check_shape(op, "h0", in[2], Shape({d.batch, h}));
  check_shape(op, "c0", in[3], Shape({d.batch, h}));
  const DType t = in[0].dtype;
  return {{Shape({n, h}), t}, {Shape({n, h}), t}, {Shape({n, 4 * h}), t}};
}

// in: d_hs, d_cs [T*B, H], u [H, 4H], c0 [B, H], cs [T*B, H], acts [T*B, 4H]
//   -> d_projected [T*B, 4H], dh0, dc0 [B, H]
std::vector<TensorType> infer_lstm_sequence_grad(std::span<const TensorType> in,
                                                 const Attrs& attrs) {
  const char* op = "lstm_sequence_grad";
  ops::check_floating_inputs(op, in);
  check_ranks(op, in, {"d_hs", "d_cs", "u", "c0", "cs", "acts"});
  const kernels::LstmDims d = lstm_dims(op, attrs, in[2], in[0]);
  const std::int64_t n = d.steps * d.batch, h = d.hidden;
  check_shape(op, "d_hs", in[0], Shape({n, h}));
  check_shape(op, "d_cs", in[1], Shape({n, h}));
  check_shape(op, "c0", in[3], Shape({d.batch, h}));
  check_shape(op, "cs", in[4], Shape({n, h}));
  check_shape(op, "acts", in[5], Shape({n, 4 * h}));
  const DType t = in[0].dtype;
  return {{Shape({n, 4 * h}), t}, {Shape({d.batch, h}), t}, {Shape({d.batch, h}), t}};
}

kernels::LstmDims node_dims(const KernelCall& call, std::size_t u_index) {
  const Tensor& u = call.inputs[u_index];
  const std::int64_t steps = call.node.attrs.integer("steps");
  return {steps, call.inputs[0].shape()[0] / steps, u.shape()[0],
          call.node.attrs.integer("reverse") == 1};
}

void lstm_sequence_cpu(const KernelCall& call) {
  const auto& in = call.inputs;
  kernels::lstm_forward(in[0], in[1], in[2], in[3], call.outputs[0], call.outputs[1],
                        call.outputs[2], node_dims(call, 1));
}

void lstm_sequence_grad_cpu(const KernelCall& call) {
  const auto& in = call.inputs;
  const kernels::LstmGradInputs grad_in{in[0], in[1], in[2], in[3], in[4], in[5]};
  kernels::lstm_backward(grad_in, call.outputs[0], call.outputs[1], call.outputs[2],
                         node_dims(call, 2));
}

// The h_prev of every time, rows in time order: [T*B, H].
Value previous_hidden(Value hs, Value h0, std::int64_t steps, bool reverse) {
  if (steps == 1) return h0;
  const std::int64_t batch = h0.shape()[0], rows = (steps - 1) * batch;
  if (reverse) return concat({slice(hs, 0, batch, rows), h0}, 0);
  return concat({h0, slice(hs, 0, 0, rows)}, 0);
}

std::vector<Value> lstm_sequence_backward(const GradContext& c) {
  KILN_CHECK(!c.output_grads[2].valid(),
             "lstm_sequence: the saved gates (output 2) have no gradient");
  const std::int64_t steps = c.node.attrs.integer("steps");
  const bool reverse = c.node.attrs.integer("reverse") == 1;
  auto grad_or_zeros = [&](std::size_t i) {
    const Value& out = c.outputs[i];
    return c.output_grads[i].valid() ? c.output_grads[i]
                                     : c.graph.fill(0.0, out.shape(), out.dtype());
  };
  const Value &u = c.inputs[1], &h0 = c.inputs[2], &c0 = c.inputs[3];
  const LstmSequenceGrad r = lstm_sequence_grad(grad_or_zeros(0), grad_or_zeros(1), u, c0,
                                                c.outputs[1], c.outputs[2], steps, reverse);
  Value du;
  if (c.needs_grad[1])
    du = matmul(previous_hidden(c.outputs[0], h0, steps, reverse), r.d_projected, true, false);
  return {r.d_projected, du, r.dh0, r.dc0};
}

Attrs lstm_attrs(std::int64_t steps, bool reverse) {
  return {{"steps", steps}, {"reverse", std::int64_t{reverse}}};
}

}  // namespace

void ops::register_recurrent_ops(std::vector<OpDef>& table) {
  OpDef forward{
      .id = OpId::lstm_sequence, .kind = OpKind::other, .arity = 4, .attrs = {"steps", "reverse"}};
  forward.infer = infer_lstm_sequence;
  forward.grad = lstm_sequence_backward;
  forward.cpu = lstm_sequence_cpu;
  // 16-bit under autocast, as PyTorch's autocast runs cuDNN's LSTM: on the GPU, bf16 and f16
  // with H % 16 == 0 run the tensor-core recurrence (backends/cuda/lstm.h). H200, device ms
  // at batch 64 / 256 against the fp32 policy: char-lstm bf16 0.951 / 3.44 -> 0.477 / 0.678,
  // row-lstm 0.357 / 0.924 -> 0.235 / 0.287, the same accuracy (bench/README.md). Other H
  // take the 16-bit step kernels, which are slower than their f32 forms (char-lstm's step
  // 1.3-1.6x when they were measured).
  forward.autocast = AutocastPolicy::low;
  table.push_back(std::move(forward));
  OpDef backward{.id = OpId::lstm_sequence_grad,
                 .kind = OpKind::other,
                 .arity = 6,
                 .attrs = {"steps", "reverse"}};
  backward.infer = infer_lstm_sequence_grad;
  backward.cpu = lstm_sequence_grad_cpu;  // no gradient: lstm_sequence's gradient check covers it
  backward.autocast = AutocastPolicy::low;
  table.push_back(std::move(backward));
}

LstmSequence lstm_sequence(Value projected, Value u, Value h0, Value c0, std::int64_t steps,
                           bool reverse) {
  const std::vector<Value> out = projected.graph().apply(
      OpId::lstm_sequence, {projected, u, h0, c0}, lstm_attrs(steps, reverse));
  return {out[0], out[1], out[2]};
}

LstmSequenceGrad lstm_sequence_grad(Value d_hs, Value d_cs, Value u, Value c0, Value cs, Value acts,
                                    std::int64_t steps, bool reverse) {
  const std::vector<Value> out = d_hs.graph().apply(
      OpId::lstm_sequence_grad, {d_hs, d_cs, u, c0, cs, acts}, lstm_attrs(steps, reverse));
  return {out[0], out[1], out[2]};
}

}  // namespace kiln
