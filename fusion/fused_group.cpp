// Type rule, summary and traffic accounting of a fused group.
#include "fusion/fused_group.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace kiln {
namespace {

std::int64_t type_bytes(const TensorType& t) {
  return t.shape.numel() * static_cast<std::int64_t>(dtype_size(t.dtype));
}

}  // namespace

const FusedGroup* fused_group_of(const Node& n) {
  return n.body && n.op->kind == OpKind::fused ? dynamic_cast<const FusedGroup*>(n.body.get())
                                               : nullptr;
}

std::vector<std::int64_t> row_strides(const Shape& shape, const std::vector<std::int64_t>& axes) {
  std::vector<std::int64_t> strides(shape.rank(), 0);
  std::int64_t step = 1;
  for (std::size_t d = shape.rank(); d-- > 0;)
    if (std::find(axes.begin(), axes.end(), static_cast<std::int64_t>(d)) == axes.end()) {
      strides[d] = step;
      step *= shape[d];
    }
  return strides;
}

bool FusedInput::contiguous(const Shape& group_shape) const {
  const std::vector<std::int64_t> dense = group_shape.strides();
  for (std::size_t d = 0; d < group_shape.rank(); ++d)
    if (group_shape[d] > 1 && strides[d] != dense[d]) return false;
  return true;
}

bool FusedInput::scalar() const {
  for (std::int64_t s : strides)
    if (s != 0) return false;
  return true;
}

std::int64_t FusedInput::elements_read(const Shape& group_shape) const {
  std::int64_t n = 1;
  for (std::size_t d = 0; d < group_shape.rank(); ++d)
    if (strides[d] != 0) n *= group_shape[d];
  return n;
}

std::vector<TensorType> FusedGroup::infer(std::span<const TensorType> in) const {
  KILN_ASSERT(in.size() == inputs.size(), "fused group with {} inputs given {}", inputs.size(),
              in.size());
  for (std::size_t i = 0; i < in.size(); ++i)
    KILN_ASSERT(in[i] == inputs[i].type, "fused input {} is {} but the group reads {}", i,
                in[i].str(), inputs[i].type.str());
  std::vector<TensorType> out;
  for (std::size_t o = 0; o < outputs.size(); ++o)
    out.push_back({output_channels_last(o) ? Shape{shape[0], shape[2], shape[3], shape[1]} : shape,
                   operand_dtype(outputs[o])});
  for (const FusedReduction* r : reductions()) out.push_back(r->type);
  for (const RowOutput& w : row_outputs) out.push_back(w.type);
  return out;
}

bool FusedGroup::any_channels_last() const {
  return std::any_of(channels_last.begin(), channels_last.end(), [](char c) { return c != 0; });
}

bool FusedGroup::staged() const {
  if (stage_count() > 1 || !row_outputs.empty()) return true;
  auto reduced = [](const Operand& o) { return o.kind == Operand::Kind::reduced; };
  for (const FusedInstr& instr : instrs)
    if (std::any_of(instr.args.begin(), instr.args.end(), reduced)) return true;
  return std::any_of(outputs.begin(), outputs.end(), reduced);
}

int FusedGroup::stage_count() const {
  int stages = 0;
  for (const FusedReduction* r : reductions()) stages = std::max(stages, r->stage + 1);
  return stages;
}

std::vector<const FusedReduction*> FusedGroup::reductions() const {
  std::vector<const FusedReduction*> all;
  if (!reduction) return all;
  all.push_back(&*reduction);
  for (const FusedReduction& r : more_reductions) all.push_back(&r);
  return all;
}

std::vector<char> FusedGroup::instrs_read_by(std::vector<Operand> values) const {
  std::vector<char> mark(instrs.size(), 0);
  while (!values.empty()) {
    const Operand op = values.back();
    values.pop_back();
    if (op.kind != Operand::Kind::instr || mark[static_cast<std::size_t>(op.index)]) continue;
    mark[static_cast<std::size_t>(op.index)] = 1;
    for (const Operand& a : instrs[static_cast<std::size_t>(op.index)].args) values.push_back(a);
  }
  return mark;
}

std::vector<char> FusedGroup::stage_instrs(int stage) const {
  std::vector<Operand> values;
  for (const FusedReduction* r : reductions())
    if (r->stage == stage) values.push_back(r->value);
  return instrs_read_by(std::move(values));
}

std::vector<char> FusedGroup::row_output_instrs() const {
  std::vector<Operand> values;
  for (const RowOutput& w : row_outputs) values.push_back(w.value);
  return instrs_read_by(std::move(values));
}

