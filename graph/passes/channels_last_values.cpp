// One walk over the nodes (channels_last_values.h): each 4-D value's stored layout is decided at
// its writer, and each reader gets the layout it takes, through a reshape where both layouts
// hold the same order, else through a transpose made once a value.
#include "graph/passes/channels_last_values.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "graph/op.h"
#include "graph/op_table.h"
#include "graph/ops.h"

namespace kiln {
namespace {

// A value as `g` stores it, or with its axes permuted by kChannelsLast.
enum class Layout { given, permuted };

bool four_d(const TensorType& t) { return t.shape.rank() == 4; }
// Whether [B, C, H, W] and [B, H, W, C] hold a value of this shape in the same order.
bool same_order(const Shape& s) { return s[1] == 1 || s[2] * s[3] == 1; }
// A [1, C, 1, 1] value (batch norm's scale, a bias rounded to bf16).
bool per_channel(const Shape& s) { return s[0] == 1 && s[2] * s[3] == 1; }
Shape permuted(const Shape& s) { return Shape{s[0], s[2], s[3], s[1]}; }

bool is_conv(const Node& n) {
  const OpId id = n.op->id;
  return id == OpId::conv2d || id == OpId::conv2d_grad_input || id == OpId::conv2d_grad_weight;
}

// Whether the node computes the same values over permuted axes, given its axis attributes
// mapped (attrs_permuted): an elementwise op over 4-D values and scalars, a reduction of a 4-D
// value that keeps its dims, a slice of one.
bool permutable(const Graph& g, const Node& n) {
  if (n.outputs.size() != 1 || !four_d(n.outputs[0])) return false;
  switch (n.op->kind) {
    case OpKind::elementwise:
      return std::all_of(n.inputs.begin(), n.inputs.end(), [&](ValueRef in) {
        const std::size_t rank = g.type(in).shape.rank();
        return rank == 4 || rank == 0;
      });
    case OpKind::reduction:
      return four_d(g.type(n.inputs[0])) && n.attrs.integer("keepdims") == 1;
    case OpKind::layout:
      return n.op->id == OpId::slice;
    default:
      return false;
  }
}

// A reduction of a 4-D value to fewer dims whose kept axes have the same order in both
// layouts (a global pooling's [B, C]): over the permuted value it writes the given result.
bool reduces_in_order(const Node& n) {
  if (n.op->kind != OpKind::reduction || n.attrs.integer("keepdims") != 0 ||
      n.outputs[0].shape.rank() == 4)
    return false;
  const std::vector<std::int64_t>& axes = n.attrs.integers("axes");
  std::int64_t last = -1;
  for (std::int64_t d : kChannelsLast) {  // the permuted value's axes, in order
    if (std::find(axes.begin(), axes.end(), d) != axes.end()) continue;
    if (d < last) return false;
    last = d;
  }
  return true;
}

Attrs attrs_permuted(const Node& n) {
  Attrs a = n.attrs;
  auto axis = [](std::int64_t d) { return kChannelsFirst[static_cast<std::size_t>(d)]; };
  if (n.op->id == OpId::broadcast_to) a.set("shape", permuted(Shape(a.integers("shape"))).dims());
  if (n.op->id == OpId::slice) a.set("axis", axis(a.integer("axis")));
  if (n.op->kind == OpKind::reduction) {
    std::vector<std::int64_t> axes;
    for (std::int64_t d : a.integers("axes")) axes.push_back(axis(d < 0 ? d + 4 : d));
    std::sort(axes.begin(), axes.end());
    a.set("axes", axes);
  }
  return a;
}

std::int64_t bytes_of(const TensorType& t) {
  return t.shape.numel() * static_cast<std::int64_t>(dtype_size(t.dtype));
}

// The bytes g's layout copies write: its transposes, and the dy that an input gradient's pass
// copies to channels-last itself.
std::int64_t transposed_bytes(const Graph& g, const ChannelsLastTaken& takes) {
  std::int64_t bytes = 0;
  for (const Node& n : g.nodes()) {
    if (n.op->id == OpId::transpose) bytes += bytes_of(n.outputs[0]);
    if (n.op->id != OpId::conv2d_grad_input || conv_y_channels_last(n.attrs)) continue;
    std::vector<TensorType> types;
    for (ValueRef in : n.inputs) types.push_back(g.type(in));
    if (takes(n, types).copies_nchw_dy) bytes += bytes_of(types[0]);
  }
  return bytes;
}

class Rewriter {
 public:
  Rewriter(const Graph& g, const ChannelsLastTaken& takes) : g_(g), takes_(takes) {
    for (const Node& n : g.nodes()) forms_.emplace_back(n.outputs.size());
  }

