// Reductions over axes: sum and max (mean is a composite in graph/nn).
#include <algorithm>
#include <limits>

#include "core/dispatch.h"
#include "graph/ops.h"
#include "graph/ops/register.h"
#include "graph/reduction_rule.h"

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
template <class T>
void reduce_kernel(const Tensor& x, Tensor& out, const std::vector<std::int64_t>& axes,
                   const ReductionRule& rule) {
  const auto fold = reduction_fold<T>(rule);
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
    double acc = rule.identity;
    for (std::int64_t row = 0; row < n_rows; ++row) {
      std::int64_t offset = base;
      for (std::int64_t d = outer_rank - 1, rest = row; d >= 0; --d) {
        offset += (rest % red_dims[d]) * red_strides[d];
        rest /= red_dims[d];
      }
      const T* p = in + offset;
      acc = fold(acc, p, inner, inner_stride);
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

// A reduction's entry: its type rule, its CPU kernel from its rule, and its gradient.
OpDef reduction_op(OpId id, ReductionRule rule, GradFn grad) {
  const char* name = op_id_name(id);
  OpDef op{.id = id, .kind = OpKind::reduction, .arity = 1, .attrs = {"axes", "keepdims"}};
  op.infer = [name](std::span<const TensorType> in, const Attrs& a) {
    return infer_reduce(name, in, a);
  };
  op.cpu = [name, rule](const KernelCall& call) {
    visit_floating(call.inputs[0].dtype(), name, [&](auto zero) {
      reduce_kernel<decltype(zero)>(call.inputs[0], call.outputs[0],
                                    call.node.attrs.integers("axes"), rule);
    });
  };
  op.grad = std::move(grad);
  op.reduction = std::move(rule);
  return op;
}

struct Add {
  double operator()(double acc, double v) const { return acc + v; }
};
struct Max {
  double operator()(double acc, double v) const { return v > acc ? v : acc; }
};

}  // namespace

void ops::register_reduce_ops(std::vector<OpDef>& table) {
  table.push_back(reduction_op(OpId::reduce_sum,
                               make_reduction_rule<NanRule::arithmetic, Add>(0.0, "({0} + {1})"),
                               [](const GradContext& c) {
                                 return std::vector<Value>{broadcast_to(
                                     keep_dims_view(c, c.output_grads[0]), c.inputs[0].shape())};
                               }));
  // The gradient goes to every position equal to the maximum.
  table.push_back(
      reduction_op(OpId::reduce_max,
                   make_reduction_rule<NanRule::propagate, Max>(
                       -std::numeric_limits<double>::infinity(), "(({1}) > ({0}) ? ({1}) : ({0}))"),
                   [](const GradContext& c) {
                     const Value mask = equal(c.inputs[0], keep_dims_view(c, c.outputs[0]));
                     return std::vector<Value>{mask * keep_dims_view(c, c.output_grads[0])};
                   }));
}

Value sum(Value x, const std::vector<std::int64_t>& axes, bool keepdims) {
  return x.graph().apply1(OpId::reduce_sum, {x}, reduce_attrs(x, axes, keepdims, "sum"));
}

Value max(Value x, const std::vector<std::int64_t>& axes, bool keepdims) {
  return x.graph().apply1(OpId::reduce_max, {x}, reduce_attrs(x, axes, keepdims, "max"));
}

Value sum_all(Value x) {
  std::vector<std::int64_t> axes(x.shape().rank());
  for (std::size_t i = 0; i < axes.size(); ++i) axes[i] = static_cast<std::int64_t>(i);
  return sum(x, axes);
}

}  // namespace kiln
