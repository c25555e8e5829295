// The GEMM epilogue pass: matches matmul -> (add bias [, relu]) groups and re-emits the graph
// with matmul_bias nodes in their place (the matmuls they replace become dead code).
#include "fusion/gemm_epilogues.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>

#include "fusion/fused_group.h"
#include "graph/op_table.h"

namespace kiln {
namespace {

const FusedGroup* group_of(const Node& n) {
  return n.body && n.op->kind == OpKind::fused ? dynamic_cast<const FusedGroup*>(n.body.get())
                                               : nullptr;
}

struct Epilogue {
  int matmul = -1;
  ValueRef bias;
  bool relu = false;
};

// Whether group node `f` is `product + bias [, relu]` of the matmul it reads.
std::optional<Epilogue> match(const Graph& g, int f, const std::vector<int>& readers) {
  const FusedGroup* body = group_of(g.node(f));
  if (body == nullptr || body->reduction || body->staged() || body->outputs.size() != 1 ||
      body->inputs.size() != 2 || body->instrs.empty() || body->instrs.size() > 2 ||
      body->shape.rank() != 2 || body->compute != DType::f32)
    return std::nullopt;
  const FusedInstr& add = body->instrs[0];
  if (add.op->id != OpId::add || add.args.size() != 2 || add.args[0].kind != Operand::Kind::input ||
      add.args[1].kind != Operand::Kind::input)
    return std::nullopt;
  const bool relu = body->instrs.size() == 2;
  if (relu &&
      (body->instrs[1].op->id != OpId::relu ||
       body->instrs[1].args[0].kind != Operand::Kind::instr || body->instrs[1].args[0].index != 0))
    return std::nullopt;
  const Operand& out = body->outputs[0];
  if (out.kind != Operand::Kind::instr || out.index != static_cast<int>(body->instrs.size()) - 1)
    return std::nullopt;
  const std::int64_t n = body->shape[1];
  for (int side = 0; side < 2; ++side) {
    const int product = add.args[static_cast<std::size_t>(side)].index;
    const int bias = add.args[static_cast<std::size_t>(1 - side)].index;
    const FusedInput& p = body->inputs[static_cast<std::size_t>(product)];
    const FusedInput& b = body->inputs[static_cast<std::size_t>(bias)];
    const ValueRef pref = g.node(f).inputs[static_cast<std::size_t>(product)];
    const Node& m = g.node(pref.node);
    if (m.op->id != OpId::matmul || m.outputs[0].shape != body->shape || p.offset != 0 ||
        !p.contiguous(body->shape) || readers[static_cast<std::size_t>(pref.node)] != 1)
      continue;
    const DType dtype = m.outputs[0].dtype;
    if (add.dtype != dtype || body->operand_dtype(out) != dtype ||
        (b.type.dtype != dtype && b.type.dtype != DType::f32))
      continue;
    if (b.offset != 0 || b.type.shape.numel() != n || b.strides[0] != 0 ||
        (n > 1 && b.strides[1] != 1))
      continue;
    return Epilogue{pref.node, g.node(f).inputs[static_cast<std::size_t>(bias)], relu};
  }
  return std::nullopt;
}

bool turned_off() {
  const char* v = std::getenv("KILN_GEMM_EPILOGUES");
  return v != nullptr && std::strcmp(v, "0") == 0;
}

}  // namespace

Graph fuse_gemm_epilogues(const Graph& fused) {
  if (turned_off()) return fused;
  const int count = static_cast<int>(fused.nodes().size());
  // Readers of each matmul's product: nodes, graph outputs and assignments.
  std::vector<int> readers(static_cast<std::size_t>(count), 0);
  for (const Node& n : fused.nodes())
    for (const ValueRef& in : n.inputs) ++readers[static_cast<std::size_t>(in.node)];
  for (const auto& [name, ref] : fused.outputs()) ++readers[static_cast<std::size_t>(ref.node)];
  for (const auto& [var, ref] : fused.assignments()) ++readers[static_cast<std::size_t>(ref.node)];
  Graph out;
  std::map<ValueRef, ValueRef> remap;
  for (int id = 0; id < count; ++id) {
    const std::optional<Epilogue> e = match(fused, id, readers);
    Node n = fused.node(id);
    if (e) {  // the group's node becomes the GEMM with its epilogue, where the group was
      const Node& m = fused.node(e->matmul);
      Node gemm{.op = &op_def("matmul_bias"),
                .inputs = {remap.at(m.inputs[0]), remap.at(m.inputs[1]), remap.at(e->bias)},
                .attrs = m.attrs,
                .outputs = n.outputs};
      gemm.attrs.set("relu", std::int64_t{e->relu});
      remap[{id, 0}] = out.add_node(std::move(gemm));
      continue;
    }
    for (ValueRef& in : n.inputs) in = remap.at(in);
    const ValueRef made = out.add_node(std::move(n));
    for (int i = 0; i < static_cast<int>(fused.node(id).outputs.size()); ++i)
      remap[{id, i}] = {made.node, i};
  }
  for (const auto& [name, ref] : fused.outputs()) out.output(name, out.value(remap.at(ref)));
  for (const auto& [var, ref] : fused.assignments()) out.assign(var, out.value(remap.at(ref)));
  return out;
}

}  // namespace kiln