  Graph run() {
    for (std::int32_t id = 0; id < static_cast<std::int32_t>(g_.nodes().size()); ++id) visit(id);
    for (const auto& [name, ref] : g_.outputs())
      out_.output(name, out_.value(in_layout(ref, Layout::given)));
    for (const auto& [var, ref] : g_.assignments())
      out_.assign(var, out_.value(in_layout(ref, Layout::given)));
    return std::move(out_);
  }

 private:
  // A value of g_ in out_: in either layout once made; `flexible`: not made at its place but
  // in each layout a reader asks for (a cheap elementwise value: a broadcast and its math).
  struct Forms {
    std::optional<ValueRef> given, permuted;
    bool stored_permuted = false;  // its writer stores it permuted
    bool flexible = false;
  };

  Forms& forms(ValueRef v) {
    return forms_[static_cast<std::size_t>(v.node)][static_cast<std::size_t>(v.index)];
  }

  // Made in either layout for free: one order, or flexible.
  bool free(ValueRef v) {
    return four_d(g_.type(v)) && (same_order(g_.type(v).shape) || forms(v).flexible);
  }

  ValueRef add(Node n, const Attrs& attrs, bool retype) {
    n.attrs = attrs;
    if (retype) {
      std::vector<TensorType> types;
      for (ValueRef in : n.inputs) types.push_back(out_.type(in));
      n.outputs = n.op->infer(types, n.attrs);
    }
    return out_.add_node(std::move(n));
  }

  ValueRef view(OpId op, const char* attr, std::vector<std::int64_t> dims, ValueRef in) {
    return add(Node{.op = &op_def(op), .inputs = {in}}, Attrs{{attr, std::move(dims)}}, true);
  }

  // Value v of g_ stored in `layout` in out_.
  ValueRef in_layout(ValueRef v, Layout layout) {
    Forms& f = forms(v);
    std::optional<ValueRef>& slot = layout == Layout::given ? f.given : f.permuted;
    if (slot) return *slot;
    if (f.flexible) return *(slot = make(g_.node(v.node), layout));
    const TensorType& type = g_.type(v);
    const ValueRef other = layout == Layout::given ? *f.permuted : *f.given;
    if (same_order(type.shape)) {
      const Shape shape = layout == Layout::given ? type.shape : permuted(type.shape);
      return *(slot = view(OpId::reshape, "shape", shape.dims(), other));
    }
    return *(slot = view(OpId::transpose, "perm",
                         layout == Layout::given ? kChannelsFirst : kChannelsLast, other));
  }

  // Node n with its 4-D inputs in `layout` (the other inputs as given).
  ValueRef make(const Node& n, Layout layout) {
    Node copy = n;
    for (ValueRef& in : copy.inputs)
      in = in_layout(in, four_d(g_.type(in)) ? layout : Layout::given);
    if (layout == Layout::given) return add(std::move(copy), n.attrs, false);
    return add(std::move(copy), attrs_permuted(n), true);
  }

