// The scan and the message of --check-numerics.
#include "backends/numerics.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <limits>

#include "core/dispatch.h"
#include "fusion/fused_group.h"
#include "graph/op.h"

namespace kiln {
namespace {

// The op a node stands for: its own, or a single-op fused group's member.
std::string op_label(const Node& n) {
  if (!n.body) return n.op->name;
  const auto* group = dynamic_cast<const FusedGroup*>(n.body.get());
  if (group && group->instrs.size() == 1 && !group->reduction) return group->instrs[0].op->name;
  if (group && group->instrs.empty() && group->reduction) return group->reduction->op->name;
  return "fused group " + n.body->summary();
}

// First non-finite element, or -1.
std::int64_t first_non_finite(const Tensor& t) {
  if (!is_floating(t.dtype())) return -1;
  return visit_floating(t.dtype(), "check_numerics", [&](auto zero) -> std::int64_t {
    using T = decltype(zero);
    const T* p = t.data<T>();
    for (std::int64_t i = 0; i < t.numel(); ++i)
      if (!std::isfinite(p[i])) return i;
    return -1;
  });
}

std::string range_of(const Tensor& t) {
  if (!is_floating(t.dtype()) || t.numel() == 0) return dtype_name(t.dtype()).data();
  double low = std::numeric_limits<double>::infinity(), high = -low;
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double v = t.at(i);
    if (!std::isfinite(v)) {
      ++bad;
      continue;
    }
    low = std::min(low, v);
    high = std::max(high, v);
  }
  return fmt::format("range [{:.6g}, {:.6g}]{}", low, high,
                     bad ? fmt::format(", {} non-finite", bad) : "");
}

}  // namespace

void check_numerics(const Graph& g, std::int32_t id, std::span<const Tensor> inputs,
                    std::span<const Tensor> outputs, std::int64_t run) {
  for (std::size_t o = 0; o < outputs.size(); ++o) {
    const std::int64_t at = first_non_finite(outputs[o]);
    if (at < 0) continue;
    const Node& n = g.node(id);
    std::string in;
    for (std::size_t i = 0; i < inputs.size(); ++i)
      in +=
          fmt::format("; input {} (%{}, {}{}): {}", i, n.inputs[i].node,
                      dtype_name(inputs[i].dtype()), inputs[i].shape().str(), range_of(inputs[i]));
    throw Error(fmt::format(
        "check-numerics: run {}: op '{}' (%{}) produced {} at element {} of its output {} ({}{}){}",
        run, op_label(n), id, outputs[o].at(at), at, o, dtype_name(outputs[o].dtype()),
        outputs[o].shape().str(), in));
  }
}

bool check_numerics_from_environment() {
  const char* v = std::getenv("KILN_CHECK_NUMERICS");
  if (v == nullptr) return false;
  const std::string value = v;
  for (const char* on : {"1", "true", "yes", "on"})
    if (value == on) return true;
  for (const char* off : {"", "0", "false", "no", "off"})
    if (value == off) return false;
  throw Error(fmt::format(
      "KILN_CHECK_NUMERICS='{}' is not a switch (1, true, yes, on; or 0, false, no, off)", value));
}

}  // namespace kiln
