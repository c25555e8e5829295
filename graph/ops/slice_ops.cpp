// Layout ops along one axis: slice (a range of indices), concat (values joined), pad (a
// value placed between zeros). Each is a copy of `outer` blocks of contiguous bytes, so
// one CPU helper (and one cudaMemcpy2D on the GPU) serves all three, for any dtype.
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include "graph/ops.h"
#include "graph/ops/register.h"

namespace kiln {
namespace {

// A tensor seen as [outer, dim, inner] around `axis`; inner counted in bytes.
struct AxisView {
  std::int64_t outer = 1, dim = 1, inner_bytes = 1;
};

AxisView axis_view(const Shape& shape, std::int64_t axis, DType dtype) {
  AxisView v;
  v.inner_bytes = static_cast<std::int64_t>(dtype_size(dtype));
  for (std::size_t d = 0; d < shape.rank(); ++d) {
    const auto a = static_cast<std::int64_t>(d);
    if (a < axis) v.outer *= shape[d];
    if (a == axis) v.dim = shape[d];
    if (a > axis) v.inner_bytes *= shape[d];
  }
  return v;
}

// `rows` blocks of `bytes` each, from src every `src_pitch` bytes to dst every `dst_pitch`;
// over 1 MiB in all, the team copies pieces of at most 256 KiB (a slice or concat along the
// first axis is one block: char-lstm's 4 MiB ones took one thread).
void copy_blocks(const char* src, std::int64_t src_pitch, char* dst, std::int64_t dst_pitch,
                 std::int64_t rows, std::int64_t bytes) {
  if (bytes == 0) return;
  constexpr std::int64_t kPiece = std::int64_t{1} << 18;
  const std::int64_t pieces = (bytes + kPiece - 1) / kPiece, tasks = rows * pieces;
#pragma omp parallel for schedule(static) if (rows * bytes > (1 << 20) && tasks > 1)
  for (std::int64_t t = 0; t < tasks; ++t) {
    const std::int64_t r = t / pieces, at = t % pieces * kPiece;
    std::memcpy(dst + r * dst_pitch + at, src + r * src_pitch + at,
                static_cast<std::size_t>(std::min(kPiece, bytes - at)));
  }
}

void slice_kernel(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  const std::int64_t axis = call.node.attrs.integer("axis");
  const AxisView in = axis_view(x.shape(), axis, x.dtype());
  const std::int64_t start = call.node.attrs.integer("start"),
                     length = call.node.attrs.integer("length");
  copy_blocks(static_cast<const char*>(x.raw()) + start * in.inner_bytes, in.dim * in.inner_bytes,
              static_cast<char*>(call.outputs[0].raw()), length * in.inner_bytes, in.outer,
              length * in.inner_bytes);
}

void concat_kernel(const KernelCall& call) {
  Tensor& y = call.outputs[0];
  const std::int64_t axis = call.node.attrs.integer("axis");
  const AxisView out = axis_view(y.shape(), axis, y.dtype());
  std::int64_t at = 0;  // index along the axis where the next input starts
  for (const Tensor& x : call.inputs) {
    const std::int64_t length = x.shape()[static_cast<std::size_t>(axis)];
    copy_blocks(static_cast<const char*>(x.raw()), length * out.inner_bytes,
                static_cast<char*>(y.raw()) + at * out.inner_bytes, out.dim * out.inner_bytes,
                out.outer, length * out.inner_bytes);
    at += length;
  }
}

void pad_kernel(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  const std::int64_t axis = call.node.attrs.integer("axis");
  const AxisView out = axis_view(y.shape(), axis, y.dtype());
  const std::int64_t length = x.shape()[static_cast<std::size_t>(axis)];
  std::memset(y.raw(), 0, y.nbytes());  // all-zero bits are 0 in every dtype
  copy_blocks(static_cast<const char*>(x.raw()), length * out.inner_bytes,
              static_cast<char*>(y.raw()) + call.node.attrs.integer("before") * out.inner_bytes,
              out.dim * out.inner_bytes, out.outer, length * out.inner_bytes);
}

std::vector<TensorType> infer_slice(std::span<const TensorType> in, const Attrs& attrs) {
  const Shape& x = in[0].shape;
  const std::int64_t axis = attrs.integer("axis"), start = attrs.integer("start"),
                     length = attrs.integer("length");
  KILN_CHECK(axis >= 0 && axis < static_cast<std::int64_t>(x.rank()), "slice: axis {} of {}", axis,
             in[0].str());
  const std::int64_t dim = x[static_cast<std::size_t>(axis)];
  KILN_CHECK(start >= 0 && length >= 0 && start + length <= dim,
             "slice: [{}, {}) is outside axis {} of {} (size {})", start, start + length, axis,
             in[0].str(), dim);
  Shape out = x;
  out[static_cast<std::size_t>(axis)] = length;
  return {{out, in[0].dtype}};
}

std::vector<TensorType> infer_concat(std::span<const TensorType> in, const Attrs& attrs) {
  KILN_CHECK(!in.empty(), "concat: no values");
  const std::int64_t axis = attrs.integer("axis");
  const Shape& first = in[0].shape;
  KILN_CHECK(axis >= 0 && axis < static_cast<std::int64_t>(first.rank()), "concat: axis {} of {}",
             axis, in[0].str());
  Shape out = first;
  out[static_cast<std::size_t>(axis)] = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    KILN_CHECK(in[i].dtype == in[0].dtype,
               "concat: value {} is {} but value 0 is {} (dtypes must match)", i, in[i].str(),
               in[0].str());
    bool same = in[i].shape.rank() == first.rank();
    for (std::size_t d = 0; same && d < first.rank(); ++d)
      same = static_cast<std::int64_t>(d) == axis || in[i].shape[d] == first[d];
    KILN_CHECK(same, "concat: value {} is {} but value 0 is {} (only axis {} may differ)", i,
               in[i].str(), in[0].str(), axis);
    out[static_cast<std::size_t>(axis)] += in[i].shape[static_cast<std::size_t>(axis)];
  }
  return {{out, in[0].dtype}};
}

std::vector<TensorType> infer_pad(std::span<const TensorType> in, const Attrs& attrs) {
  const std::int64_t axis = attrs.integer("axis"), before = attrs.integer("before"),
                     after = attrs.integer("after");
  KILN_CHECK(axis >= 0 && axis < static_cast<std::int64_t>(in[0].shape.rank()),
             "pad: axis {} of {}", axis, in[0].str());
  KILN_CHECK(before >= 0 && after >= 0, "pad: negative padding {} before, {} after", before, after);
  Shape out = in[0].shape;
  out[static_cast<std::size_t>(axis)] += before + after;
  return {{out, in[0].dtype}};
}

// concat's gradient: the slice of the output gradient that each value filled.
std::vector<Value> concat_grad(const GradContext& c) {
  const std::int64_t axis = c.node.attrs.integer("axis");
  std::vector<Value> grads;
  std::int64_t at = 0;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const std::int64_t length = c.inputs[i].shape()[static_cast<std::size_t>(axis)];
    grads.push_back(c.needs_grad[i] ? slice(c.output_grads[0], axis, at, length) : Value());
    at += length;
  }
  return grads;
}

}  // namespace

