// random_uniform: counter-based random numbers inside the graph. Element i of step s is
// word i % 4 of the Philox block (key = seed, counter = (i / 4, s)) mapped to [0, 1) by
// uniform_from_bits, on the CPU and on the GPU alike, so both give the same bits.
#include "core/dispatch.h"
#include "core/philox.h"
#include "graph/ops.h"
#include "graph/ops/register.h"

namespace kiln {
namespace {

std::vector<TensorType> infer_random(std::span<const TensorType> in, const Attrs& attrs) {
  KILN_CHECK(in[0].dtype == DType::i64 && in[0].shape.rank() == 0,
             "random_uniform: the step must be an i64 scalar but is {}", in[0].str());
  const DType dtype = dtype_from_name(attrs.text("dtype"));
  KILN_CHECK(is_floating(dtype), "random_uniform: dtype {} is not floating", dtype_name(dtype));
  const Shape shape(attrs.integers("shape"));
  for (std::int64_t d : shape.dims())
    KILN_CHECK(d >= 0, "random_uniform: shape {} has a negative dimension", shape.str());
  return {{shape, dtype}, {Shape{}, DType::i64}};
}

void random_kernel(const KernelCall& call) {
  const auto seed = static_cast<std::uint64_t>(call.node.attrs.integer("seed"));
  const std::int64_t step = call.inputs[0].data<std::int64_t>()[0];
  Tensor& out = call.outputs[0];
  visit_floating(out.dtype(), "random_uniform", [&](auto zero) {
    using T = decltype(zero);
    T* o = out.data<T>();
    const std::int64_t n = out.numel(), blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const auto words =
          philox_block(seed, static_cast<std::uint64_t>(b), static_cast<std::uint64_t>(step));
      for (std::int64_t w = 0; w < 4 && 4 * b + w < n; ++w)
        o[4 * b + w] = static_cast<T>(uniform_from_bits(words[static_cast<std::size_t>(w)]));
    }
  });
  call.outputs[1].data<std::int64_t>()[0] = step + 1;
}

}  // namespace

void ops::register_random_ops(std::vector<OpDef>& table) {
  // Inputs: the step (i64 scalar). Outputs: the values, and step + 1 for the caller to assign
  // back to its step variable. No gradient: the values do not depend on any float input.
  OpDef op{.id = OpId::random_uniform,
           .kind = OpKind::other,
           .arity = 1,
           .attrs = {"seed", "shape", "dtype"}};
  op.infer = infer_random;
  op.cpu = random_kernel;
  op.autocast = AutocastPolicy::keep;
  table.push_back(std::move(op));
}

RandomUniform random_uniform(Value step, const Shape& shape, std::uint64_t seed, DType dtype) {
  Attrs attrs = {{"seed", static_cast<std::int64_t>(seed)},
                 {"shape", shape.dims()},
                 {"dtype", std::string(dtype_name(dtype))}};
  const std::vector<Value> out = step.graph().apply(OpId::random_uniform, {step}, std::move(attrs));
  return {out[0], out[1]};
}

}  // namespace kiln
