// Reductions over axes: sum and max (mean is a composite in graph/nn).
#include <algorithm>
#include <limits>

#include "core/dispatch.h"
#include "graph/ops.h"
#include "graph/ops/register.h"

namespace kiln {
namespace {

// The input shape with reduced axes set to 1 (the keepdims shape).
Shape kept_shape(const Shape& in, const std::vector<std::int64_t>& axes) {
  std::vector<std::int64_t> dims = in.dims();
  for (std::int64_t a : axes) dims[static_cast<std::size_t>(a)] = 1;
  return Shape(dims);
}

std::vector<TensorType> infer_reduce(const char* op, std::span<const TensorType> in,
                                     const Attrs& attrs) {
  ops::check_floating_inputs(op, in);
  const Shape kept = kept_shape(in[0].shape, attrs.integers("axes"));
  if (attrs.integer("keepdims")) return {{kept, in[0].dtype}};
  std::vector<std::int64_t> dims;
  const auto& axes = attrs.integers("axes");
  for (std::size_t d = 0; d < in[0].shape.rank(); ++d)
    if (std::find(axes.begin(), axes.end(), static_cast<std::int64_t>(d)) == axes.end())
      dims.push_back(in[0].shape[d]);
  return {{Shape(dims), in[0].dtype}};
}

// out[o] = combine over the reduced axes of x. Adjacent axes of the same kind are merged,
// threads share the outputs, and the innermost reduced axis runs as a plain strided loop.
template <class T, class Acc, class Combine>
void reduce_kernel(const Tensor& x, Tensor& out, const std::vector<std::int64_t>& axes, Acc init,
                   Combine combine) {
  const Shape& shape = x.shape();
  const std::vector<std::int64_t> strides = shape.strides();
  std::vector<std::int64_t> kept_dims, kept_strides, red_dims = {1}, red_strides = {0};
  int last_kind = -1;  // 0 kept, 1 reduced
  for (std::size_t d = 0; d < shape.rank(); ++d) {
    if (shape[d] == 1) continue;
    const int kind =
        std::find(axes.begin(), axes.end(), static_cast<std::int64_t>(d)) != axes.end() ? 1 : 0;
    auto& dims = kind ? red_dims : kept_dims;
    auto& strs = kind ? red_strides : kept_strides;
    if (kind == last_kind) {  // contiguous with the previous axis of the same kind: merge
      dims.back() *= shape[d];
      strs.back() = strides[d];
    } else {
      dims.push_back(shape[d]);
      strs.push_back(strides[d]);
    }
    last_kind = kind;
  }
  const T* in = x.data<T>();
  T* o = out.data<T>();
  const std::int64_t n_out = out.numel();
  const std::int64_t inner = red_dims.back();
  const std::int64_t inner_stride = red_strides.back();
  std::int64_t n_rows = 1;
  for (std::size_t d = 0; d + 1 < red_dims.size(); ++d) n_rows *= red_dims[d];
  const auto outer_rank = static_cast<std::int64_t>(red_dims.size()) - 1;
#pragma omp parallel for schedule(static) if (x.numel() > 65536 && n_out > 1)
  for (std::int64_t oi = 0; oi < n_out; ++oi) {
    std::int64_t base = 0;
    for (std::int64_t d = static_cast<std::int64_t>(kept_dims.size()) - 1, rest = oi; d >= 0; --d) {
      base += (rest % kept_dims[d]) * kept_strides[d];
      rest /= kept_dims[d];
    }
    Acc acc = init;
    for (std::int64_t row = 0; row < n_rows; ++row) {
      std::int64_t offset = base;
      for (std::int64_t d = outer_rank - 1, rest = row; d >= 0; --d) {
        offset += (rest % red_dims[d]) * red_strides[d];
        rest /= red_dims[d];
      }
      const T* p = in + offset;
      for (std::int64_t i = 0; i < inner; ++i) acc = combine(acc, p[i * inner_stride]);
    }
    o[oi] = static_cast<T>(acc);
  }
}

Attrs reduce_attrs(const Value& x, const std::vector<std::int64_t>& axes, bool keepdims,
                   const char* op) {
  std::vector<std::int64_t> normalized;
  for (std::int64_t a : axes) normalized.push_back(normalize_axis(a, x.shape().rank(), op));
  std::sort(normalized.begin(), normalized.end());
  KILN_CHECK(std::adjacent_find(normalized.begin(), normalized.end()) == normalized.end(),
             "{}: axis listed twice", op);
  return {{"axes", normalized}, {"keepdims", std::int64_t{keepdims}}};
}

Value keep_dims_view(const GradContext& c, Value v) {
  return reshape(v, kept_shape(c.inputs[0].shape(), c.node.attrs.integers("axes")).dims());
}

}  // namespace

void ops::register_reduce_ops(std::vector<OpDef>& table) {
  OpDef sum_op{
      .name = "reduce_sum", .kind = OpKind::reduction, .arity = 1, .attrs = {"axes", "keepdims"}};
  sum_op.infer = [](std::span<const TensorType> in, const Attrs& a) {
    return infer_reduce("reduce_sum", in, a);
  };
  sum_op.grad = [](const GradContext& c) {
    return std::vector<Value>{
        broadcast_to(keep_dims_view(c, c.output_grads[0]), c.inputs[0].shape())};
  };
  sum_op.cpu = [](const KernelCall& call) {
    visit_floating(call.inputs[0].dtype(), "reduce_sum", [&](auto zero) {
      using T = decltype(zero);
      reduce_kernel<T>(call.inputs[0], call.outputs[0], call.node.attrs.integers("axes"), 0.0,
                       [](double acc, T v) { return acc + static_cast<double>(v); });
    });
  };
  table.push_back(std::move(sum_op));

  OpDef max_op{
      .name = "reduce_max", .kind = OpKind::reduction, .arity = 1, .attrs = {"axes", "keepdims"}};
  max_op.infer = [](std::span<const TensorType> in, const Attrs& a) {
    return infer_reduce("reduce_max", in, a);
  };
  // The gradient goes to every position equal to the maximum.
  max_op.grad = [](const GradContext& c) {
    const Value mask = equal(c.inputs[0], keep_dims_view(c, c.outputs[0]));
    return std::vector<Value>{mask * keep_dims_view(c, c.output_grads[0])};
  };
  max_op.cpu = [](const KernelCall& call) {
    visit_floating(call.inputs[0].dtype(), "reduce_max", [&](auto zero) {
      using T = decltype(zero);
      reduce_kernel<T>(call.inputs[0], call.outputs[0], call.node.attrs.integers("axes"),
                       -std::numeric_limits<T>::infinity(),
                       [](T acc, T v) { return v > acc || v != v ? v : acc; });
    });
  };
  table.push_back(std::move(max_op));
}

Value sum(Value x, const std::vector<std::int64_t>& axes, bool keepdims) {
  return x.graph().apply1("reduce_sum", {x}, reduce_attrs(x, axes, keepdims, "sum"));
}

Value max(Value x, const std::vector<std::int64_t>& axes, bool keepdims) {
  return x.graph().apply1("reduce_max", {x}, reduce_attrs(x, axes, keepdims, "max"));
}

Value sum_all(Value x) {
  std::vector<std::int64_t> axes(x.shape().rank());
  for (std::size_t i = 0; i < axes.size(); ++i) axes[i] = static_cast<std::int64_t>(i);
  return sum(x, axes);
}

}  // namespace kiln
