// One walk over the nodes in order: each node is copied with its inputs cast to the dtypes its
// policy asks for and its output types inferred again.
#include "graph/passes/autocast.h"

#include <map>

#include "core/half.h"
#include "graph/op.h"
#include "graph/op_table.h"

namespace kiln {
namespace {

class Autocaster {
 public:
  Autocaster(const Graph& g, DType low)
      : g_(g), low_(low), remap_(g.nodes().size()), feeds_low_op_(g.nodes().size(), 0) {
    for (std::size_t id = g.nodes().size(); id-- > 0;) {
      const Node& n = g.nodes()[id];
      const bool low_op = n.op->autocast == AutocastPolicy::low;
      for (const ValueRef& in : n.inputs)
        if (low_op || feeds_low_op_[id]) feeds_low_op_[static_cast<std::size_t>(in.node)] = 1;
    }
  }

  Graph run() {
    for (std::int32_t id = 0; id < static_cast<std::int32_t>(g_.nodes().size()); ++id) rewrite(id);
    for (const auto& [name, ref] : g_.outputs())
      out_.output(name, out_.value(cast_to(mapped(ref), g_.type(ref).dtype)));
    for (const auto& [var, ref] : g_.assignments())
      out_.assign(var, out_.value(cast_to(mapped(ref), g_.type(ref).dtype)));
    return std::move(out_);
  }

 private:
  ValueRef mapped(ValueRef ref) const {
    return remap_[static_cast<std::size_t>(ref.node)][static_cast<std::size_t>(ref.index)];
  }

  // `ref` (of the new graph) as `dtype`: itself, a fill remade in `dtype`, or one cast.
  ValueRef cast_to(ValueRef ref, DType dtype) {
    const TensorType& t = out_.type(ref);
    if (t.dtype == dtype || !is_floating(t.dtype)) return ref;
    const auto key = std::make_pair(ref, dtype);
    if (auto it = casts_.find(key); it != casts_.end()) return it->second;
    const Node& producer = out_.node(ref.node);
    ValueRef made;
    if (producer.op->id == OpId::fill) {
      made = out_.fill(rounded(producer.attrs.real("value"), dtype), t.shape, dtype).ref();
    } else {
      Node n{.op = &op_def(OpId::cast), .inputs = {ref}};
      n.attrs = Attrs{{"dtype", std::string(dtype_name(dtype))}};
      n.outputs = {{t.shape, dtype}};
      made = out_.add_node(std::move(n));
    }
    casts_.emplace(key, made);
    return made;
  }

  static double rounded(double v, DType dtype) {
    if (dtype == DType::bf16) return static_cast<float>(bf16(v));
    if (dtype == DType::f16) return static_cast<float>(f16(v));
    return v;
  }

  // Whether a value of the original graph decides a `follow` op's dtype: it has the output's
  // size and is not a broadcast or a fill (a bias or a batch mean takes the activation's dtype).
  bool decides(ValueRef ref, const Shape& out_shape) const {
    const OpId op = g_.node(ref.node).op->id;
    return g_.type(ref).shape == out_shape && op != OpId::fill && op != OpId::broadcast_to;
  }

  DType follow_dtype(const Node& n) const {
    bool f32 = false, low = false, any_low = false;
    for (const ValueRef& in : n.inputs) {
      const DType d = out_.type(mapped(in)).dtype;
      any_low = any_low || d == low_;
      if (!decides(in, n.outputs[0].shape)) continue;
      f32 = f32 || d == DType::f32;
      low = low || d == low_;
    }
    if (f32) return DType::f32;
    return low || any_low ? low_ : DType::f32;
  }

  bool touches_f64(const Node& n) const {
    for (const ValueRef& in : n.inputs)
      if (g_.type(in).dtype == DType::f64) return true;
    for (const TensorType& t : n.outputs)
      if (t.dtype == DType::f64) return true;
    return false;
  }

  void rewrite(std::int32_t id) {
    const Node& n = g_.node(id);
    Node copy = n;
    for (ValueRef& in : copy.inputs) in = mapped(in);
    const AutocastPolicy policy = n.op->autocast;
    const bool kept = n.op->kind == OpKind::source || n.op->kind == OpKind::fused ||
                      policy == AutocastPolicy::keep || touches_f64(n);
    if (!kept) {
      DType target = DType::f32;
      if (policy == AutocastPolicy::low) target = low_;
      if ((policy == AutocastPolicy::follow || policy == AutocastPolicy::exact) &&
          feeds_low_op_[static_cast<std::size_t>(id)])
        target = follow_dtype(n);
      for (ValueRef& in : copy.inputs) in = cast_to(in, target);
    }
    if (n.op->kind != OpKind::source && n.op->infer) {
      std::vector<TensorType> types;
      for (const ValueRef& in : copy.inputs) types.push_back(out_.type(in));
      copy.outputs = n.op->infer(types, copy.attrs);
    }
    const ValueRef first = out_.add_node(std::move(copy));
    auto& refs = remap_[static_cast<std::size_t>(id)];
    for (std::int32_t k = 0; k < static_cast<std::int32_t>(n.outputs.size()); ++k)
      refs.push_back({first.node, k});
    if (!kept && policy == AutocastPolicy::exact && feeds_low_op_[static_cast<std::size_t>(id)])
      refs[0] = cast_to(refs[0], low_);
  }

  const Graph& g_;
  DType low_;
  Graph out_;
  std::vector<std::vector<ValueRef>> remap_;  // old (node, output) -> new value
  std::map<std::pair<ValueRef, DType>, ValueRef> casts_;
  // Whether a node's value reaches a GEMM, convolution or LSTM: the elementwise ops whose
  // values do not (the optimizer's arithmetic, the unscaling of gradients, the loss after the
  // last GEMM) compute in fp32, where there is no tensor core to feed.
  std::vector<char> feeds_low_op_;
};

}  // namespace

Graph autocast(const Graph& g, DType low) {
  KILN_CHECK(is_low_precision(low), "autocast: {} is not a 16-bit floating dtype", dtype_name(low));
  return Autocaster(g, low).run();
}

}  // namespace kiln
