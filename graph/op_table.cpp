// Assembles the op table from the ops files and checks that every entry is complete.
#include "graph/op_table.h"

#include <array>
#include <unordered_map>

#include "graph/ops/register.h"

namespace kiln {
namespace {

struct Table {
  std::vector<OpDef> entries;
  std::vector<const OpDef*> pointers;
  std::array<const OpDef*, kOpIdCount> by_id{};
  std::unordered_map<std::string, const OpDef*> by_name;
};

constexpr const char* kOpNames[] = {
#define KILN_OP_ID_NAME(name) #name,
    KILN_OP_IDS(KILN_OP_ID_NAME)
#undef KILN_OP_ID_NAME
};

void check_entry(const OpDef& op) {
  KILN_ASSERT(op.kind == OpKind::source || op.kind == OpKind::fused || op.infer,
              "op {} has no type rule", op.name);
  KILN_ASSERT(op.kind == OpKind::source || op.alias || op.cpu, "op {} has no CPU kernel", op.name);
  KILN_ASSERT(op.kind != OpKind::elementwise || (op.loops.f32 && op.loops.f64) || op.alias,
              "elementwise op {} has no loops", op.name);
  KILN_ASSERT(op.kind != OpKind::reduction || (op.reduction.combine && op.reduction.fold_f32 &&
                                               !op.reduction.cuda_combine.empty()),
              "reduction {} has no reduction rule", op.name);
}

const Table& table() {
  static const Table t = [] {
    Table built;
    ops::register_source_ops(built.entries);
    ops::register_elementwise_ops(built.entries);
    ops::register_reduce_ops(built.entries);
    ops::register_layout_ops(built.entries);
    ops::register_slice_ops(built.entries);
    ops::register_gather_ops(built.entries);
    ops::register_matmul_ops(built.entries);
    ops::register_conv_ops(built.entries);
    ops::register_pool_ops(built.entries);
    ops::register_random_ops(built.entries);
    ops::register_collective_ops(built.entries);
    ops::register_recurrent_ops(built.entries);
    ops::register_cast_ops(built.entries);
    for (OpDef& op : built.entries) {
      op.name = op_id_name(op.id);
      check_entry(op);
      const OpDef*& slot = built.by_id[static_cast<std::size_t>(op.id)];
      KILN_ASSERT(slot == nullptr, "op {} is declared twice", op.name);
      slot = &op;
      built.by_name.emplace(op.name, &op);
      built.pointers.push_back(&op);
    }
    for (std::size_t i = 0; i < built.by_id.size(); ++i)
      KILN_ASSERT(built.by_id[i] != nullptr, "op {} has no entry", kOpNames[i]);
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

const OpDef& op_def(OpId id) { return *table().by_id[static_cast<std::size_t>(id)]; }

const std::vector<const OpDef*>& all_ops() { return table().pointers; }

const char* op_id_name(OpId id) {
  const auto i = static_cast<std::size_t>(id);
  KILN_ASSERT(i < std::size(kOpNames), "op id {} out of range", i);
  return kOpNames[i];
}

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