bool FusedGroup::rows_finish_only() const {
  if (row_outputs.empty() || stage_count() != 1) return false;
  // Instructions are in order: each one's operands come before it.
  std::vector<char> after(instrs.size(), 0);  // reads a reduced value, directly or not
  auto reads_reduced = [&](const Operand& o) {
    return o.kind == Operand::Kind::reduced ||
           (o.kind == Operand::Kind::instr && after[static_cast<std::size_t>(o.index)]);
  };
  for (std::size_t i = 0; i < instrs.size(); ++i)
    after[i] = std::any_of(instrs[i].args.begin(), instrs[i].args.end(), reads_reduced);
  for (const Operand& o : outputs)
    if (reads_reduced(o)) return false;
  for (const FusedReduction* r : reductions())
    if (reads_reduced(r->value)) return false;
  return true;
}

DType FusedGroup::operand_dtype(const Operand& op) const {
  switch (op.kind) {
    case Operand::Kind::input:
      return inputs[static_cast<std::size_t>(op.index)].type.dtype;
    case Operand::Kind::instr:
      return instrs[static_cast<std::size_t>(op.index)].dtype;
    case Operand::Kind::reduced:
      return reductions()[static_cast<std::size_t>(op.index)]->type.dtype;
    case Operand::Kind::constant:
      break;
  }
  return compute;
}

bool FusedGroup::low_precision() const {
  for (const FusedInput& in : inputs)
    if (is_low_precision(in.type.dtype)) return true;
  for (const Operand& o : outputs)
    if (is_low_precision(operand_dtype(o))) return true;
  for (const FusedReduction* r : reductions())
    if (is_low_precision(r->type.dtype)) return true;
  for (const RowOutput& w : row_outputs)
    if (is_low_precision(w.type.dtype)) return true;
  return false;
}

std::string FusedGroup::summary() const {
  std::string ops;
  for (std::size_t i = 0; i < instrs.size() && i < 6; ++i)
    ops += (i ? ", " : "") + instrs[i].op->name;
  if (instrs.size() > 6) ops += ", ...";
  for (const FusedReduction* r : reductions()) ops += (ops.empty() ? "" : ", ") + r->op->name;
  std::string stored;  // the 16-bit dtypes it loads or stores, for groups that have any
  for (DType d : {DType::bf16, DType::f16}) {
    bool uses = false;
    for (const FusedReduction* r : reductions()) uses = uses || r->type.dtype == d;
    for (const FusedInput& in : inputs) uses = uses || in.type.dtype == d;
    for (const Operand& o : outputs) uses = uses || operand_dtype(o) == d;
    if (uses) stored += std::string(stored.empty() ? "" : "+") + std::string(dtype_name(d));
  }
  const std::string stages =
      rows_finish_only() ? fmt::format(", {} row outputs", row_outputs.size())
      : staged() ? fmt::format(", {} passes a row", stage_count() + (outputs.empty() ? 0 : 1))
                 : "";
  const auto last =
      std::count_if(channels_last.begin(), channels_last.end(), [](char c) { return c != 0; });
  const std::string layout =
      last == 0 ? "" : fmt::format(", {} output{} channels-last", last, last > 1 ? "s" : "");
  return fmt::format("{} ops ({}) over {}{}{}{}", instrs.size() + reductions().size(), ops,
                     shape.str(), stages, layout,
                     stored.empty() ? "" : fmt::format(", {} storage, f32 math", stored));
}

std::int64_t FusedGroup::bytes_read() const {
  std::int64_t total = 0;
  for (const FusedInput& in : inputs)
    total += in.elements_read(shape) * static_cast<std::int64_t>(dtype_size(in.type.dtype));
  return total;
}

std::int64_t FusedGroup::bytes_written() const {
  std::int64_t total = 0;
  for (const Operand& o : outputs) total += type_bytes({shape, operand_dtype(o)});
  for (const FusedReduction* r : reductions()) total += type_bytes(r->type);
  for (const RowOutput& w : row_outputs) total += type_bytes(w.type);
  return total;
}

std::int64_t FusedGroup::unfused_bytes() const {
  std::int64_t total = 0;
  for (const FusedInstr& instr : instrs) {
    total += type_bytes({shape, instr.dtype});  // its output
    for (const Operand& a : instr.args) {
      if (a.kind == Operand::Kind::instr) total += type_bytes({shape, operand_dtype(a)});
      if (a.kind == Operand::Kind::reduced)
        total += type_bytes(reductions()[static_cast<std::size_t>(a.index)]->type);
      if (a.kind == Operand::Kind::input) {
        const FusedInput& in = inputs[static_cast<std::size_t>(a.index)];
        total += in.elements_read(shape) * static_cast<std::int64_t>(dtype_size(in.type.dtype));
      }
    }
  }
  for (const FusedReduction* r : reductions())
    total += type_bytes({shape, operand_dtype(r->value)}) + type_bytes(r->type);
  return total;
}

}  // namespace kiln
