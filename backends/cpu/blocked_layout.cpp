// The CPU program's blocked values (blocked_layout.h): a value is blocked when its writer can
// write it so, and every reader can read it so (directly, or through an alias of the same
// shape, detach, whose readers can).
#include "backends/cpu/blocked_layout.h"

#include <cstdlib>
#include <cstring>
#include <set>

#include "graph/op.h"

namespace kiln {
namespace {

bool turned_off() {
  const char* v = std::getenv("KILN_CPU_BLOCKED");
  return v != nullptr && std::strcmp(v, "0") == 0;
}

// What each node's CPU kernel can take blocked (KernelCall::blocked's bits).
std::vector<std::uint32_t> capabilities(const Graph& g) {
  std::vector<std::uint32_t> caps;
  for (const Node& n : g.nodes()) {
    std::vector<TensorType> in;
    for (const ValueRef& r : n.inputs) in.push_back(g.type(r));
    caps.push_back(n.op->cpu_blocked ? n.op->cpu_blocked(n, in)
                   : n.body          ? n.body->cpu_blocked(in)
                                     : 0);
  }
  return caps;
}

class Decider {
 public:
  explicit Decider(const Graph& g) : g_(g), caps_(capabilities(g)) {
    readers_.resize(g.nodes().size());
    for (std::size_t id = 0; id < g.nodes().size(); ++id) {
      const Node& n = g.nodes()[id];
      readers_[id].resize(n.outputs.size());
      for (std::size_t j = 0; j < n.inputs.size(); ++j) {
        const ValueRef& r = n.inputs[j];
        readers_[static_cast<std::size_t>(r.node)][static_cast<std::size_t>(r.index)].push_back(
            {id, j});
      }
    }
    for (const auto& [name, ref] : g.outputs()) pinned_.insert({ref.node, ref.index});
    for (const auto& [var, ref] : g.assignments()) pinned_.insert({ref.node, ref.index});
  }

  // Whether node `id`'s output `o` may be blocked: an f32 [B, C, H, W], C a multiple of 16,
  // that its writer can write so and every reader read so.
  bool writable(std::size_t id, std::size_t o) const {
    const TensorType& t = g_.nodes()[id].outputs[o];
    if (t.dtype != DType::f32 || t.shape.rank() != 4 || t.shape[1] % 16 != 0) return false;
    if (o >= 32 - kBlockedOutputs) return false;
    return (caps_[id] >> (kBlockedOutputs + o) & 1u) != 0 && readable(id, o);
  }

  bool readable(std::size_t id, std::size_t o) const {
    if (pinned_.count({static_cast<std::int32_t>(id), static_cast<std::int32_t>(o)})) return false;
    for (const auto& [reader, j] : readers_[id][o]) {
      const Node& r = g_.nodes()[reader];
      if (r.op->alias) {  // read in place: blocked where its readers can read it so
        if (r.outputs[0].shape != g_.nodes()[id].outputs[o].shape || !readable(reader, 0))
          return false;
        continue;
      }
      if (j >= kBlockedOutputs || (caps_[reader] >> j & 1u) == 0) return false;
    }
    return true;
  }

  // Marks node id's output o and the aliases that read it.
  void mark(std::size_t id, std::size_t o, BlockedLayout& layout) const {
    layout.stored[id][o] = 1;
    for (const auto& [reader, j] : readers_[id][o])
      if (g_.nodes()[reader].op->alias) mark(reader, 0, layout);
  }

 private:
  const Graph& g_;
  std::vector<std::uint32_t> caps_;
  std::vector<std::vector<std::vector<std::pair<std::size_t, std::size_t>>>> readers_;
  std::set<std::pair<std::int32_t, std::int32_t>> pinned_;
};

// KernelCall::blocked for node `id`: its blocked inputs and outputs.
std::uint32_t call_bits(const Graph& g, const BlockedLayout& layout, std::size_t id) {
  const Node& n = g.nodes()[id];
  std::uint32_t b = 0;
  for (std::size_t j = 0; j < n.inputs.size() && j < kBlockedOutputs; ++j)
    if (layout.stored[static_cast<std::size_t>(n.inputs[j].node)]
                     [static_cast<std::size_t>(n.inputs[j].index)])
      b |= 1u << j;
  for (std::size_t o = 0; o < n.outputs.size() && o < 32 - kBlockedOutputs; ++o)
    if (layout.stored[id][o]) b |= 1u << (kBlockedOutputs + o);
  return b;
}

}  // namespace

std::int64_t BlockedLayout::count() const {
  std::int64_t n = 0;
  for (const std::vector<char>& outputs : stored)
    for (const char s : outputs) n += s;
  return n;
}

BlockedLayout blocked_layout(const Graph& g) {
  BlockedLayout layout;
  for (const Node& n : g.nodes()) layout.stored.emplace_back(n.outputs.size(), 0);
  if (turned_off()) return layout;
  const Decider decide(g);
  for (std::size_t id = 0; id < g.nodes().size(); ++id) {
    if (g.nodes()[id].op->alias) continue;
    for (std::size_t o = 0; o < g.nodes()[id].outputs.size(); ++o)
      if (decide.writable(id, o)) decide.mark(id, o, layout);
  }
  for (std::size_t id = 0; id < g.nodes().size(); ++id)
    layout.calls.push_back(call_bits(g, layout, id));
  return layout;
}

}  // namespace kiln
