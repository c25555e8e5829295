// Max pooling and its backward pair. max_pool2d_grad routes dy to each window's first
// maximum; max_pool2d_select gathers from those positions; each is the other's adjoint.
#include "graph/kernels/conv_cpu.h"
#include "graph/ops.h"
#include "graph/ops/register.h"

namespace kiln {
namespace {

Shape pool_output_shape(const char* op, const Shape& x, std::int64_t kernel, std::int64_t stride) {
  KILN_CHECK(x.rank() == 4, "{}: input must be [B, C, H, W] but is {}", op, x.str());
  KILN_CHECK(kernel >= 1 && stride >= 1, "{}: kernel {} and stride {} must be positive", op, kernel, stride);
  KILN_CHECK(x[2] >= kernel && x[3] >= kernel, "{}: window {} is larger than the input {}", op, kernel, x.str());
  const kernels::PoolGeometry g = kernels::pool_geometry(x, kernel, stride);
  return Shape{x[0], x[1], g.out_h, g.out_w};
}

kernels::PoolGeometry geometry_of(const KernelCall& call) {
  return kernels::pool_geometry(call.inputs[0].shape(), call.node.attrs.integer("kernel"),
                                call.node.attrs.integer("stride"));
}

Attrs pool_attrs(std::int64_t kernel, std::int64_t stride) { return {{"kernel", kernel}, {"stride", stride}}; }

// Type rule of the two backward ops: (x, y-shaped) -> x-shaped, or (x, x-shaped) -> y-shaped.
InferFn backward_infer(const char* op, bool output_like_x) {
  return [op, output_like_x](std::span<const TensorType> in, const Attrs& attrs) {
    ops::check_floating_inputs(op, in);
    const Shape y = pool_output_shape(op, in[0].shape, attrs.integer("kernel"), attrs.integer("stride"));
    const Shape& expected = output_like_x ? y : in[0].shape;
    KILN_CHECK(in[1].shape == expected, "{}: second input is {} but {} was expected", op, in[1].str(), expected.str());
    return std::vector<TensorType>{{output_like_x ? in[0].shape : y, in[0].dtype}};
  };
}

}  // namespace

void ops::register_pool_ops(std::vector<OpDef>& table) {
  OpDef forward{.name = "max_pool2d", .kind = OpKind::pool, .arity = 1, .attrs = {"kernel", "stride"}};
  forward.infer = [](std::span<const TensorType> in, const Attrs& attrs) {
    ops::check_floating_inputs("max_pool2d", in);
    return std::vector<TensorType>{
        {pool_output_shape("max_pool2d", in[0].shape, attrs.integer("kernel"), attrs.integer("stride")), in[0].dtype}};
  };
  forward.grad = [](const GradContext& c) {
    const Attrs& a = c.node.attrs;
    return std::vector<Value>{max_pool2d_grad(c.inputs[0], c.output_grads[0], a.integer("kernel"), a.integer("stride"))};
  };
  forward.cpu = [](const KernelCall& call) { kernels::max_pool2d_forward(call.inputs[0], call.outputs[0], geometry_of(call)); };
  table.push_back(std::move(forward));

  // (x, dy) -> dx. Piecewise constant in x, linear in dy.
  OpDef backward{.name = "max_pool2d_grad", .kind = OpKind::pool, .arity = 2, .attrs = {"kernel", "stride"}};
  backward.infer = backward_infer("max_pool2d_grad", true);
  backward.grad = [](const GradContext& c) {
    const Attrs& a = c.node.attrs;
    return std::vector<Value>{Value(), max_pool2d_select(c.inputs[0], c.output_grads[0], a.integer("kernel"), a.integer("stride"))};
  };
  backward.cpu = [](const KernelCall& call) {
    kernels::max_pool2d_backward(call.inputs[0], call.inputs[1], call.outputs[0], geometry_of(call));
  };
  table.push_back(std::move(backward));

  // (x, g) -> g at each window's maximum of x. Piecewise constant in x, linear in g.
  OpDef select{.name = "max_pool2d_select", .kind = OpKind::pool, .arity = 2, .attrs = {"kernel", "stride"}};
  select.infer = backward_infer("max_pool2d_select", false);
  select.grad = [](const GradContext& c) {
    const Attrs& a = c.node.attrs;
    return std::vector<Value>{Value(), max_pool2d_grad(c.inputs[0], c.output_grads[0], a.integer("kernel"), a.integer("stride"))};
  };
  select.cpu = [](const KernelCall& call) {
    kernels::max_pool2d_select(call.inputs[0], call.inputs[1], call.outputs[0], geometry_of(call));
  };
  table.push_back(std::move(select));
}

Value max_pool2d(Value x, std::int64_t kernel, std::int64_t stride) {
  return x.graph().apply1("max_pool2d", {x}, pool_attrs(kernel, stride == 0 ? kernel : stride));
}

Value max_pool2d_grad(Value x, Value dy, std::int64_t kernel, std::int64_t stride) {
  return x.graph().apply1("max_pool2d_grad", {x, dy}, pool_attrs(kernel, stride));
}

Value max_pool2d_select(Value x, Value g, std::int64_t kernel, std::int64_t stride) {
  return x.graph().apply1("max_pool2d_select", {x, g}, pool_attrs(kernel, stride));
}

}  // namespace kiln
