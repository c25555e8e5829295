// The GEMM epilogue pass: matches matmul -> (add bias [, relu]) groups, and f32 conv2d ->
// (add bias [, relu]) ones, and re-emits the graph with matmul_bias and conv2d_bias nodes in
// their place (the products they replace are not emitted).
#include "fusion/gemm_epilogues.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>

#include "fusion/fuse.h"
#include "fusion/fused_group.h"
#include "graph/op_table.h"
#include "graph/ops.h"

namespace kiln {
namespace {

struct Epilogue {
  int matmul = -1;
  ValueRef bias;
  bool relu = false;
  bool cast_bias = false;  // the group rounds the bias to the product's dtype first
};

// A product the pass takes: a 2-D matmul of a dtype the options take, or (options.convolutions)
// an f32 convolution's forward; its bias runs along axis 1 either way.
bool takes_product(const Graph& g, const Node& m, const GemmEpilogueOptions& options) {
  const DType dtype = m.outputs[0].dtype;
  if (m.op->id == OpId::conv2d) {  // its bias along axis 1: y stored NCHW
    if (!options.convolutions || dtype != DType::f32 || conv_y_channels_last(m.attrs)) return false;
    std::vector<TensorType> inputs;
    for (const ValueRef& r : m.inputs) inputs.push_back(g.type(r));
    return options.convolutions(m, inputs);
  }
  return m.op->id == OpId::matmul && m.outputs[0].shape.rank() == 2 &&
         (is_low_precision(dtype) ? options.low_products : options.f32_products);
}

// Whether input b of a group over `shape` reads Cout = shape[1] contiguous values along axis 1.
bool bias_along_channels(const FusedInput& b, const Shape& shape) {
  if (b.offset != 0 || b.type.shape.numel() != shape[1]) return false;
  for (std::size_t d = 0; d < shape.rank(); ++d)
    if (shape[d] > 1 && b.strides[d] != (d == 1 ? 1 : 0)) return false;
  return true;
}

// Whether group node `f` is `product + bias [, relu]` of the matmul or convolution it reads,
// the bias read along axis 1, as it is or (matmuls) cast to the product's dtype first
// (autocast without weight copies: the cast becomes a node of its own, so that both forms
// round the bias alike).
std::optional<Epilogue> match(const Graph& g, int f, const std::vector<int>& readers,
                              const GemmEpilogueOptions& options) {
  const FusedGroup* body = fused_group_of(g.node(f));
  if (body == nullptr || body->reduction || body->staged() || body->outputs.size() != 1 ||
      body->inputs.size() != 2 || body->instrs.empty() || body->instrs.size() > 3 ||
      body->shape.rank() < 2 || body->compute != DType::f32)
    return std::nullopt;
  const bool cast_bias = body->instrs[0].op->id == OpId::cast;
  const std::size_t at = cast_bias ? 1 : 0;  // the add
  if (cast_bias && body->instrs[0].args[0].kind != Operand::Kind::input) return std::nullopt;
  if (body->instrs.size() <= at) return std::nullopt;
  const FusedInstr& add = body->instrs[at];
  if (add.op->id != OpId::add || add.args.size() != 2) return std::nullopt;
  const bool relu = body->instrs.size() == at + 2;
  if (body->instrs.size() > at + 2 ||
      (relu && (body->instrs[at + 1].op->id != OpId::relu ||
                body->instrs[at + 1].args[0].kind != Operand::Kind::instr ||
                body->instrs[at + 1].args[0].index != static_cast<int>(at))))
    return std::nullopt;
  const Operand& out = body->outputs[0];
  if (out.kind != Operand::Kind::instr || out.index != static_cast<int>(body->instrs.size()) - 1)
    return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    const Operand& product_op = add.args[static_cast<std::size_t>(side)];
    const Operand& bias_op = add.args[static_cast<std::size_t>(1 - side)];
    if (product_op.kind != Operand::Kind::input) continue;
    const int bias = cast_bias ? body->instrs[0].args[0].index : bias_op.index;
    if (cast_bias ? bias_op.kind != Operand::Kind::instr || bias_op.index != 0
                  : bias_op.kind != Operand::Kind::input)
      continue;
    const FusedInput& p = body->inputs[static_cast<std::size_t>(product_op.index)];
    const FusedInput& b = body->inputs[static_cast<std::size_t>(bias)];
    const ValueRef pref = g.node(f).inputs[static_cast<std::size_t>(product_op.index)];
    const Node& m = g.node(pref.node);
    if (!takes_product(g, m, options) || m.outputs[0].shape != body->shape || p.offset != 0 ||
        !p.contiguous(body->shape) || readers[static_cast<std::size_t>(pref.node)] != 1)
      continue;
    const DType dtype = m.outputs[0].dtype;
    const bool conv = m.op->id == OpId::conv2d;  // its bias: the product's dtype, not cast
    if (add.dtype != dtype || body->operand_dtype(out) != dtype ||
        (cast_bias && (conv || body->instrs[0].dtype != dtype)) ||
        (!cast_bias && b.type.dtype != dtype && (conv || b.type.dtype != DType::f32)))
      continue;
    if (!bias_along_channels(b, body->shape)) continue;
    return Epilogue{pref.node, g.node(f).inputs[static_cast<std::size_t>(bias)], relu, cast_bias};
  }
  return std::nullopt;
}

bool turned_off() {
  const char* v = std::getenv("KILN_GEMM_EPILOGUES");
  return v != nullptr && std::strcmp(v, "0") == 0;
}

}  // namespace

