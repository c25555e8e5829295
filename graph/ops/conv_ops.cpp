// conv2d and its two backward ops. All three are bilinear, so each one's gradient is
// one of the other two (or conv2d itself); the whole family is closed under autograd.
// Either activation of a pass may be stored channels-last (graph/ops.h): the image side
// (attribute "channels_last" = 1, graph/passes/channels_last.h puts it there) and the output
// side ("y_channels_last" = 1, graph/passes/channels_last_values.h); shapes are checked and
// kernels chosen on both as [B, C, H, W]. The CPU's kernels read such an input through a
// transposed copy and write such an output through one, so the marks never change a result.
// conv2d's and conv2d_grad_input's filter may be laid out as the GPU's passes read it
// (conv_filter_layout, conv_filter_ops.cpp): the CPU reads it through a copy put back.
#include <algorithm>

#include "graph/kernels/conv_cpu.h"
#include "graph/kernels/conv_epilogue.h"
#include "graph/kernels/transpose_cpu.h"
#include "graph/ops.h"
#include "graph/ops/conv_filter.h"
#include "graph/ops/register.h"

namespace kiln {
namespace {

using kernels::ConvEpilogue;

struct ConvAttrs {
  std::int64_t stride, padding;
};
ConvAttrs conv_attrs(const Attrs& a) { return {a.integer("stride"), a.integer("padding")}; }

// An activation's [B, C, H, W] shape from its stored one (`last`: stored [B, H, W, C]).
Shape logical_shape(const char* op, const Shape& stored, bool last) {
  if (!last) return stored;
  KILN_CHECK(stored.rank() == 4, "{}: a channels-last activation must be [B, H, W, C] but is {}",
             op, stored.str());
  return Shape{stored[0], stored[3], stored[1], stored[2]};
}
// The stored shape of a [B, C, H, W] activation.
Shape stored_shape(const Shape& logical, bool last) {
  return last ? Shape{logical[0], logical[2], logical[3], logical[1]} : logical;
}
Shape image_shape(const char* op, const Shape& stored, const Attrs& a) {
  return logical_shape(op, stored, conv_image_channels_last(a));
}

// An activation as [B, C, H, W] for the CPU kernels: itself, or a transposed copy.
Tensor channels_first(const Tensor& x, bool last) {
  if (!last) return x;
  Tensor nchw = Tensor::empty(logical_shape("conv2d", x.shape(), true), x.dtype());
  kernels::transpose(x, kChannelsFirst, nchw);
  return nchw;
}
Tensor channels_first(const Tensor& x, const Attrs& a) {
  return channels_first(x, conv_image_channels_last(a));
}

// Runs `compute` on `out` as [B, C, H, W]: on out itself, or (out stored channels-last) on a
// temporary then transposed into out.
template <class Compute>
void into_channels_first(Tensor& out, bool last, Compute&& compute) {
  if (!last) return compute(out);
  Tensor nchw = Tensor::empty(logical_shape("conv2d", out.shape(), true), out.dtype());
  compute(nchw);
  kernels::transpose(nchw, kChannelsLast, out);
}

// Each pass's geometry from its call, the image in [B, C, H, W] terms: for its kernel and for
// the name of that kernel (OpDef::cpu_kernel_name).
kernels::ConvGeometry forward_geometry(const KernelCall& call) {
  const ConvAttrs a = conv_attrs(call.node.attrs);
  return kernels::conv_geometry(image_shape("conv2d", call.inputs[0].shape(), call.node.attrs),
                                conv_filter_shape(call.node.attrs, call.inputs[1].shape()),
                                a.stride, a.padding);
}
kernels::ConvGeometry grad_input_geometry(const KernelCall& call) {
  const ConvAttrs a = conv_attrs(call.node.attrs);
  return kernels::conv_geometry(
      image_shape("conv2d_grad_input", call.outputs[0].shape(), call.node.attrs),
      conv_filter_shape(call.node.attrs, call.inputs[1].shape()), a.stride, a.padding);
}
kernels::ConvGeometry grad_weight_geometry(const KernelCall& call) {
  const ConvAttrs a = conv_attrs(call.node.attrs);
  return kernels::conv_geometry(
      image_shape("conv2d_grad_weight", call.inputs[0].shape(), call.node.attrs),
      call.outputs[0].shape(), a.stride, a.padding);
}

// The activations a pass can take in oneDNN's blocked layout (OpDef::cpu_blocked), from the
// node's types: none where an activation is stored channels-last (the CPU reads a copy).
std::uint32_t blocked_of(kernels::ConvPass pass, const Node& n, std::span<const TensorType> in) {
  if (conv_image_channels_last(n.attrs) || conv_y_channels_last(n.attrs)) return 0;
  const ConvAttrs a = conv_attrs(n.attrs);
  const Shape& image = pass == kernels::ConvPass::grad_input ? n.outputs[0].shape : in[0].shape;
  const Shape w = pass == kernels::ConvPass::grad_weight ? n.outputs[0].shape
                                                         : conv_filter_shape(n.attrs, in[1].shape);
  return kernels::conv2d_blocked(pass, in[0].dtype,
                                 kernels::conv_geometry(image, w, a.stride, a.padding));
}

// Checks x: [B, Cin, H, W] against w: [Cout, Cin, KH, KW] and returns y's shape.
Shape conv_output_shape(const char* op, const Shape& x, const Shape& w, ConvAttrs a) {
  KILN_CHECK(x.rank() == 4, "{}: input must be [B, C, H, W] but is {}", op, x.str());
  KILN_CHECK(w.rank() == 4, "{}: weight must be [Cout, Cin, KH, KW] but is {}", op, w.str());
  KILN_CHECK(x[1] == w[1], "{}: input has {} channels but weight {} expects {}", op, x[1], w.str(),
             w[1]);
  KILN_CHECK(a.stride >= 1 && a.padding >= 0,
             "{}: stride {} and padding {} (stride >= 1, padding >= 0)", op, a.stride, a.padding);
  const kernels::ConvGeometry g = kernels::conv_geometry(x, w, a.stride, a.padding);
  KILN_CHECK(x[2] + 2 * a.padding >= w[2] && x[3] + 2 * a.padding >= w[3],
             "{}: kernel {}x{} is larger than the padded input {}x{}", op, w[2], w[3],
             x[2] + 2 * a.padding, x[3] + 2 * a.padding);
  return Shape{x[0], w[0], g.out_h, g.out_w};
}

// 2 x (output values) x (channels x taps) of the filter w: every pass of one convolution alike
// (the input gradient's and the weight gradient's multiplies are the forward's, reordered).
double conv_flops(const Shape& y, const Shape& w) {
  return 2.0 * static_cast<double>(y.numel()) *
         static_cast<double>(w.numel() / std::max<std::int64_t>(w[0], 1));
}

// A node's gradient is taken on its [Cout, Cin, KH, KW] filter: the layout pass runs after
// autograd.
void check_plain_filter(const Node& n) {
  KILN_CHECK(conv_filter_layout_of(n.attrs) == FilterLayout::nchw,
             "{}: no gradient through a laid-out filter (lay_out_filters runs after autograd)",
             n.op->name);
}

Attrs make_conv_attrs(std::int64_t stride, std::int64_t padding) {
  return {{"stride", stride}, {"padding", padding}};
}

OpDef conv_forward_op() {
  OpDef op{.id = OpId::conv2d, .kind = OpKind::conv, .arity = 2, .attrs = {"stride", "padding"}};
  op.flops = [](const Node& n, std::span<const TensorType> in) {
    return conv_flops(n.outputs[0].shape, conv_filter_shape(n.attrs, in[1].shape));
  };
  op.infer = [](std::span<const TensorType> in, const Attrs& attrs) {
    ops::check_floating_inputs("conv2d", in);
    const Shape y = conv_output_shape("conv2d", image_shape("conv2d", in[0].shape, attrs),
                                      conv_filter_shape(attrs, in[1].shape), conv_attrs(attrs));
    return std::vector<TensorType>{{stored_shape(y, conv_y_channels_last(attrs)), in[0].dtype}};
  };
  op.grad = [](const GradContext& c) {
    check_plain_filter(c.node);
    const ConvAttrs a = conv_attrs(c.node.attrs);
    const Value& x = c.inputs[0];
    const Value& w = c.inputs[1];
    const Value& dy = c.output_grads[0];  // stored as y is
    const bool last = conv_image_channels_last(c.node.attrs);
    const bool y_last = conv_y_channels_last(c.node.attrs);
    Value dx, dw;
    if (c.needs_grad[0]) {
      dx = conv2d_grad_input(dy, w, image_shape("conv2d", x.shape(), c.node.attrs), a.stride,
                             a.padding, y_last);
      if (last) dx = transpose(dx, kChannelsLast);
    }
    if (c.needs_grad[1])
      dw = conv2d_grad_weight(x, dy, w.shape(), a.stride, a.padding, last, y_last);
    return std::vector<Value>{dx, dw};
  };
  op.cpu = [](const KernelCall& call) {
    const Tensor x = channels_first(call.inputs[0], call.node.attrs);
    into_channels_first(call.outputs[0], conv_y_channels_last(call.node.attrs), [&](Tensor& y) {
      kernels::conv2d_forward(x, ops::conv_filter_nchw(call.inputs[1], call.node.attrs), y,
                              forward_geometry(call), call.blocked);
    });
  };
  op.cpu_blocked = [](const Node& n, std::span<const TensorType> in) {
    return blocked_of(kernels::ConvPass::forward, n, in);
  };
  op.cpu_kernel_name = [](const KernelCall& call) {
    return kernels::conv2d_kernel_name(kernels::ConvPass::forward, call.inputs[0].dtype(),
                                       forward_geometry(call));
  };
  op.autocast = AutocastPolicy::low;
  return op;
}

// conv2d_bias(x, w, bias) = conv2d(x, w) + bias[o] over each output channel o, then ReLU where
// "relu" = 1: the forward with its epilogue, made after autograd by fuse_gemm_epilogues
// (fusion/gemm_epilogues.h) from a convolution and the group that adds its bias; so no
// gradient of its own. The bias: Cout values of x's dtype, any shape ([1, Cout, 1, 1] as the
// layers reshape it). In every dtype the same bits as the three ops (bf16/f16: the
// convolution rounded before the bias is added).
ConvEpilogue epilogue_of(const KernelCall& call) {
  return {&call.inputs[2], call.node.attrs.integer("relu") != 0};
}

// A bf16/f16 node runs here widened to f32 (backends/cpu/low_precision.h): the convolution is
// rounded to its dtype first, where conv2d would store it, then the epilogue applied (the
// program rounds the result once more, as the add would): the unfused ops' bits, as the GPU's.
void conv_bias_low_precision(const KernelCall& call) {
  Tensor& y = call.outputs[0];
  kernels::conv2d_forward(channels_first(call.inputs[0], call.node.attrs), call.inputs[1], y,
                          forward_geometry(call));
  const DType dtype = call.node.outputs[0].dtype;
  float* v = y.data<float>();
  const std::int64_t channels = y.shape()[1], plane = y.shape()[2] * y.shape()[3];
  const ConvEpilogue e = epilogue_of(call);
#pragma omp parallel for schedule(static) if (y.numel() > 16384)  // else one thread is quicker
  for (std::int64_t i = 0; i < y.shape()[0] * channels; ++i) {
    float* p = v + i * plane;
    round_to(dtype, p, plane);
    kernels::apply_conv_epilogue(p, plane, e, i % channels);
  }
}

OpDef conv_bias_op() {
  OpDef op{.id = OpId::conv2d_bias,
           .kind = OpKind::conv,
           .arity = 3,
           .attrs = {"stride", "padding", "relu"}};
  op.flops = [](const Node& n, std::span<const TensorType> in) {
    return conv_flops(n.outputs[0].shape, in[1].shape);
  };
  op.infer = [](std::span<const TensorType> in, const Attrs& attrs) {
    ops::check_floating_inputs("conv2d_bias", in);
    const Shape y = conv_output_shape("conv2d_bias", image_shape("conv2d_bias", in[0].shape, attrs),
                                      in[1].shape, conv_attrs(attrs));
    KILN_CHECK(in[2].shape.numel() == y[1] && in[2].dtype == in[0].dtype,
               "conv2d_bias: the bias is {} but the output is {} ({} values of {} expected)",
               in[2].str(), y.str(), y[1], dtype_name(in[0].dtype));
    return std::vector<TensorType>{{y, in[0].dtype}};
  };
  op.cpu = [](const KernelCall& call) {
    if (is_low_precision(call.node.outputs[0].dtype)) return conv_bias_low_precision(call);
    kernels::conv2d_forward(channels_first(call.inputs[0], call.node.attrs), call.inputs[1],
                            call.outputs[0], forward_geometry(call), call.blocked,
                            epilogue_of(call));
  };
  op.cpu_blocked = [](const Node& n, std::span<const TensorType> in) {
    return blocked_of(kernels::ConvPass::forward, n, in);
  };
  op.cpu_kernel_name = [](const KernelCall& call) {
    return kernels::conv2d_kernel_name(kernels::ConvPass::forward, call.inputs[0].dtype(),
                                       forward_geometry(call), epilogue_of(call));
  };
  op.autocast = AutocastPolicy::keep;
  return op;
}

// conv2d_moments(x, w) = {y, moments} (graph/ops.h): conv2d's forward, then each output
// channel's moments over runs of kConvMomentRun pixels of y as stored (bf16/f16: rounded first,
// where conv2d would store it). The GPU computes them in the convolution's epilogue where its
// TMA pass runs (backends/cuda/conv_op.cpp), from the same rounded values in another order.
void conv_moments_cpu(const KernelCall& call) {
  Tensor& y = call.outputs[0];
  kernels::conv2d_forward(channels_first(call.inputs[0], call.node.attrs), call.inputs[1], y,
                          forward_geometry(call));
  round_to(call.node.outputs[0].dtype, y.data<float>(), y.numel());
  const std::int64_t channels = y.shape()[1], plane = y.shape()[2] * y.shape()[3];
  const std::int64_t pixels = y.shape()[0] * plane, runs = call.outputs[1].shape()[1];
  const float* v = y.data<float>();
  float* out = call.outputs[1].data<float>();
#pragma omp parallel for schedule(static) if (y.numel() > 16384)
  for (std::int64_t c = 0; c < channels; ++c)
    for (std::int64_t t = 0; t < runs; ++t) {
      const std::int64_t first = t * kConvMomentRun;
      const std::int64_t count = std::min(kConvMomentRun, pixels - first);
      auto at = [&](std::int64_t n) {
        const std::int64_t b = n / plane;
        return v[(b * channels + c) * plane + n - b * plane];
      };
      float sum = 0.0f;
      for (std::int64_t i = 0; i < count; ++i) sum += at(first + i);
      const float mean = sum / static_cast<float>(count);
      float squares = 0.0f;
      for (std::int64_t i = 0; i < count; ++i) {
        const float d = at(first + i) - mean;
        squares += d * d;
      }
      out[t * channels + c] = static_cast<float>(count);
      out[(runs + t) * channels + c] = mean;
      out[(2 * runs + t) * channels + c] = squares;
    }
}

OpDef conv_moments_op() {
  OpDef op{
      .id = OpId::conv2d_moments, .kind = OpKind::conv, .arity = 2, .attrs = {"stride", "padding"}};
  op.flops = [](const Node& n, std::span<const TensorType> in) {
    return conv_flops(n.outputs[0].shape, in[1].shape);
  };
  op.infer = [](std::span<const TensorType> in, const Attrs& attrs) {
    ops::check_floating_inputs("conv2d_moments", in);
    KILN_CHECK(in[0].dtype != DType::f64, "conv2d_moments: f64 is not supported (f32, bf16, f16)");
    const Shape y =
        conv_output_shape("conv2d_moments", image_shape("conv2d_moments", in[0].shape, attrs),
                          in[1].shape, conv_attrs(attrs));
    const std::int64_t runs = (y[0] * y[2] * y[3] + kConvMomentRun - 1) / kConvMomentRun;
    return std::vector<TensorType>{{y, in[0].dtype}, {Shape{3, runs, y[1]}, DType::f32}};
  };
  op.cpu = conv_moments_cpu;
  op.cpu_kernel_name = [](const KernelCall& call) {
    return kernels::conv2d_kernel_name(kernels::ConvPass::forward, call.inputs[0].dtype(),
                                       forward_geometry(call)) +
           " + moments";
  };
  op.autocast = AutocastPolicy::keep;
  return op;
}

// conv2d_grad_input(dy, w) = dx, with <G, dx> = <conv2d(G, w), dy>.
OpDef conv_grad_input_op() {
  OpDef op{.id = OpId::conv2d_grad_input,
           .kind = OpKind::conv,
           .arity = 2,
           .attrs = {"stride", "padding", "shape"}};
  op.flops = [](const Node& n, std::span<const TensorType> in) {  // in: dy, w
    return conv_flops(in[0].shape, conv_filter_shape(n.attrs, in[1].shape));
  };
  op.infer = [](std::span<const TensorType> in, const Attrs& attrs) {
    ops::check_floating_inputs("conv2d_grad_input", in);
    const Shape x(attrs.integers("shape"));
    const Shape y = conv_output_shape("conv2d_grad_input", x, conv_filter_shape(attrs, in[1].shape),
                                      conv_attrs(attrs));
    const bool y_last = conv_y_channels_last(attrs);
    KILN_CHECK(in[0].shape == stored_shape(y, y_last),
               "conv2d_grad_input: dy is {} but the convolution output is {}{}", in[0].str(),
               stored_shape(y, y_last).str(), y_last ? " (channels-last)" : "");
    return std::vector<TensorType>{{stored_shape(x, conv_image_channels_last(attrs)), in[0].dtype}};
  };
  op.grad = [](const GradContext& c) {  // g: stored as dx is
    check_plain_filter(c.node);
    const ConvAttrs a = conv_attrs(c.node.attrs);
    const Value& dy = c.inputs[0];
    const Value& w = c.inputs[1];
    const Value& g = c.output_grads[0];
    const bool last = conv_image_channels_last(c.node.attrs);
    const bool y_last = conv_y_channels_last(c.node.attrs);
    Value d_dy, d_w;
    if (c.needs_grad[0]) d_dy = conv2d(g, w, a.stride, a.padding, last, y_last);
    if (c.needs_grad[1])
      d_w = conv2d_grad_weight(g, dy, w.shape(), a.stride, a.padding, last, y_last);
    return std::vector<Value>{d_dy, d_w};
  };
  op.cpu = [](const KernelCall& call) {
    const Tensor dy = channels_first(call.inputs[0], conv_y_channels_last(call.node.attrs));
    into_channels_first(
        call.outputs[0], conv_image_channels_last(call.node.attrs), [&](Tensor& dx) {
          kernels::conv2d_backward_input(dy, ops::conv_filter_nchw(call.inputs[1], call.node.attrs),
                                         dx, grad_input_geometry(call), call.blocked);
        });
  };
  op.cpu_blocked = [](const Node& n, std::span<const TensorType> in) {
    return blocked_of(kernels::ConvPass::grad_input, n, in);
  };
  op.cpu_kernel_name = [](const KernelCall& call) {
    return kernels::conv2d_kernel_name(kernels::ConvPass::grad_input, call.inputs[0].dtype(),
                                       grad_input_geometry(call));
  };
  op.autocast = AutocastPolicy::low;
  return op;
}

// conv2d_grad_weight(x, dy) = dw, with <G, dw> = <conv2d(x, G), dy>.
OpDef conv_grad_weight_op() {
  OpDef op{.id = OpId::conv2d_grad_weight,
           .kind = OpKind::conv,
           .arity = 2,
           .attrs = {"stride", "padding", "shape"}};
  op.flops = [](const Node& n, std::span<const TensorType> in) {  // in: x, dy
    return conv_flops(in[1].shape, n.outputs[0].shape);
  };
  op.infer = [](std::span<const TensorType> in, const Attrs& attrs) {
    ops::check_floating_inputs("conv2d_grad_weight", in);
    const Shape w(attrs.integers("shape"));
    const Shape y = conv_output_shape("conv2d_grad_weight",
                                      image_shape("conv2d_grad_weight", in[0].shape, attrs), w,
                                      conv_attrs(attrs));
    const bool y_last = conv_y_channels_last(attrs);
    KILN_CHECK(in[1].shape == stored_shape(y, y_last),
               "conv2d_grad_weight: dy is {} but the convolution output is {}{}", in[1].str(),
               stored_shape(y, y_last).str(), y_last ? " (channels-last)" : "");
    return std::vector<TensorType>{{w, in[0].dtype}};
  };
  op.grad = [](const GradContext& c) {
    const ConvAttrs a = conv_attrs(c.node.attrs);
    const Value& x = c.inputs[0];
    const Value& dy = c.inputs[1];
    const Value& g = c.output_grads[0];
    const bool last = conv_image_channels_last(c.node.attrs);
    const bool y_last = conv_y_channels_last(c.node.attrs);
    Value d_x, d_dy;
    if (c.needs_grad[0]) {
      d_x = conv2d_grad_input(dy, g, image_shape("conv2d_grad_weight", x.shape(), c.node.attrs),
                              a.stride, a.padding, y_last);
      if (last) d_x = transpose(d_x, kChannelsLast);
    }
    if (c.needs_grad[1]) d_dy = conv2d(x, g, a.stride, a.padding, last, y_last);
    return std::vector<Value>{d_x, d_dy};
  };
  op.cpu = [](const KernelCall& call) {
    kernels::conv2d_backward_weight(
        channels_first(call.inputs[0], call.node.attrs),
        channels_first(call.inputs[1], conv_y_channels_last(call.node.attrs)), call.outputs[0],
        grad_weight_geometry(call), call.blocked);
  };
  op.cpu_blocked = [](const Node& n, std::span<const TensorType> in) {
    return blocked_of(kernels::ConvPass::grad_weight, n, in);
  };
  op.cpu_kernel_name = [](const KernelCall& call) {
    return kernels::conv2d_kernel_name(kernels::ConvPass::grad_weight, call.inputs[0].dtype(),
                                       grad_weight_geometry(call));
  };
  op.autocast = AutocastPolicy::low;
  return op;
}

}  // namespace

bool conv_image_channels_last(const Attrs& attrs) {
  return attrs.has("channels_last") && attrs.integer("channels_last") != 0;
}

void mark_conv_image_channels_last(Attrs& attrs) { attrs.set("channels_last", std::int64_t{1}); }

bool conv_y_channels_last(const Attrs& attrs) {
  return attrs.has("y_channels_last") && attrs.integer("y_channels_last") != 0;
}

void mark_conv_y_channels_last(Attrs& attrs) { attrs.set("y_channels_last", std::int64_t{1}); }
void unmark_conv_y_channels_last(Attrs& attrs) { attrs.erase("y_channels_last"); }

void ops::register_conv_ops(std::vector<OpDef>& table) {
  table.push_back(conv_forward_op());
  table.push_back(conv_bias_op());
  table.push_back(conv_grad_input_op());
  table.push_back(conv_grad_weight_op());
  table.push_back(conv_moments_op());
  register_conv_filter_op(table);
}

Value conv2d(Value x, Value w, std::int64_t stride, std::int64_t padding, bool channels_last,
             bool y_channels_last) {
  Attrs attrs = make_conv_attrs(stride, padding);
  if (channels_last) mark_conv_image_channels_last(attrs);
  if (y_channels_last) mark_conv_y_channels_last(attrs);
  return x.graph().apply1(OpId::conv2d, {x, w}, std::move(attrs));
}

std::pair<Value, Value> conv2d_moments(Value x, Value w, std::int64_t stride, std::int64_t padding,
                                       bool channels_last) {
  Attrs attrs = make_conv_attrs(stride, padding);
  if (channels_last) mark_conv_image_channels_last(attrs);
  const std::vector<Value> out = x.graph().apply(OpId::conv2d_moments, {x, w}, std::move(attrs));
  return {out[0], out[1]};
}

Value conv2d_grad_input(Value dy, Value w, const Shape& input_shape, std::int64_t stride,
                        std::int64_t padding, bool y_channels_last, bool channels_last) {
  Attrs attrs = make_conv_attrs(stride, padding);
  if (channels_last) mark_conv_image_channels_last(attrs);
  if (y_channels_last) mark_conv_y_channels_last(attrs);
  attrs.set("shape", input_shape.dims());
  return dy.graph().apply1(OpId::conv2d_grad_input, {dy, w}, std::move(attrs));
}

Value conv2d_grad_weight(Value x, Value dy, const Shape& weight_shape, std::int64_t stride,
                         std::int64_t padding, bool channels_last, bool y_channels_last) {
  Attrs attrs = make_conv_attrs(stride, padding);
  if (channels_last) mark_conv_image_channels_last(attrs);
  if (y_channels_last) mark_conv_y_channels_last(attrs);
  attrs.set("shape", weight_shape.dims());
  return x.graph().apply1(OpId::conv2d_grad_weight, {x, dy}, std::move(attrs));
}

}  // namespace kiln