void ops::register_slice_ops(std::vector<OpDef>& table) {
  OpDef slice_op{
      .id = OpId::slice, .kind = OpKind::layout, .arity = 1, .attrs = {"axis", "start", "length"}};
  slice_op.infer = infer_slice;
  slice_op.grad = [](const GradContext& c) {
    const Attrs& a = c.node.attrs;
    const std::int64_t axis = a.integer("axis"), start = a.integer("start");
    const std::int64_t dim = c.inputs[0].shape()[static_cast<std::size_t>(axis)];
    return std::vector<Value>{
        pad(c.output_grads[0], axis, start, dim - start - a.integer("length"))};
  };
  slice_op.cpu = slice_kernel;
  table.push_back(std::move(slice_op));

  OpDef concat_op{.id = OpId::concat, .kind = OpKind::layout, .arity = -1, .attrs = {"axis"}};
  concat_op.infer = infer_concat;
  concat_op.grad = concat_grad;
  concat_op.cpu = concat_kernel;
  table.push_back(std::move(concat_op));

  OpDef pad_op{
      .id = OpId::pad, .kind = OpKind::layout, .arity = 1, .attrs = {"axis", "before", "after"}};
  pad_op.infer = infer_pad;
  pad_op.grad = [](const GradContext& c) {
    const Attrs& a = c.node.attrs;
    const std::int64_t axis = a.integer("axis");
    return std::vector<Value>{slice(c.output_grads[0], axis, a.integer("before"),
                                    c.inputs[0].shape()[static_cast<std::size_t>(axis)])};
  };
  pad_op.cpu = pad_kernel;
  table.push_back(std::move(pad_op));
}

Value slice(Value x, std::int64_t axis, std::int64_t start, std::int64_t length) {
  const std::int64_t a = normalize_axis(axis, x.shape().rank(), "slice");
  if (start == 0 && length == x.shape()[static_cast<std::size_t>(a)]) return x;
  return x.graph().apply1(OpId::slice, {x}, {{"axis", a}, {"start", start}, {"length", length}});
}

Value concat(const std::vector<Value>& values, std::int64_t axis) {
  KILN_CHECK(!values.empty(), "concat: no values");
  if (values.size() == 1) return values[0];
  const std::int64_t a = normalize_axis(axis, values[0].shape().rank(), "concat");
  return values[0].graph().apply1(OpId::concat, values, {{"axis", a}});
}

Value pad(Value x, std::int64_t axis, std::int64_t before, std::int64_t after) {
  const std::int64_t a = normalize_axis(axis, x.shape().rank(), "pad");
  if (before == 0 && after == 0) return x;
  return x.graph().apply1(OpId::pad, {x}, {{"axis", a}, {"before", before}, {"after", after}});
}

}  // namespace kiln
