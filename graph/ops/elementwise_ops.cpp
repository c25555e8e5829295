// Elementwise ops: each entry's math is a functor (CPU loops), a CUDA expression and a
// gradient written with the builder API. Broadcast gradients are summed by autograd.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "graph/kernels/elementwise_cpu.h"
#include "graph/ops.h"
#include "graph/ops/register.h"

namespace kiln {
namespace {

// ---- CPU loops: in_step is 1 (contiguous) or 0 (broadcast) per input ----

// Transcendental ops (exp, log, tanh) evaluate through Eigen's SIMD functions in fixed
// blocks of 16 (an aligned, fixed-size array: all packets, no scalar head or tail), so an
// element gets the same bits wherever it sits in a run and whether it is broadcast or not:
// fused and unfused evaluation then agree exactly, ties in max included.
// GCC 12 flags Eigen's AVX-512 fixed-size code (_mm512_undefined_*) as uninitialised.
#pragma GCC diagnostic ignored "-Wuninitialized"
template <class F, class T>
void unary_blocks(const T* a, std::int64_t step, T* out, std::int64_t n) {
  constexpr std::int64_t kBlock = 16;
  Eigen::Array<T, kBlock, 1> in_block, out_block;
  for (std::int64_t i = 0; i < n; i += kBlock) {
    const std::int64_t len = std::min(kBlock, n - i);
    for (std::int64_t j = 0; j < kBlock; ++j) in_block[j] = a[(i + std::min(j, len - 1)) * step];
    out_block = F::array(in_block);
    std::copy_n(out_block.data(), len, out + i);
  }
}

template <class F, class T>
void unary_loop(const T* const* in, const std::int64_t* in_step, T* out, std::int64_t n) {
  const T* a = in[0];
  if constexpr (requires(const Eigen::Array<T, 16, 1>& x) { F::array(x); }) {
    if (in_step[0] == 0) {
      unary_blocks<F, T>(a, 0, out, 1);
      std::fill_n(out + 1, n - 1, out[0]);
      return;
    }
    unary_blocks<F, T>(a, 1, out, n);
    return;
  }
  if (in_step[0] == 0) {
    std::fill_n(out, n, F::apply(a[0]));
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) out[i] = F::apply(a[i]);
}

template <class F, class T>
void binary_loop(const T* const* in, const std::int64_t* in_step, T* out, std::int64_t n) {
  const T* a = in[0];
  const T* b = in[1];
  if (in_step[0] == 1 && in_step[1] == 1) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = F::apply(a[i], b[i]);
  } else if (in_step[0] == 1) {
    const T bv = b[0];
    for (std::int64_t i = 0; i < n; ++i) out[i] = F::apply(a[i], bv);
  } else if (in_step[1] == 1) {
    const T av = a[0];
    for (std::int64_t i = 0; i < n; ++i) out[i] = F::apply(av, b[i]);
  } else {
    std::fill_n(out, n, F::apply(a[0], b[0]));
  }
}

// select(c, a, b): a where c is not 0, else b; the unchosen value is never read into the
// result, so an Inf or NaN there does not leak (the loss scaler's skipped update).
template <class T>
void select_loop(const T* const* in, const std::int64_t* in_step, T* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    out[i] = in[0][i * in_step[0]] != T(0) ? in[1][i * in_step[1]] : in[2][i * in_step[2]];
}

std::vector<TensorType> infer_same(const char* op, std::span<const TensorType> in) {
  ops::check_floating_inputs(op, in);
  Shape shape = in[0].shape;
  for (std::size_t i = 1; i < in.size(); ++i) shape = broadcast_shapes(shape, in[i].shape, op);
  return {{shape, in[0].dtype}};
}

template <class F>
OpDef elementwise(OpId id, int arity, std::string cuda, GradFn grad) {
  const char* name = op_id_name(id);
  OpDef op{.id = id, .kind = OpKind::elementwise, .arity = arity};
  if constexpr (requires { F::apply(1.0f); }) {
    KILN_ASSERT(arity == 1, "{}: a unary functor for arity {}", name, arity);
    op.loops = {unary_loop<F, float>, unary_loop<F, double>};
  } else {
    KILN_ASSERT(arity == 2, "{}: a binary functor for arity {}", name, arity);
    op.loops = {binary_loop<F, float>, binary_loop<F, double>};
  }
  op.infer = [name](std::span<const TensorType> in, const Attrs&) { return infer_same(name, in); };
  op.cpu = [loops = op.loops](const KernelCall& call) {
    kernels::run_elementwise(loops, call.inputs, call.outputs[0]);
  };
  op.cuda = std::move(cuda);
  op.grad = std::move(grad);
  return op;
}

// ---- the math of each op ----
struct Add {
  template <class T>
  static T apply(T a, T b) {
    return a + b;
  }
};
struct Sub {
  template <class T>
  static T apply(T a, T b) {
    return a - b;
  }
};
struct Mul {
  template <class T>
  static T apply(T a, T b) {
    return a * b;
  }
};
struct Div {
  template <class T>
  static T apply(T a, T b) {
    return a / b;
  }
};
struct Maximum {
  template <class T>
  static T apply(T a, T b) {
    return a > b ? a : b;
  }
};
struct Greater {
  template <class T>
  static T apply(T a, T b) {
    return a > b ? T(1) : T(0);
  }
};
struct Equal {
  template <class T>
  static T apply(T a, T b) {
    return a == b ? T(1) : T(0);
  }
};
struct Neg {
  template <class T>
  static T apply(T a) {
    return -a;
  }
};
struct Exp {
  template <class T>
  static T apply(T a) {
    return std::exp(a);
  }
  template <class A>
  static auto array(const A& a) {
    return a.exp();
  }
};
struct Log {
  template <class T>
  static T apply(T a) {
    return std::log(a);
  }
  template <class A>
  static auto array(const A& a) {
    return a.log();
  }
};
struct Sqrt {  // std::sqrt, correctly rounded: Eigen's SIMD sqrt may differ by an ulp
  template <class T>
  static T apply(T a) {
    return std::sqrt(a);
  }
};
struct Relu {
  template <class T>
  static T apply(T a) {
    return a > T(0) ? a : T(0);
  }
};
struct Tanh {
  template <class T>
  static T apply(T a) {
    return std::tanh(a);
  }
  template <class A>
  static auto array(const A& a) {
    return a.tanh();
  }
};
// GELU with tanh: the same formula, operation for operation, as the CUDA expression below.
constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;
struct Gelu {
  template <class T>
  static T apply(T a) {
    return a * T(0.5) * (T(1) + std::tanh(T(kGeluScale) * (a + T(kGeluCubic) * a * a * a)));
  }
};
struct Identity {
  template <class T>
  static T apply(T a) {
    return a;
  }
};

using Grads = std::vector<Value>;
const Value& dy(const GradContext& c) { return c.output_grads[0]; }
const Value& in(const GradContext& c, std::size_t i) { return c.inputs[i]; }
const Value& out(const GradContext& c) { return c.outputs[0]; }

}  // namespace