bool every_convolution(const Node&, std::span<const TensorType>) { return true; }

Graph fuse_gemm_epilogues(const Graph& fused, FusionReport* report,
                          const GemmEpilogueOptions& options) {
  if (turned_off()) return fused;
  const int count = static_cast<int>(fused.nodes().size());
  // Readers of each matmul's product: nodes, graph outputs and assignments.
  std::vector<int> readers(static_cast<std::size_t>(count), 0);
  for (const Node& n : fused.nodes())
    for (const ValueRef& in : n.inputs) ++readers[static_cast<std::size_t>(in.node)];
  for (const auto& [name, ref] : fused.outputs()) ++readers[static_cast<std::size_t>(ref.node)];
  for (const auto& [var, ref] : fused.assignments()) ++readers[static_cast<std::size_t>(ref.node)];
  // The groups that become a product with its epilogue, and the products they take: those
  // (read by their group alone) are not emitted, so no dead product is left behind.
  std::vector<std::optional<Epilogue>> epilogues(static_cast<std::size_t>(count));
  std::vector<bool> taken(static_cast<std::size_t>(count), false);
  for (int id = 0; id < count; ++id)
    if ((epilogues[static_cast<std::size_t>(id)] = match(fused, id, readers, options)))
      taken[static_cast<std::size_t>(epilogues[static_cast<std::size_t>(id)]->matmul)] = true;
  Graph out;
  std::map<ValueRef, ValueRef> remap;
  std::vector<int> new_id(static_cast<std::size_t>(count), -1);  // groups that stay groups
  for (int id = 0; id < count; ++id) {
    if (taken[static_cast<std::size_t>(id)]) continue;
    const std::optional<Epilogue>& e = epilogues[static_cast<std::size_t>(id)];
    Node n = fused.node(id);
    if (e) {  // the group's node becomes the GEMM with its epilogue, where the group was
      const Node& m = fused.node(e->matmul);
      ValueRef bias = remap.at(e->bias);
      if (e->cast_bias) {  // the bias rounded once a step, as the copies of weights are
        const DType to = n.outputs[0].dtype;
        Node cast{.op = &op_def("cast"),
                  .inputs = {bias},
                  .attrs = {},
                  .outputs = {{fused.type(e->bias).shape, to}}};
        cast.attrs.set("dtype", std::string(dtype_name(to)));
        bias = out.add_node(std::move(cast));
      }
      Node gemm{.op = &op_def(m.op->id == OpId::conv2d ? "conv2d_bias" : "matmul_bias"),
                .inputs = {remap.at(m.inputs[0]), remap.at(m.inputs[1]), bias},
                .attrs = m.attrs,
                .outputs = n.outputs};
      gemm.attrs.set("relu", std::int64_t{e->relu});
      remap[{id, 0}] = out.add_node(std::move(gemm));
      continue;
    }
    for (ValueRef& in : n.inputs) in = remap.at(in);
    const ValueRef made = out.add_node(std::move(n));
    new_id[static_cast<std::size_t>(id)] = made.node;
    for (int i = 0; i < static_cast<int>(fused.node(id).outputs.size()); ++i)
      remap[{id, i}] = {made.node, i};
  }
  for (const auto& [name, ref] : fused.outputs()) out.output(name, out.value(remap.at(ref)));
  for (const auto& [var, ref] : fused.assignments()) out.assign(var, out.value(remap.at(ref)));
  if (report) {
    std::erase_if(report->groups, [&](FusionReport::Group& entry) {
      entry.fused_node = new_id[static_cast<std::size_t>(entry.fused_node)];
      return entry.fused_node < 0 || out.node(entry.fused_node).op->id != OpId::fused;
    });
  }
  return out;
}

}  // namespace kiln
