// Type rule, summary and traffic accounting of a fused group.
#include "fusion/fused_group.h"

#include <fmt/format.h>

namespace kiln {
namespace {

std::int64_t type_bytes(const TensorType& t) {
  return t.shape.numel() * static_cast<std::int64_t>(dtype_size(t.dtype));
}

}  // namespace

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
  std::vector<TensorType> out(outputs.size(), TensorType{shape, dtype});
  if (reduction) out.push_back(reduction->type);
  return out;
}

std::string FusedGroup::summary() const {
  std::string ops;
  for (std::size_t i = 0; i < instrs.size() && i < 6; ++i)
    ops += (i ? ", " : "") + instrs[i].op->name;
  if (instrs.size() > 6) ops += ", ...";
  if (reduction) ops += (ops.empty() ? "" : ", ") + reduction->op->name;
  return fmt::format("{} ops ({}) over {}", instrs.size() + (reduction ? 1 : 0), ops, shape.str());
}

std::int64_t FusedGroup::bytes_read() const {
  std::int64_t total = 0;
  for (const FusedInput& in : inputs)
    total += in.elements_read(shape) * static_cast<std::int64_t>(dtype_size(in.type.dtype));
  return total;
}

std::int64_t FusedGroup::bytes_written() const {
  std::int64_t total = static_cast<std::int64_t>(outputs.size()) * type_bytes({shape, dtype});
  if (reduction) total += type_bytes(reduction->type);
  return total;
}

std::int64_t FusedGroup::unfused_bytes() const {
  const std::int64_t full = type_bytes({shape, dtype});
  std::int64_t total = 0;
  for (const FusedInstr& instr : instrs) {
    total += full;  // its output
    for (const Operand& a : instr.args) {
      if (a.kind == Operand::Kind::instr) total += full;
      if (a.kind == Operand::Kind::input) {
        const FusedInput& in = inputs[static_cast<std::size_t>(a.index)];
        total += in.elements_read(shape) * static_cast<std::int64_t>(dtype_size(in.type.dtype));
      }
    }
  }
  if (reduction) total += full + type_bytes(reduction->type);
  return total;
}

}  // namespace kiln