void ops::register_elementwise_ops(std::vector<OpDef>& table) {
  table.push_back(elementwise<Add>(OpId::add, 2, "({0} + {1})", [](const GradContext& c) {
    return Grads{dy(c), dy(c)};
  }));
  table.push_back(elementwise<Sub>(OpId::sub, 2, "({0} - {1})", [](const GradContext& c) {
    return Grads{dy(c), -dy(c)};
  }));
  table.push_back(elementwise<Mul>(OpId::mul, 2, "({0} * {1})", [](const GradContext& c) {
    return Grads{dy(c) * in(c, 1), dy(c) * in(c, 0)};
  }));
  table.push_back(elementwise<Div>(OpId::div, 2, "({0} / {1})", [](const GradContext& c) {
    return Grads{dy(c) / in(c, 1), -(dy(c) * out(c)) / in(c, 1)};
  }));
  OpDef maximum_op =
      elementwise<Maximum>(OpId::maximum, 2, "({0} > {1} ? {0} : {1})", [](const GradContext& c) {
        const Value a_wins = greater(in(c, 0), in(c, 1));
        return Grads{dy(c) * a_wins, dy(c) * (1.0 - a_wins)};
      });
  maximum_op.exact = true;
  table.push_back(std::move(maximum_op));
  OpDef select_op{.id = OpId::select,
                  .kind = OpKind::elementwise,
                  .arity = 3,
                  .loops = {select_loop<float>, select_loop<double>},
                  .cuda = "({0} != T(0) ? {1} : {2})",
                  .exact = true};
  select_op.infer = [](std::span<const TensorType> in, const Attrs&) {
    return infer_same("select", in);
  };
  select_op.cpu = [loops = select_op.loops](const KernelCall& call) {
    kernels::run_elementwise(loops, call.inputs, call.outputs[0]);
  };
  select_op.grad = [](const GradContext& c) {
    const Value zero = scalar_like(dy(c), 0.0);
    return Grads{Value(), select(in(c, 0), dy(c), zero), select(in(c, 0), zero, dy(c))};
  };
  table.push_back(std::move(select_op));
  for (OpDef comparison :
       {elementwise<Greater>(OpId::greater, 2, "({0} > {1} ? T(1) : T(0))", nullptr),
        elementwise<Equal>(OpId::equal, 2, "({0} == {1} ? T(1) : T(0))", nullptr)}) {
    comparison.autocast = AutocastPolicy::exact;
    comparison.exact = true;
    table.push_back(std::move(comparison));
  }
  OpDef neg_op =
      elementwise<Neg>(OpId::neg, 1, "(-{0})", [](const GradContext& c) { return Grads{-dy(c)}; });
  neg_op.exact = true;
  table.push_back(std::move(neg_op));
  OpDef exp_op = elementwise<Exp>(OpId::exp, 1, "exp({0})",
                                  [](const GradContext& c) { return Grads{dy(c) * out(c)}; });
  exp_op.cuda_bf16 = "__expf({0})";
  table.push_back(std::move(exp_op));
  table.push_back(elementwise<Log>(OpId::log, 1, "log({0})",
                                   [](const GradContext& c) { return Grads{dy(c) / in(c, 0)}; }));
  table.push_back(elementwise<Sqrt>(OpId::sqrt, 1, "sqrt({0})", [](const GradContext& c) {
    return Grads{dy(c) * 0.5 / out(c)};
  }));
  // relu's mask from its output (x > 0 exactly where relu(x) > 0): the output is stored anyway
  // when a non-elementwise op reads it (pooling, a GEMM), so the fuse pass computes the mask
  // in the backward's kernel instead of storing it in the forward's.
  OpDef relu_op =
      elementwise<Relu>(OpId::relu, 1, "({0} > T(0) ? {0} : T(0))", [](const GradContext& c) {
        return Grads{dy(c) * greater(out(c), scalar_like(out(c), 0.0))};
      });
  relu_op.exact = true;
  table.push_back(std::move(relu_op));
  OpDef tanh_op = elementwise<Tanh>(OpId::tanh, 1, "tanh({0})", [](const GradContext& c) {
    return Grads{dy(c) * (1.0 - out(c) * out(c))};
  });
  tanh_op.cuda_bf16 = "kiln_tanh_approx({0})";
  table.push_back(std::move(tanh_op));

  // gelu' = (1 + t) / 2 + x/2 (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh(u).
  table.push_back(elementwise<Gelu>(
      OpId::gelu, 1,
      "({0} * T(0.5) * (T(1) + tanh(T(0.7978845608028654) * ({0} + T(0.044715) * {0} * {0} * "
      "{0}))))",
      [](const GradContext& c) {
        const Value x = in(c, 0);
        const Value t = tanh((x + x * x * x * kGeluCubic) * kGeluScale);
        const Value slope = (x * x * (3 * kGeluCubic) + 1.0) * kGeluScale;
        return Grads{dy(c) * ((t + 1.0) * 0.5 + x * 0.5 * (1.0 - t * t) * slope)};
      }));

  // broadcast_to: the input read at broadcast strides; autograd sums the gradient back.
  OpDef broadcast = elementwise<Identity>(OpId::broadcast_to, 1, "{0}",
                                          [](const GradContext& c) { return Grads{dy(c)}; });
  broadcast.attrs = {"shape"};
  broadcast.exact = true;
  broadcast.infer = [](std::span<const TensorType> in, const Attrs& attrs) {
    ops::check_floating_inputs("broadcast_to", in);
    const Shape target(attrs.integers("shape"));
    KILN_CHECK(broadcast_shapes(in[0].shape, target, "broadcast_to") == target,
               "broadcast_to: {} does not broadcast to {}", in[0].shape.str(), target.str());
    return std::vector<TensorType>{{target, in[0].dtype}};
  };
  table.push_back(std::move(broadcast));

  // detach: the same storage; no gradient flows back through it.
  OpDef detach_op{
      .id = OpId::detach, .kind = OpKind::elementwise, .arity = 1, .cuda = "{0}", .alias = true};
  detach_op.infer = [](std::span<const TensorType> in, const Attrs&) {
    return std::vector<TensorType>{in[0]};
  };
  table.push_back(std::move(detach_op));
}

