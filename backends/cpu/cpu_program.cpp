// CpuProgram: feeds checked by name, shape and dtype; sources bound; kernels run in node
// order into planned buffers; outputs copied out; assignments applied after the step.
#include "backends/cpu/cpu_program.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstdlib>
#include <string_view>

#include "backends/cpu/blocked_layout.h"
#include "backends/cpu/low_precision.h"
#include "backends/feeds.h"
#include "backends/numerics.h"
#include "backends/plan.h"
#include "backends/trace_writer.h"
#include "graph/kernels/conv_cpu.h"
#include "graph/op.h"

namespace kiln {
namespace {

class CpuProgram final : public Program {
 public:
  CpuProgram(const Graph& compiled, bool check_numerics, bool deterministic)
      : graph_(compiled),
        plan_(plan_memory(graph_)),
        profile_(std::getenv("KILN_PROFILE") != nullptr),
        profile_groups_(profile_ && std::string_view(std::getenv("KILN_PROFILE")) == "groups"),
        check_numerics_(check_numerics),
        deterministic_(deterministic),
        // kiln's reproducible convolutions run NCHW; so do the checked runs' unfused ops.
        blocked_(deterministic || check_numerics ? BlockedLayout{} : blocked_layout(graph_)) {
    for (const Node& n : graph_.nodes()) {
      if (n.op->id == OpId::fill)
        fills_.push_back(
            Tensor::full(n.outputs[0].shape, n.attrs.real("value"), n.outputs[0].dtype));
      if (n.op->id == OpId::variable && n.variable->copy_of) copies_.push_back({n.variable, {}});
    }
  }

  ~CpuProgram() override { print_profile(); }

  Outputs run(const std::vector<Feed>& feeds) override;
  const Graph& graph() const override { return graph_; }
  Device device() const override { return Device::cpu(); }
  std::size_t planned_bytes() const override { return plan_.arena_bytes; }
  void trace_next_run(const std::string& path) override { trace_path_ = path; }

 private:
  Tensor planned_output(std::int32_t slot, const TensorType& type);
  void refresh_copies();

