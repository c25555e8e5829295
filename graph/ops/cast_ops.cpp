// cast: converts a floating tensor to another floating dtype (attribute "dtype"), rounding to
// nearest even where the target is narrower. Its gradient casts the incoming gradient back.
// An elementwise op: in a fused group it is a copy in the compute type, the conversion being
// the group's widening load and rounding store (fusion/fused_group.h). A cast between f64 and
// the others does not fuse and runs through its CPU kernel and CUDA entry.
#include "core/dispatch.h"
#include "graph/ops.h"
#include "graph/ops/register.h"

namespace kiln {
namespace {

template <class T>
void copy_loop(const T* const* in, const std::int64_t* in_step, T* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = in[0][i * in_step[0]];
}

template <class From, class To>
void convert(const Tensor& in, Tensor& out) {
  const From* src = in.data<From>();
  To* dst = out.data<To>();
  const std::int64_t n = in.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<To>(src[i]);
}

}  // namespace

void ops::register_cast_ops(std::vector<OpDef>& table) {
  OpDef op{.id = OpId::cast,
           .kind = OpKind::elementwise,
           .arity = 1,
           .attrs = {"dtype"},
           .loops = {copy_loop<float>, copy_loop<double>},
           .cuda = "{0}"};
  op.infer = [](std::span<const TensorType> in, const Attrs& attrs) {
    const DType to = dtype_from_name(attrs.text("dtype"));
    KILN_CHECK(is_floating(in[0].dtype) && is_floating(to),
               "cast: converts between floating dtypes, not {} to {}", dtype_name(in[0].dtype),
               dtype_name(to));
    return std::vector<TensorType>{{in[0].shape, to}};
  };
  op.cpu = [](const KernelCall& call) {
    visit_dtype(call.inputs[0].dtype(), [&](auto from) {
      visit_dtype(call.outputs[0].dtype(), [&](auto to) {
        convert<decltype(from), decltype(to)>(call.inputs[0], call.outputs[0]);
      });
    });
  };
  op.grad = [](const GradContext& c) {
    return std::vector<Value>{cast(c.output_grads[0], c.inputs[0].dtype())};
  };
  op.autocast = AutocastPolicy::keep;
  table.push_back(std::move(op));
}

Value cast(Value x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return x.graph().apply1(OpId::cast, {x}, {{"dtype", std::string(dtype_name(dtype))}});
}

}  // namespace kiln
