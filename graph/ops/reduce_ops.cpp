// Reductions over axes: sum and max (mean is a composite in graph/nn); layer_norm over the
// last axis and its gradient, with their CPU reference kernels.
#include <algorithm>
#include <cmath>
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
  op.autocast = AutocastPolicy::fp32;
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

// ---- layer_norm: x [..., D] seen as [rows, D]; mean and rstd [..., 1] ----

std::vector<TensorType> infer_layer_norm(std::span<const TensorType> in, const Attrs& attrs) {
  ops::check_floating_inputs("layer_norm", in);
  const Shape& x = in[0].shape;
  KILN_CHECK(x.rank() >= 1 && x[x.rank() - 1] >= 1,
             "layer_norm: x is {} but needs a last axis of at least 1", in[0].str());
  KILN_CHECK(attrs.real("eps") >= 0, "layer_norm: eps is {} but must be >= 0", attrs.real("eps"));
  const Shape stats = kept_shape(x, {static_cast<std::int64_t>(x.rank()) - 1});
  return {in[0], {stats, in[0].dtype}, {stats, in[0].dtype}};
}

// in: dy, x [..., D], mean, rstd [..., 1] -> dx [..., D]
std::vector<TensorType> infer_layer_norm_grad(std::span<const TensorType> in, const Attrs&) {
  ops::check_floating_inputs("layer_norm_grad", in);
  KILN_CHECK(in[0].shape == in[1].shape, "layer_norm_grad: dy is {} but x is {}", in[0].str(),
             in[1].str());
  const Shape stats = kept_shape(in[1].shape, {static_cast<std::int64_t>(in[1].shape.rank()) - 1});
  KILN_CHECK(in[2].shape == stats && in[3].shape == stats,
             "layer_norm_grad: mean is {} and rstd {} but {} was expected", in[2].str(),
             in[3].str(), stats.str());
  return {in[1]};
}

// Row by row in order: mean, then the biased variance from the centred values, then y.
template <class T>
void layer_norm_rows(const T* x, T* y, T* mean, T* rstd, std::int64_t rows, std::int64_t d, T eps) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    T sum = T(0), squares = T(0);
    for (std::int64_t i = 0; i < d; ++i) sum += xr[i];
    const T m = sum / T(d);
    for (std::int64_t i = 0; i < d; ++i) squares += (xr[i] - m) * (xr[i] - m);
    const T s = T(1) / std::sqrt(squares / T(d) + eps);
    for (std::int64_t i = 0; i < d; ++i) y[r * d + i] = (xr[i] - m) * s;
    mean[r] = m;
    rstd[r] = s;
  }
}

// dx = rstd (dy - mean(dy) - xhat mean(dy xhat)), xhat = (x - mean) rstd, means over the row.
template <class T>
void layer_norm_grad_rows(const T* dy, const T* x, const T* mean, const T* rstd, T* dx,
                          std::int64_t rows, std::int64_t d) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T *g = dy + r * d, *xr = x + r * d;
    T sum_g = T(0), sum_gx = T(0);
    for (std::int64_t i = 0; i < d; ++i) {
      sum_g += g[i];
      sum_gx += g[i] * (xr[i] - mean[r]) * rstd[r];
    }
    const T a = sum_g / T(d), b = sum_gx / T(d);
    for (std::int64_t i = 0; i < d; ++i)
      dx[r * d + i] = rstd[r] * (g[i] - a - (xr[i] - mean[r]) * rstd[r] * b);
  }
}

void layer_norm_cpu(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  const std::int64_t d = x.shape()[x.shape().rank() - 1], rows = x.numel() / d;
  visit_floating(x.dtype(), "layer_norm", [&](auto zero) {
    using T = decltype(zero);
    layer_norm_rows<T>(x.data<T>(), call.outputs[0].data<T>(), call.outputs[1].data<T>(),
                       call.outputs[2].data<T>(), rows, d, T(call.node.attrs.real("eps")));
  });
}

void layer_norm_grad_cpu(const KernelCall& call) {
  const auto& in = call.inputs;
  const std::int64_t d = in[1].shape()[in[1].shape().rank() - 1], rows = in[1].numel() / d;
  visit_floating(in[1].dtype(), "layer_norm_grad", [&](auto zero) {
    using T = decltype(zero);
    layer_norm_grad_rows<T>(in[0].data<T>(), in[1].data<T>(), in[2].data<T>(), in[3].data<T>(),
                            call.outputs[0].data<T>(), rows, d);
  });
}

std::vector<Value> layer_norm_backward(const GradContext& c) {
  KILN_CHECK(!c.output_grads[1].valid() && !c.output_grads[2].valid(),
             "layer_norm: the saved statistics (outputs 1 and 2) have no gradient");
  return {layer_norm_grad(c.output_grads[0], c.inputs[0], c.outputs[1], c.outputs[2])};
}

void register_layer_norm_ops(std::vector<OpDef>& table) {
  OpDef forward{.id = OpId::layer_norm, .kind = OpKind::other, .arity = 1, .attrs = {"eps"}};
  forward.infer = infer_layer_norm;
  forward.grad = layer_norm_backward;
  forward.cpu = layer_norm_cpu;
  table.push_back(std::move(forward));
  OpDef backward{.id = OpId::layer_norm_grad, .kind = OpKind::other, .arity = 4};
  backward.infer = infer_layer_norm_grad;
  backward.cpu = layer_norm_grad_cpu;  // no gradient: layer_norm's gradient check covers it
  table.push_back(std::move(backward));
}

}  // namespace

void ops::register_reduce_ops(std::vector<OpDef>& table) {
  register_layer_norm_ops(table);
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

LayerNorm layer_norm_with_stats(Value x, double eps) {
  const std::vector<Value> out = x.graph().apply(OpId::layer_norm, {x}, {{"eps", eps}});
  return {out[0], out[1], out[2]};
}

Value layer_norm(Value x, double eps) { return layer_norm_with_stats(x, eps).y; }

Value layer_norm_grad(Value dy, Value x, Value mean, Value rstd) {
  return dy.graph().apply1(OpId::layer_norm_grad, {dy, x, mean, rstd});
}

}  // namespace kiln
