// Source ops (values produced outside kernels) and the type checks ops files share.
#include "graph/ops/register.h"

namespace kiln {

void ops::register_source_ops(std::vector<OpDef>& table) {
  // Fed by the caller at every run, by name.
  table.push_back(OpDef{.id = OpId::input, .kind = OpKind::source, .attrs = {}});
  // Persistent state read from (and updated into) a Variable.
  table.push_back(OpDef{.id = OpId::variable, .kind = OpKind::source});
  // A tensor of one repeated value (attribute "value"); scalars fold into fused kernels.
  table.push_back(OpDef{.id = OpId::fill, .kind = OpKind::source, .attrs = {"value"}});
  // A tensor held by the node itself.
  table.push_back(OpDef{.id = OpId::tensor_constant, .kind = OpKind::source});
  // A fused group (made by fusion/fuse after autograd, so it needs no gradient): the
  // node's body holds its type rule and its code.
  OpDef fused{.id = OpId::fused, .kind = OpKind::fused, .arity = -1};
  fused.cpu = [](const KernelCall& call) {
    KILN_ASSERT(call.node.body != nullptr, "fused node without a body");
    call.node.body->run_cpu(call);
  };
  table.push_back(std::move(fused));
}

void ops::check_floating_inputs(const char* op, std::span<const TensorType> inputs) {
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    KILN_CHECK(is_floating(inputs[i].dtype), "{}: input {} is {} but a floating dtype is required",
               op, i, inputs[i].str());
    KILN_CHECK(inputs[i].dtype == inputs[0].dtype,
               "{}: input {} is {} but input 0 is {} (dtypes must match)", op, i, inputs[i].str(),
               inputs[0].str());
  }
}

void ops::check_rank(const char* op, const char* what, const TensorType& type, std::size_t rank) {
  KILN_CHECK(type.shape.rank() == rank, "{}: {} must have rank {} but is {}", op, what, rank,
             type.str());
}

}  // namespace kiln