Value add(Value a, Value b) { return a.graph().apply1(OpId::add, {a, b}); }
Value sub(Value a, Value b) { return a.graph().apply1(OpId::sub, {a, b}); }
Value mul(Value a, Value b) { return a.graph().apply1(OpId::mul, {a, b}); }
Value div(Value a, Value b) { return a.graph().apply1(OpId::div, {a, b}); }
Value maximum(Value a, Value b) { return a.graph().apply1(OpId::maximum, {a, b}); }
Value greater(Value a, Value b) { return a.graph().apply1(OpId::greater, {a, b}); }
Value equal(Value a, Value b) { return a.graph().apply1(OpId::equal, {a, b}); }
Value select(Value condition, Value a, Value b) {
  return a.graph().apply1(OpId::select, {condition, a, b});
}
Value neg(Value x) { return x.graph().apply1(OpId::neg, {x}); }
Value exp(Value x) { return x.graph().apply1(OpId::exp, {x}); }
Value log(Value x) { return x.graph().apply1(OpId::log, {x}); }
Value sqrt(Value x) { return x.graph().apply1(OpId::sqrt, {x}); }
Value relu(Value x) { return x.graph().apply1(OpId::relu, {x}); }
Value tanh(Value x) { return x.graph().apply1(OpId::tanh, {x}); }
Value gelu(Value x) { return x.graph().apply1(OpId::gelu, {x}); }
Value detach(Value x) { return x.graph().apply1(OpId::detach, {x}); }
Value broadcast_to(Value x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return x.graph().apply1(OpId::broadcast_to, {x}, {{"shape", shape.dims()}});
}

Value scalar_like(Value like, double value) { return like.graph().fill(value, {}, like.dtype()); }
Value operator+(Value a, Value b) { return add(a, b); }
Value operator-(Value a, Value b) { return sub(a, b); }
Value operator*(Value a, Value b) { return mul(a, b); }
Value operator/(Value a, Value b) { return div(a, b); }
Value operator-(Value x) { return neg(x); }
Value operator+(Value a, double b) { return add(a, scalar_like(a, b)); }
Value operator+(double a, Value b) { return add(scalar_like(b, a), b); }
Value operator-(Value a, double b) { return sub(a, scalar_like(a, b)); }
Value operator-(double a, Value b) { return sub(scalar_like(b, a), b); }
Value operator*(Value a, double b) { return mul(a, scalar_like(a, b)); }
Value operator*(double a, Value b) { return mul(scalar_like(b, a), b); }
Value operator/(Value a, double b) { return div(a, scalar_like(a, b)); }
Value operator/(double a, Value b) { return div(scalar_like(b, a), b); }

}  // namespace kiln
