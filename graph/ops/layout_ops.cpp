// Layout ops: reshape (a view), transpose (a copy), one_hot (integer labels to rows).
#include <fmt/ranges.h>

#include <numeric>

#include "core/dispatch.h"
#include "graph/kernels/transpose_cpu.h"
#include "graph/ops.h"
#include "graph/ops/register.h"

namespace kiln {
namespace {

std::vector<std::int64_t> inverse_permutation(const std::vector<std::int64_t>& perm) {
  std::vector<std::int64_t> inverse(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i)
    inverse[static_cast<std::size_t>(perm[i])] = static_cast<std::int64_t>(i);
  return inverse;
}

void transpose_kernel(const KernelCall& call) {
  kernels::transpose(call.inputs[0], call.node.attrs.integers("perm"), call.outputs[0]);
}

void one_hot_kernel(const KernelCall& call) {
  const Tensor& labels = call.inputs[0];
  Tensor& out = call.outputs[0];
  const std::int64_t classes = call.node.attrs.integer("classes");
  visit_dtype(labels.dtype(), [&](auto label_zero) {
    using L = decltype(label_zero);
    visit_floating(out.dtype(), "one_hot", [&](auto out_zero) {
      using T = decltype(out_zero);
      const L* in = labels.data<L>();
      T* o = out.data<T>();
      std::fill_n(o, out.numel(), T(0));
      for (std::int64_t i = 0; i < labels.numel(); ++i) {
        const auto label = static_cast<std::int64_t>(in[i]);
        KILN_CHECK(label >= 0 && label < classes,
                   "one_hot: label {} at index {} is outside [0, {})", label, i, classes);
        o[i * classes + label] = T(1);
      }
    });
  });
}

}  // namespace

void ops::register_layout_ops(std::vector<OpDef>& table) {
  OpDef reshape_op{
      .id = OpId::reshape, .kind = OpKind::layout, .arity = 1, .attrs = {"shape"}, .alias = true};
  reshape_op.infer = [](std::span<const TensorType> in, const Attrs& attrs) {
    const Shape target(attrs.integers("shape"));
    KILN_CHECK(target.numel() == in[0].shape.numel(), "reshape: cannot view {} as {}", in[0].str(),
               target.str());
    return std::vector<TensorType>{{target, in[0].dtype}};
  };
  reshape_op.grad = [](const GradContext& c) {
    return std::vector<Value>{reshape(c.output_grads[0], c.inputs[0].shape().dims())};
  };
  table.push_back(std::move(reshape_op));

  OpDef transpose_op{.id = OpId::transpose, .kind = OpKind::layout, .arity = 1, .attrs = {"perm"}};
  transpose_op.infer = [](std::span<const TensorType> in, const Attrs& attrs) {
    const auto& perm = attrs.integers("perm");
    KILN_CHECK(perm.size() == in[0].shape.rank(), "transpose: permutation of {} axes for {}",
               perm.size(), in[0].str());
    std::vector<std::int64_t> seen(perm.size(), 0), dims;
    for (std::int64_t p : perm) {
      KILN_CHECK(p >= 0 && p < static_cast<std::int64_t>(perm.size()) &&
                     !seen[static_cast<std::size_t>(p)]++,
                 "transpose: [{}] is not a permutation", fmt::join(perm, ", "));
      dims.push_back(in[0].shape[static_cast<std::size_t>(p)]);
    }
    return std::vector<TensorType>{{Shape(dims), in[0].dtype}};
  };
  transpose_op.grad = [](const GradContext& c) {
    return std::vector<Value>{
        transpose(c.output_grads[0], inverse_permutation(c.node.attrs.integers("perm")))};
  };
  transpose_op.cpu = transpose_kernel;
  table.push_back(std::move(transpose_op));

  OpDef one_hot_op{
      .id = OpId::one_hot, .kind = OpKind::other, .arity = 1, .attrs = {"classes", "dtype"}};
  one_hot_op.infer = [](std::span<const TensorType> in, const Attrs& attrs) {
    KILN_CHECK(!is_floating(in[0].dtype), "one_hot: labels must be integers but are {}",
               in[0].str());
    ops::check_rank("one_hot", "labels", in[0], 1);
    const std::int64_t classes = attrs.integer("classes");
    KILN_CHECK(classes > 0, "one_hot: {} classes", classes);
    return std::vector<TensorType>{
        {Shape{in[0].shape[0], classes}, dtype_from_name(attrs.text("dtype"))}};
  };
  one_hot_op.cpu = one_hot_kernel;
  one_hot_op.autocast = AutocastPolicy::keep;
  table.push_back(std::move(one_hot_op));
}

Value reshape(Value x, const std::vector<std::int64_t>& dims) {
  std::vector<std::int64_t> resolved = dims;
  std::int64_t known = 1;
  std::size_t inferred = dims.size();
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1) {
      KILN_CHECK(inferred == dims.size(), "reshape: more than one -1 in [{}]",
                 fmt::join(dims, ", "));
      inferred = i;
      continue;
    }
    KILN_CHECK(dims[i] >= 0, "reshape: negative dimension in [{}]", fmt::join(dims, ", "));
    known *= dims[i];
  }
  if (inferred != dims.size()) {
    KILN_CHECK(known > 0 && x.shape().numel() % known == 0, "reshape: cannot view {} as [{}]",
               x.type().str(), fmt::join(dims, ", "));
    resolved[inferred] = x.shape().numel() / known;
  }
  if (x.shape() == Shape(resolved)) return x;
  return x.graph().apply1(OpId::reshape, {x}, {{"shape", resolved}});
}

Value transpose(Value x, const std::vector<std::int64_t>& perm) {
  std::vector<std::int64_t> normalized;
  for (std::int64_t p : perm)
    normalized.push_back(normalize_axis(p, x.shape().rank(), "transpose"));
  return x.graph().apply1(OpId::transpose, {x}, {{"perm", normalized}});
}

Value one_hot(Value labels, std::int64_t classes, DType dtype) {
  return labels.graph().apply1(OpId::one_hot, {labels},
                               {{"classes", classes}, {"dtype", std::string(dtype_name(dtype))}});
}

}  // namespace kiln
