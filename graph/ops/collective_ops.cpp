// all_reduce_mean: the one op of data parallelism. Its inputs (gradients of one bucket) are
// averaged over the ranks of the collective group named by its "group" attribute; the
// CPU kernel copies and averages through the group's host path, the CUDA launcher through
// its device path (NCCL) on the step's stream.
#include <cstring>

#include "graph/collective.h"
#include "graph/ops.h"
#include "graph/ops/register.h"

namespace kiln {
namespace {

std::vector<TensorType> infer_all_reduce(std::span<const TensorType> in, const Attrs&) {
  KILN_CHECK(!in.empty(), "all_reduce_mean: needs at least one input");
  for (std::size_t i = 0; i < in.size(); ++i)
    KILN_CHECK(is_floating(in[i].dtype), "all_reduce_mean: input {} is {}, not floating", i,
               in[i].str());
  return {in.begin(), in.end()};
}

void all_reduce_kernel(const KernelCall& call) {
  for (std::size_t i = 0; i < call.inputs.size(); ++i)
    if (call.outputs[i].nbytes() > 0)
      std::memcpy(call.outputs[i].raw(), call.inputs[i].raw(), call.outputs[i].nbytes());
  collective(static_cast<int>(call.node.attrs.integer("group"))).all_reduce_mean_host(call.outputs);
}

// Every rank's output is the mean of every rank's input, so the gradient of an input is
// the mean over the ranks of the gradients arriving at the outputs.
std::vector<Value> all_reduce_grad(const GradContext& c) {
  std::vector<Value> grads;
  for (std::size_t i = 0; i < c.inputs.size(); ++i)
    grads.push_back(c.output_grads[i].valid()
                        ? c.output_grads[i]
                        : c.graph.fill(0.0, c.inputs[i].shape(), c.inputs[i].dtype()));
  return all_reduce_mean(grads, static_cast<int>(c.node.attrs.integer("group")));
}

}  // namespace

void ops::register_collective_ops(std::vector<OpDef>& table) {
  OpDef op{.id = OpId::all_reduce_mean, .kind = OpKind::other, .arity = -1, .attrs = {"group"}};
  op.infer = infer_all_reduce;
  op.grad = all_reduce_grad;
  op.cpu = all_reduce_kernel;
  op.autocast = AutocastPolicy::keep;
  table.push_back(std::move(op));
}

std::vector<Value> all_reduce_mean(const std::vector<Value>& values, int group) {
  KILN_CHECK(!values.empty(), "all_reduce_mean: needs at least one value");
  collective(group);  // an unknown group is an error where the graph is built
  return values.front().graph().apply(OpId::all_reduce_mean, values,
                                      {{"group", static_cast<std::int64_t>(group)}});
}

}  // namespace kiln
