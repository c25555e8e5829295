// conv_filter_layout: convolution filters in the order the GPU's channels-last tensor-core
// passes read it (graph/ops.h), and the attributes by which a convolution node says it reads
// one. The CPU's layout and its inverse are one walk over the filter's elements.
#include <fmt/ranges.h>

#include <cstring>

#include "graph/ops.h"
#include "graph/ops/conv_filter.h"
#include "graph/ops/register.h"

namespace kiln {
namespace {

FilterLayout layout_from(std::int64_t code, const char* op) {
  KILN_CHECK(code == 1 || code == 2,
             "{}: filter layout {} (1: [Cout, KH, KW, Cin], 2: [Cin, KH, KW, Cout])", op, code);
  return static_cast<FilterLayout>(code);
}

// Checks that `taps` orders all KH*KW taps of a filter, each once.
void check_taps(const std::vector<std::int64_t>& taps, std::int64_t khkw, const char* op) {
  std::vector<char> seen(static_cast<std::size_t>(khkw), 0);
  bool permutation = static_cast<std::int64_t>(taps.size()) == khkw;
  for (std::int64_t t : taps)
    permutation = permutation && t >= 0 && t < khkw && !seen[static_cast<std::size_t>(t)]++;
  KILN_CHECK(permutation, "{}: taps [{}] are not an order of the filter's {} taps", op,
             fmt::join(taps, ", "), khkw);
}

// The laid-out shape of a [Cout, Cin, KH, KW] filter.
Shape laid_out_shape(const Shape& w, FilterLayout layout) {
  return layout == FilterLayout::filters_major ? Shape{w[0], w[2], w[3], w[1]}
                                               : Shape{w[1], w[2], w[3], w[0]};
}

// Copies between w [Cout, Cin, KH*KW] and its layout `a`: a[r][t][c] = w[r][c][taps[t]]
// (filters_major) or w[c][r][taps[t]] (channels_major); `to_layout` says which way.
void permute(const Tensor& from, Tensor& to, const Shape& w, FilterLayout layout,
             const std::vector<std::int64_t>& taps, bool to_layout) {
  const bool filters = layout == FilterLayout::filters_major;
  const std::int64_t rows = filters ? w[0] : w[1], cols = filters ? w[1] : w[0];
  const std::int64_t khkw = w[2] * w[3];
  const std::size_t elem = dtype_size(from.dtype());
  const auto* src = static_cast<const char*>(from.raw());
  auto* dst = static_cast<char*>(to.raw());
#pragma omp parallel for schedule(static) if (w.numel() > 65536)
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t t = 0; t < khkw; ++t)
      for (std::int64_t c = 0; c < cols; ++c) {
        const std::int64_t laid = (r * khkw + t) * cols + c;
        const std::int64_t plain =
            ((filters ? r * cols + c : c * rows + r) * khkw) + taps[static_cast<std::size_t>(t)];
        const std::int64_t in = to_layout ? plain : laid, out = to_layout ? laid : plain;
        std::memcpy(dst + static_cast<std::size_t>(out) * elem,
                    src + static_cast<std::size_t>(in) * elem, elem);
      }
}

Attrs layout_attrs(FilterLayout layout, const std::vector<std::int64_t>& taps) {
  Attrs attrs;
  attrs.set("layout", static_cast<std::int64_t>(layout));
  attrs.set("taps", taps);
  return attrs;
}

}  // namespace

FilterLayout conv_filter_layout_of(const Attrs& attrs) {
  if (!attrs.has("w_layout")) return FilterLayout::nchw;
  return layout_from(attrs.integer("w_layout"), "convolution");
}

void mark_conv_filter_layout(Attrs& attrs, FilterLayout layout,
                             const std::vector<std::int64_t>& taps) {
  KILN_CHECK(layout != FilterLayout::nchw, "mark_conv_filter_layout: no layout given");
  attrs.set("w_layout", static_cast<std::int64_t>(layout));
  attrs.set("w_taps", taps);
}

Shape conv_filter_shape(const Attrs& attrs, const Shape& stored) {
  const FilterLayout layout = conv_filter_layout_of(attrs);
  if (layout == FilterLayout::nchw) return stored;
  KILN_CHECK(stored.rank() == 4, "convolution: a laid-out filter must have 4 dims but is {}",
             stored.str());
  const Shape w = layout == FilterLayout::filters_major
                      ? Shape{stored[0], stored[3], stored[1], stored[2]}
                      : Shape{stored[3], stored[0], stored[1], stored[2]};
  check_taps(attrs.integers("w_taps"), w[2] * w[3], "convolution");
  return w;
}

Tensor ops::conv_filter_nchw(const Tensor& stored, const Attrs& attrs) {
  const FilterLayout layout = conv_filter_layout_of(attrs);
  if (layout == FilterLayout::nchw) return stored;
  const Shape w = conv_filter_shape(attrs, stored.shape());
  Tensor plain = Tensor::empty(w, stored.dtype());
  permute(stored, plain, w, layout, attrs.integers("w_taps"), false);
  return plain;
}

void ops::register_conv_filter_op(std::vector<OpDef>& table) {
  OpDef op{.id = OpId::conv_filter_layout,
           .kind = OpKind::layout,
           .arity = 1,
           .attrs = {"layout", "taps"}};
  op.arity = -1;  // filters of one size and dtype, laid out alike
  op.infer = [](std::span<const TensorType> in, const Attrs& attrs) {
    const char* name = "conv_filter_layout";
    KILN_CHECK(!in.empty(), "{}: no filter given", name);
    const FilterLayout layout = layout_from(attrs.integer("layout"), name);
    std::vector<TensorType> out;
    for (const TensorType& w : in) {
      KILN_CHECK(w.shape.rank() == 4 && w.shape[2] == in[0].shape[2] &&
                     w.shape[3] == in[0].shape[3] && w.dtype == in[0].dtype,
                 "{}: filter {} is not [Cout, Cin, KH, KW] of the first's size and dtype ({})",
                 name, w.str(), in[0].str());
      out.push_back({laid_out_shape(w.shape, layout), w.dtype});
    }
    check_taps(attrs.integers("taps"), in[0].shape[2] * in[0].shape[3], name);
    return out;
  };
  op.cpu = [](const KernelCall& call) {
    const Attrs& a = call.node.attrs;
    for (std::size_t i = 0; i < call.inputs.size(); ++i)
      permute(call.inputs[i], call.outputs[i], call.inputs[i].shape(),
              layout_from(a.integer("layout"), "conv_filter_layout"), a.integers("taps"), true);
  };
  op.autocast = AutocastPolicy::follow;
  table.push_back(std::move(op));
}

std::vector<Value> conv_filter_layout(const std::vector<Value>& filters, FilterLayout layout,
                                      const std::vector<std::int64_t>& taps) {
  KILN_CHECK(!filters.empty(), "conv_filter_layout: no filter given");
  return filters[0].graph().apply(OpId::conv_filter_layout, filters, layout_attrs(layout, taps));
}

}  // namespace kiln
