// Pooling: max_pool2d with its backward pair (max_pool2d_grad routes dy to each window's
// first maximum, max_pool2d_select gathers from those positions; each is the other's
// adjoint) and avg_pool2d with avg_pool2d_grad (linear, each the other's adjoint).
// Padded cells never win a max and are not counted in an average: Note [padded pooling]
// in graph/kernels/pool_cpu.cpp.
#include "graph/kernels/pool_blocked.h"
#include "graph/kernels/pool_cpu.h"
#include "graph/ops.h"
#include "graph/ops/register.h"

namespace kiln {
namespace {

struct PoolAttrs {
  std::int64_t kernel, stride, padding;
};
PoolAttrs pool_attrs(const Attrs& a) {
  return {a.integer("kernel"), a.integer("stride"), a.integer("padding")};
}
Attrs make_pool_attrs(PoolAttrs p) {
  return {{"kernel", p.kernel}, {"stride", p.stride}, {"padding", p.padding}};
}

Shape pool_output_shape(const char* op, const Shape& x, PoolAttrs p) {
  KILN_CHECK(x.rank() == 4, "{}: input must be [B, C, H, W] but is {}", op, x.str());
  KILN_CHECK(p.kernel >= 1 && p.stride >= 1, "{}: kernel {} and stride {} must be positive", op,
             p.kernel, p.stride);
  KILN_CHECK(
      p.padding >= 0 && 2 * p.padding <= p.kernel,
      "{}: padding {} must be between 0 and half the kernel {} (every window needs a real cell)",
      op, p.padding, p.kernel);
  KILN_CHECK(x[2] + 2 * p.padding >= p.kernel && x[3] + 2 * p.padding >= p.kernel,
             "{}: window {} is larger than the input {} padded by {}", op, p.kernel, x.str(),
             p.padding);
  const kernels::PoolGeometry g = kernels::pool_geometry(x, p.kernel, p.stride, p.padding);
  return Shape{x[0], x[1], g.out_h, g.out_w};
}

// The geometry of a kernel call whose pooled (un-pooled) tensor has shape x.
kernels::PoolGeometry geometry_of(const KernelCall& call, const Shape& x) {
  const PoolAttrs p = pool_attrs(call.node.attrs);
  return kernels::pool_geometry(x, p.kernel, p.stride, p.padding);
}

// What a max pooling pass can take in oneDNN's blocked layout (OpDef::cpu_blocked): every
// input and its output, where they are f32 with channels in blocks of 16.
std::uint32_t max_pool_blocked(const Node& /*n*/, std::span<const TensorType> in) {
  const TensorType& x = in[0];
  if (x.dtype != DType::f32 || x.shape.rank() != 4 || x.shape[1] % 16 != 0) return 0;
  return ((1u << in.size()) - 1) | 1u << kBlockedOutputs;
}

// The CPU kernel of a max backward op (x, second input) -> output: the NCHW kernel, or the
// blocked one where the pass has blocked values.
CpuKernel max_pair_kernel(void (*nchw)(const Tensor&, const Tensor&, Tensor&,
                                       const kernels::PoolGeometry&),
                          void (*blocked)(const Tensor&, const Tensor&, Tensor&,
                                          const kernels::PoolGeometry&, std::uint32_t)) {
  return [nchw, blocked](const KernelCall& call) {
    const kernels::PoolGeometry g = geometry_of(call, call.inputs[0].shape());
    if (call.blocked != 0)
      blocked(call.inputs[0], call.inputs[1], call.outputs[0], g, call.blocked);
    else
      nchw(call.inputs[0], call.inputs[1], call.outputs[0], g);
  };
}

// Type rule of the two max backward ops: (x, y-shaped) -> x-shaped, or (x, x-shaped) -> y-shaped.
InferFn max_backward_infer(const char* op, bool output_like_x) {
  return [op, output_like_x](std::span<const TensorType> in, const Attrs& attrs) {
    ops::check_floating_inputs(op, in);
    const Shape y = pool_output_shape(op, in[0].shape, pool_attrs(attrs));
    const Shape& expected = output_like_x ? y : in[0].shape;
    KILN_CHECK(in[1].shape == expected, "{}: second input is {} but {} was expected", op,
               in[1].str(), expected.str());
    return std::vector<TensorType>{{output_like_x ? in[0].shape : y, in[0].dtype}};
  };
}

OpDef max_forward_op() {
  OpDef op{.id = OpId::max_pool2d,
           .kind = OpKind::pool,
           .arity = 1,
           .attrs = {"kernel", "stride", "padding"}};
  op.infer = [](std::span<const TensorType> in, const Attrs& attrs) {
    ops::check_floating_inputs("max_pool2d", in);
    return std::vector<TensorType>{
        {pool_output_shape("max_pool2d", in[0].shape, pool_attrs(attrs)), in[0].dtype}};
  };
  op.grad = [](const GradContext& c) {
    const PoolAttrs p = pool_attrs(c.node.attrs);
    return std::vector<Value>{
        max_pool2d_grad(c.inputs[0], c.output_grads[0], p.kernel, p.stride, p.padding)};
  };
  op.cpu = [](const KernelCall& call) {
    const kernels::PoolGeometry g = geometry_of(call, call.inputs[0].shape());
    if (call.blocked != 0)
      kernels::max_pool2d_forward_blocked(call.inputs[0], call.outputs[0], g, call.blocked);
    else
      kernels::max_pool2d_forward(call.inputs[0], call.outputs[0], g);
  };
  op.cpu_blocked = max_pool_blocked;
  return op;
}

// (x, dy) -> dx. Piecewise constant in x, linear in dy. With relu=1 (set by the pass of
// graph/passes/pool_grad_masks.h), dy is first multiplied by max_pool2d(x) > 0: the gradient of
// max pooling behind a ReLU, routed without a pass of its own over the masked dy.
OpDef max_grad_op() {
  OpDef op{.id = OpId::max_pool2d_grad,
           .kind = OpKind::pool,
           .arity = 2,
           .attrs = {"kernel", "stride", "padding"}};
  const InferFn infer = max_backward_infer("max_pool2d_grad", true);
  op.infer = [infer](std::span<const TensorType> in, const Attrs& attrs) {
    KILN_CHECK(!attrs.has("relu") || attrs.integer("relu") == 0 || attrs.integer("relu") == 1,
               "max_pool2d_grad: relu must be 0 or 1 but is {}", attrs.integer("relu"));
    return infer(in, attrs);
  };
  op.grad = [](const GradContext& c) {
    const PoolAttrs p = pool_attrs(c.node.attrs);
    Value selected =
        max_pool2d_select(c.inputs[0], c.output_grads[0], p.kernel, p.stride, p.padding);
    if (max_pool_grad_relu(c.node.attrs)) {
      const Value pooled = max_pool2d(c.inputs[0], p.kernel, p.stride, p.padding);
      selected = selected * greater(pooled, pooled.graph().fill(0.0, {}, pooled.type().dtype));
    }
    return std::vector<Value>{Value(), selected};
  };
  op.cpu = [](const KernelCall& call) {
    const kernels::PoolGeometry g = geometry_of(call, call.inputs[0].shape());
    const bool relu = max_pool_grad_relu(call.node.attrs);
    if (call.blocked != 0)
      kernels::max_pool2d_backward_blocked(call.inputs[0], call.inputs[1], call.outputs[0], g,
                                           call.blocked, relu);
    else
      kernels::max_pool2d_backward(call.inputs[0], call.inputs[1], call.outputs[0], g, relu);
  };
  op.cpu_blocked = max_pool_blocked;
  return op;
}

// (x, g) -> g at each window's maximum of x. Piecewise constant in x, linear in g.
OpDef max_select_op() {
  OpDef op{.id = OpId::max_pool2d_select,
           .kind = OpKind::pool,
           .arity = 2,
           .attrs = {"kernel", "stride", "padding"}};
  op.infer = max_backward_infer("max_pool2d_select", false);
  op.grad = [](const GradContext& c) {
    const PoolAttrs p = pool_attrs(c.node.attrs);
    return std::vector<Value>{
        Value(), max_pool2d_grad(c.inputs[0], c.output_grads[0], p.kernel, p.stride, p.padding)};
  };
  op.cpu = max_pair_kernel(kernels::max_pool2d_select, kernels::max_pool2d_select_blocked);
  op.cpu_blocked = max_pool_blocked;
  return op;
}

OpDef avg_forward_op() {
  OpDef op{.id = OpId::avg_pool2d,
           .kind = OpKind::pool,
           .arity = 1,
           .attrs = {"kernel", "stride", "padding"}};
  op.infer = [](std::span<const TensorType> in, const Attrs& attrs) {
    ops::check_floating_inputs("avg_pool2d", in);
    return std::vector<TensorType>{
        {pool_output_shape("avg_pool2d", in[0].shape, pool_attrs(attrs)), in[0].dtype}};
  };
  op.grad = [](const GradContext& c) {
    const PoolAttrs p = pool_attrs(c.node.attrs);
    return std::vector<Value>{
        avg_pool2d_grad(c.output_grads[0], c.inputs[0].shape(), p.kernel, p.stride, p.padding)};
  };
  op.cpu = [](const KernelCall& call) {
    kernels::avg_pool2d_forward(call.inputs[0], call.outputs[0],
                                geometry_of(call, call.inputs[0].shape()));
  };
  return op;
}

// dy -> dx of the x shape in attribute "shape"; <G, dx> = <avg_pool2d(G), dy>.
OpDef avg_grad_op() {
  OpDef op{.id = OpId::avg_pool2d_grad,
           .kind = OpKind::pool,
           .arity = 1,
           .attrs = {"kernel", "stride", "padding", "shape"}};
  op.infer = [](std::span<const TensorType> in, const Attrs& attrs) {
    ops::check_floating_inputs("avg_pool2d_grad", in);
    const Shape x(attrs.integers("shape"));
    const Shape y = pool_output_shape("avg_pool2d_grad", x, pool_attrs(attrs));
    KILN_CHECK(in[0].shape == y, "avg_pool2d_grad: dy is {} but the pooling output is {}",
               in[0].str(), y.str());
    return std::vector<TensorType>{{x, in[0].dtype}};
  };
  op.grad = [](const GradContext& c) {
    const PoolAttrs p = pool_attrs(c.node.attrs);
    return std::vector<Value>{avg_pool2d(c.output_grads[0], p.kernel, p.stride, p.padding)};
  };
  op.cpu = [](const KernelCall& call) {
    kernels::avg_pool2d_backward(call.inputs[0], call.outputs[0],
                                 geometry_of(call, call.outputs[0].shape()));
  };
  return op;
}

}  // namespace

void ops::register_pool_ops(std::vector<OpDef>& table) {
  table.push_back(max_forward_op());
  table.push_back(max_grad_op());
  table.push_back(max_select_op());
  table.push_back(avg_forward_op());
  table.push_back(avg_grad_op());
}

Value max_pool2d(Value x, std::int64_t kernel, std::int64_t stride, std::int64_t padding) {
  return x.graph().apply1(OpId::max_pool2d, {x},
                          make_pool_attrs({kernel, stride == 0 ? kernel : stride, padding}));
}

Value max_pool2d_grad(Value x, Value dy, std::int64_t kernel, std::int64_t stride,
                      std::int64_t padding, bool relu) {
  Attrs attrs = make_pool_attrs({kernel, stride, padding});
  if (relu) attrs.set("relu", std::int64_t{1});
  return x.graph().apply1(OpId::max_pool2d_grad, {x, dy}, std::move(attrs));
}

bool max_pool_grad_relu(const Attrs& attrs) {
  return attrs.has("relu") && attrs.integer("relu") != 0;
}

Value max_pool2d_select(Value x, Value g, std::int64_t kernel, std::int64_t stride,
                        std::int64_t padding) {
  return x.graph().apply1(OpId::max_pool2d_select, {x, g},
                          make_pool_attrs({kernel, stride, padding}));
}

Value avg_pool2d(Value x, std::int64_t kernel, std::int64_t stride, std::int64_t padding) {
  return x.graph().apply1(OpId::avg_pool2d, {x},
                          make_pool_attrs({kernel, stride == 0 ? kernel : stride, padding}));
}

Value avg_pool2d_grad(Value dy, const Shape& input_shape, std::int64_t kernel, std::int64_t stride,
                      std::int64_t padding) {
  Attrs attrs = make_pool_attrs({kernel, stride, padding});
  attrs.set("shape", input_shape.dims());
  return dy.graph().apply1(OpId::avg_pool2d_grad, {dy}, std::move(attrs));
}

}  // namespace kiln
