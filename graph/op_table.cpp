// Assembles the op table from the ops files and checks that every entry is complete.
#include "graph/op_table.h"

#include <unordered_map>

#include "graph/ops/register.h"

namespace kiln {
namespace {

struct Table {
  std::vector<OpDef> entries;
  std::vector<const OpDef*> pointers;
  std::unordered_map<std::string, const OpDef*> by_name;
};

void check_entry(const OpDef& op) {
  KILN_ASSERT(!op.name.empty(), "op without a name");
  KILN_ASSERT(op.kind == OpKind::source || op.kind == OpKind::fused || op.infer,
              "op {} has no type rule", op.name);
  KILN_ASSERT(op.kind == OpKind::source || op.alias || op.cpu, "op {} has no CPU kernel", op.name);
  KILN_ASSERT(op.kind != OpKind::elementwise || (op.loops.f32 && op.loops.f64) || op.alias,
              "elementwise op {} has no loops", op.name);
}

const Table& table() {
  static const Table t = [] {
    Table built;
    ops::register_source_ops(built.entries);
    ops::register_elementwise_ops(built.entries);
    ops::register_reduce_ops(built.entries);
    ops::register_layout_ops(built.entries);
    ops::register_slice_ops(built.entries);
    ops::register_matmul_ops(built.entries);
    ops::register_conv_ops(built.entries);
    ops::register_pool_ops(built.entries);
    ops::register_random_ops(built.entries);
    ops::register_collective_ops(built.entries);
    ops::register_recurrent_ops(built.entries);
    for (const OpDef& op : built.entries) {
      check_entry(op);
      KILN_ASSERT(built.by_name.emplace(op.name, &op).second, "op {} is declared twice", op.name);
      built.pointers.push_back(&op);
    }
    return built;
  }();
  return t;
}

}  // namespace

const OpDef& op_def(const std::string& name) {
  const auto& by_name = table().by_name;
  auto it = by_name.find(name);
  KILN_CHECK(it != by_name.end(), "unknown op '{}'", name);
  return *it->second;
}

const std::vector<const OpDef*>& all_ops() { return table().pointers; }

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::source:
      return "source";
    case OpKind::elementwise:
      return "elementwise";
    case OpKind::reduction:
      return "reduction";
    case OpKind::layout:
      return "layout";
    case OpKind::matmul:
      return "matmul";
    case OpKind::conv:
      return "conv";
    case OpKind::pool:
      return "pool";
    case OpKind::fused:
      return "fused";
    case OpKind::other:
      return "other";
  }
  return "?";
}

}  // namespace kiln