  Graph graph_;
  MemoryPlan plan_;
  std::vector<Tensor> fills_;       // in node order
  std::shared_ptr<Storage> arena_;  // the memory plan's, allocated on the first run
  // KILN_PROFILE=1: wall time per op over all runs but the first (which includes oneDNN's
  // JIT compilation), printed when the program is destroyed;
  // KILN_PROFILE=groups: each fused group on its own line (its ops and shape), every other
  // op on a line per input shapes and attributes.
  bool profile_;
  bool profile_groups_;
  // ... and an op whose kernel depends on the call (a convolution: oneDNN's Winograd or
  // direct kernel, or kiln's own) names it after its attributes.
  // ... and its values stored blocked (backends/cpu/blocked_layout.h), e.g. "[blocked: in 0, out]".
  std::string profile_key(const Node& n, const KernelCall& call) const {
    if (!profile_groups_) return n.op->name;
    std::string key = n.body ? n.body->summary() : n.op->name;
    if (!n.body) {
      for (const ValueRef& in : n.inputs) key += " " + graph_.type(in).shape.str();
      const std::string attrs = n.attrs.str();
      if (!attrs.empty()) key += " {" + attrs + "}";
      if (n.op->cpu_kernel_name) key += " " + n.op->cpu_kernel_name(call);
    }
    std::vector<std::string> blocked;
    for (std::size_t j = 0; j < n.inputs.size() && j < kBlockedOutputs; ++j)
      if (call.blocked >> j & 1u) blocked.push_back(fmt::format("in {}", j));
    for (std::size_t o = 0; o < n.outputs.size() && o < 32 - kBlockedOutputs; ++o)
      if (call.blocked >> (kBlockedOutputs + o) & 1u)
        blocked.push_back(n.outputs.size() == 1 ? "out" : fmt::format("out {}", o));
    if (!blocked.empty()) key += fmt::format(" [blocked: {}]", fmt::join(blocked, ", "));
    return key;
  }
  std::string trace_path_;  // non-empty: the next run writes a trace here
  bool check_numerics_;
  bool deterministic_;
  BlockedLayout blocked_;
  std::int64_t runs_ = 0;
  std::map<std::string, std::pair<double, std::int64_t>> op_seconds_;
  // Low-precision weight copies (passes/weight_copies.h) and the storage of the weight each
  // was last rounded from: a weight written from outside has new storage.
  struct Copy {
    VariablePtr copy;
    std::shared_ptr<Storage> rounded_from;
  };
  std::vector<Copy> copies_;
  void print_profile() const;
};

// A copy equals its weight rounded at the start of every step: the step's own update writes
// both; a weight assigned from outside (a loaded checkpoint) is rounded again here.
void CpuProgram::refresh_copies() {
  for (Copy& c : copies_) {
    const Tensor& weight = c.copy->copy_of->value;
    if (weight.storage() == c.rounded_from) continue;
    KILN_CHECK(weight.device().is_cpu(), "run: variable '{}' is on {}, not the CPU",
               c.copy->copy_of->name, weight.device().str());
    c.copy->value = weight.to(c.copy->value.dtype());
    c.rounded_from = weight.storage();
  }
}

void CpuProgram::print_profile() const {
  if (!profile_ || op_seconds_.empty()) return;
  double total = 0;
  for (const auto& [name, entry] : op_seconds_) total += entry.first;
  std::vector<std::pair<double, std::string>> rows;
  for (const auto& [name, entry] : op_seconds_) rows.emplace_back(entry.first, name);
  std::sort(rows.rbegin(), rows.rend());
  fmt::print(stderr, "kiln CPU profile ({} nodes, {:.1f} ms in kernels):\n", graph_.nodes().size(),
             total * 1e3);
  for (const auto& [seconds, name] : rows)
    fmt::print(stderr, "  {:<22} {:>9.2f} ms {:>5.1f}%  ({} calls)\n", name, seconds * 1e3,
               100 * seconds / total, op_seconds_.at(name).second);
}

Tensor CpuProgram::planned_output(std::int32_t slot, const TensorType& type) {
  if (!arena_)
    arena_ = Storage::allocate_cpu(std::max<std::size_t>(plan_.arena_bytes, kArenaAlign));
  return Tensor(arena_, plan_.slot_offset[static_cast<std::size_t>(slot)], type.shape, type.dtype);
}

Outputs CpuProgram::run(const std::vector<Feed>& feeds) {
  check_feed_names(graph_, feeds);
  ++runs_;
  for (const Feed& f : feeds)
    KILN_CHECK(f.tensor.device().is_cpu(), "run: '{}' is on {} but this program runs on the CPU",
               f.name, f.tensor.device().str());
  refresh_copies();
  const kernels::ReproducibleConvolutions reproducible(deterministic_);
  kernels::begin_cpu_kernel();  // nothing a kernel of an earlier run kept is reused
  kernels::begin_cpu_kernel();
  std::vector<std::vector<Tensor>> values(graph_.nodes().size());
  std::vector<TraceEvent> trace;
  const auto run_start = std::chrono::steady_clock::now();
  std::size_t fill_index = 0;
  for (std::size_t id = 0; id < graph_.nodes().size(); ++id) {
    const Node& n = graph_.nodes()[id];
    std::vector<Tensor>& out = values[id];
    std::vector<Tensor> in;
    for (const ValueRef& r : n.inputs)
      in.push_back(values[static_cast<std::size_t>(r.node)][static_cast<std::size_t>(r.index)]);
    if (n.op->id == OpId::input) {
      out = {feed_for(n, feeds)};
    } else if (n.op->id == OpId::variable) {
      const Tensor& v = n.variable->value;
      KILN_CHECK(
          v.shape() == n.outputs[0].shape && v.dtype() == n.outputs[0].dtype && v.device().is_cpu(),
          "run: variable '{}' is now {}{} on {} but was compiled as {} on the CPU", n.name,
          dtype_name(v.dtype()), v.shape().str(), v.device().str(), n.outputs[0].str());
      out = {v};
    } else if (n.op->id == OpId::fill) {
      out = {fills_[fill_index++]};
    } else if (n.op->id == OpId::tensor_constant) {
      out = {n.constant};
    } else if (n.op->alias) {
      out = {in[0].reshape(n.outputs[0].shape)};
    } else {
      for (std::size_t i = 0; i < n.outputs.size(); ++i)
        out.push_back(planned_output(plan_.slot[id][i], n.outputs[i]));
      const bool timed = profile_ || !trace_path_.empty();
      const auto start =
          timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      kernels::begin_cpu_kernel();
      run_cpu_kernel(n, in, out, blocked_.bits(id));
      if (check_numerics_) check_numerics(graph_, static_cast<std::int32_t>(id), in, out, runs_);
      if (!trace_path_.empty()) {
        const auto now = std::chrono::steady_clock::now();
        trace.push_back({n.body ? n.body->summary() : n.op->name, 0,
                         std::chrono::duration<double, std::micro>(start - run_start).count(),
                         std::chrono::duration<double, std::micro>(now - start).count(),
                         static_cast<std::int32_t>(id),
                         graph_.node_flops(static_cast<std::int32_t>(id)),
                         graph_.node_bytes(static_cast<std::int32_t>(id))});
      }
      if (profile_ && runs_ > 1) {  // the first run JIT-compiles oneDNN's kernels
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        auto& entry = op_seconds_[profile_key(n, KernelCall{n, in, out, blocked_.bits(id)})];
        entry.first += seconds;
        entry.second += 1;
      }
    }
  }

  auto value_of = [&](ValueRef r) {
    return values[static_cast<std::size_t>(r.node)][static_cast<std::size_t>(r.index)];
  };
  Outputs outputs;
  for (const auto& [name, ref] : graph_.outputs()) outputs[name] = value_of(ref).clone();
  // New values are taken before any variable is overwritten, so an update that reads
  // another variable's storage (assign(a, b)) sees the old value.
  std::vector<Tensor> updates;
  for (const auto& [var, ref] : graph_.assignments()) {
    Tensor t = value_of(ref);
    const bool planned =
        plan_.slot[static_cast<std::size_t>(ref.node)][static_cast<std::size_t>(ref.index)] >= 0;
    updates.push_back(planned ? t : t.clone());
  }
  for (std::size_t i = 0; i < updates.size(); ++i)
    graph_.assignments()[i].first->value.copy_from(updates[i]);
  if (!trace_path_.empty()) {
    write_trace(trace_path_, trace, "kiln cpu step");
    trace_path_.clear();
  }
  return outputs;
}

}  // namespace

std::unique_ptr<Program> make_cpu_program(const Graph& compiled, bool check_numerics,
                                          bool deterministic) {
  return std::make_unique<CpuProgram>(compiled, check_numerics, deterministic);
}

}  // namespace kiln
