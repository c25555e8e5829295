// Text form of a graph, one node per line: "%7 = conv2d(%3, %5) stride=1 padding=1 : f32[64, 32,
// 28, 28]".
#include <fmt/format.h>

#include "graph/graph.h"
#include "graph/op.h"

namespace kiln {
namespace {

std::string ref_name(ValueRef ref) {
  return ref.index ? fmt::format("%{}.{}", ref.node, ref.index) : fmt::format("%{}", ref.node);
}

std::string node_line(std::int32_t id, const Node& n) {
  std::string args;
  for (const ValueRef& in : n.inputs) args += (args.empty() ? "" : ", ") + ref_name(in);
  std::string types;
  for (const TensorType& t : n.outputs) types += (types.empty() ? "" : ", ") + t.str();
  std::string extra = n.body ? n.body->summary() : n.attrs.str();
  if (!n.name.empty()) extra = fmt::format("\"{}\"{}{}", n.name, extra.empty() ? "" : " ", extra);
  return fmt::format("%{} = {}({}){}{} : {}\n", id, n.op->name, args, extra.empty() ? "" : " ",
                     extra, types);
}

}  // namespace

std::string Graph::str() const {
  std::string out;
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    out += node_line(static_cast<std::int32_t>(i), nodes_[i]);
  for (const auto& [name, ref] : outputs_)
    out += fmt::format("output \"{}\" = {}\n", name, ref_name(ref));
  for (const auto& [var, ref] : assignments_)
    out += fmt::format("assign \"{}\" <- {}\n", var->name, ref_name(ref));
  return out;
}

}  // namespace kiln