  void visit(std::int32_t id) {
    const Node& n = g_.node(id);
    const ValueRef out0{id, 0};
    if (n.op->id == OpId::transpose && n.attrs.integers("perm") == kChannelsLast &&
        four_d(g_.type(n.inputs[0]))) {  // channels_last_images' copy, or none needed
      forms(out0).given = in_layout(n.inputs[0], Layout::permuted);
      return;
    }
    if (is_conv(n)) return visit_conv(id);
    if (reduces_in_order(n) && forms(n.inputs[0]).stored_permuted && !free(n.inputs[0])) {
      forms(out0).given = make(n, Layout::permuted);  // its kept axes in their order: as given
      return;
    }
    if (permutable(g_, n)) {
      // Its large inputs decide: the layout that needs fewer bytes of them transposed anew
      // (given on a tie, unless every one is stored permuted); with none (per-channel values,
      // broadcasts), a permuted per-channel input keeps the chain permuted, and a large
      // elementwise result is made where its readers want it.
      bool large = false, all_permuted = true, small_permuted = false;
      std::int64_t to_permute = 0, to_give = 0;
      for (ValueRef in : n.inputs) {
        if (!four_d(g_.type(in))) continue;
        const Forms& f = forms(in);
        if (free(in)) {
          small_permuted = small_permuted || f.stored_permuted;
          continue;
        }
        large = true;
        all_permuted = all_permuted && f.stored_permuted;
        const std::int64_t bytes = bytes_of(g_.type(in));
        to_permute += f.permuted ? 0 : bytes;
        to_give += f.given ? 0 : bytes;
      }
      const bool large_permuted = to_permute < to_give || (to_permute == to_give && all_permuted);
      if (!large && !small_permuted && n.op->kind == OpKind::elementwise &&
          (!same_order(n.outputs[0].shape) || per_channel(n.outputs[0].shape))) {
        forms(out0).flexible = true;
        return;
      }
      if (large ? large_permuted : small_permuted) {
        forms(out0).permuted = make(n, Layout::permuted);
        forms(out0).stored_permuted = true;
        return;
      }
    }
    const ValueRef first = make(n, Layout::given);
    for (std::int32_t k = 0; k < static_cast<std::int32_t>(n.outputs.size()); ++k)
      forms({id, k}).given = ValueRef{first.node, k};
  }

  // A convolution: its output side (y written, dy read) and grad_input's dx permuted where
  // `takes` lets it; dy only where it is stored permuted already or free to make so.
  void visit_conv(std::int32_t id) {
    const Node& n = g_.node(id);
    std::vector<TensorType> types;
    for (ValueRef in : n.inputs) types.push_back(g_.type(in));
    const ChannelsLastSides sides = takes_(n, types);
    Node copy = n;
    std::vector<Layout> layouts(n.inputs.size(), Layout::given);
    bool out_permuted = false;
    if (sides.y && !conv_y_channels_last(n.attrs)) {
      if (n.op->id == OpId::conv2d) {
        mark_conv_y_channels_last(copy.attrs);
        out_permuted = true;
      } else {
        const std::size_t dy = n.op->id == OpId::conv2d_grad_input ? 0 : 1;
        if (forms(n.inputs[dy]).stored_permuted || free(n.inputs[dy])) {
          layouts[dy] = Layout::permuted;
          mark_conv_y_channels_last(copy.attrs);
        }
      }
    }
    for (std::size_t k = 0; k < n.inputs.size(); ++k)
      copy.inputs[k] = in_layout(n.inputs[k], layouts[k]);
    if (sides.image && n.op->id == OpId::conv2d_grad_input && !conv_image_channels_last(n.attrs)) {
      mark_conv_image_channels_last(copy.attrs);
      out_permuted = true;
    }
    const Attrs attrs = copy.attrs;
    const ValueRef out = add(std::move(copy), attrs, true);
    Forms& f = forms({id, 0});
    (out_permuted ? f.permuted : f.given) = out;
    f.stored_permuted = out_permuted;
  }

  const Graph& g_;
  const ChannelsLastTaken& takes_;
  Graph out_;
  std::vector<std::vector<Forms>> forms_;
};

}  // namespace

ChannelsLastValues channels_last_values_mode() {
  const char* v = std::getenv("KILN_CHANNELS_LAST_VALUES");
  if (v == nullptr || std::string_view(v) == "0") return ChannelsLastValues::off;
  if (std::string_view(v) == "1") return ChannelsLastValues::kernels;
  KILN_CHECK(std::string_view(v) == "all",
             "KILN_CHANNELS_LAST_VALUES={}: 0, 1 or all (all: dump's projection only)", v);
  return ChannelsLastValues::projected;
}

Graph channels_last_values(const Graph& g, const ChannelsLastTaken& takes) {
  Graph out = Rewriter(g, takes).run();
  return transposed_bytes(out, takes) > transposed_bytes(g, takes) ? g : out;
}

}  // namespace kiln
