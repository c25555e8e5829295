// Text, DOT and JSON views of a graph before and after fusion.
#include "tools/graph_render.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/compile.h"
#include "fusion/channels_last_outputs.h"
#include "fusion/fused_group.h"
#include "fusion/gemm_epilogues.h"
#include "fusion/rematerialize.h"
#include "fusion/stages.h"
#ifdef KILN_HAVE_CUDA
#include "backends/cuda/cublas_handle.h"
#include "backends/cuda/cuda_program.h"
#include "backends/cuda/op_entry.h"
#include "fusion/cuda_fused.h"
#include "gpu/autotune.h"
#include "gpu/cuda_runtime.h"
#endif
#include "graph/op.h"
#include "graph/passes/dead_code.h"
#include "graph/passes/verify.h"

namespace kiln::tools {
namespace {

// The nodes that launch work: neither sources nor views, and live (the slices that fused groups
// read in place are left unread by the fuse pass; compile() drops them).
std::vector<bool> kernel_nodes(const Graph& g) {
  std::vector<bool> kernel = live_nodes(g);
  for (std::size_t id = 0; id < kernel.size(); ++id) {
    const Node& n = g.nodes()[id];
    kernel[id] = kernel[id] && n.op->kind != OpKind::source && !n.op->alias;
  }
  return kernel;
}

int count_kernels(const Graph& g) {
  const std::vector<bool> kernel = kernel_nodes(g);
  return static_cast<int>(std::count(kernel.begin(), kernel.end(), true));
}

const FusedGroup& group_of(const Graph& g, const FusionReport::Group& entry) {
  return dynamic_cast<const FusedGroup&>(*g.node(entry.fused_node).body);
}

std::string ref_name(ValueRef r) {
  return r.index ? fmt::format("%{}.{}", r.node, r.index) : fmt::format("%{}", r.node);
}

nlohmann::json node_json(std::int32_t id, const Node& n) {
  nlohmann::json inputs = nlohmann::json::array(), outputs = nlohmann::json::array();
  for (const ValueRef& r : n.inputs) inputs.push_back(ref_name(r));
  for (const TensorType& t : n.outputs) outputs.push_back(t.str());
  nlohmann::json j = {{"id", id},
                      {"op", n.op->name},
                      {"kind", op_kind_name(n.op->kind)},
                      {"inputs", inputs},
                      {"outputs", outputs}};
  if (!n.name.empty()) j["name"] = n.name;
  if (!n.attrs.items().empty()) j["attrs"] = n.attrs.str();
  if (n.body) j["body"] = n.body->summary();
  return j;
}

// Where each output of a launched node lives: its plan slot and arena offset, or the
// variable an in-place update writes.
nlohmann::json buffers_json(const Graph& g, const Lowering& l, std::int32_t node) {
  nlohmann::json out = nlohmann::json::array();
  const auto& slots = l.plan.slot[static_cast<std::size_t>(node)];
  for (std::size_t i = 0; i < slots.size(); ++i) {
    nlohmann::json b = {{"output", i}};
    for (std::size_t k = 0; k < l.in_place.size(); ++k)
      if (l.in_place[k].in_place && g.assignments()[k].second == ValueRef{node, std::int32_t(i)})
        b["in_place_of"] = g.assignments()[k].first->name;
    if (!b.contains("in_place_of") && slots[i] >= 0)
      b.update({{"slot", slots[i]},
                {"offset", l.plan.slot_offset[static_cast<std::size_t>(slots[i])]},
                {"bytes", l.plan.slot_bytes[static_cast<std::size_t>(slots[i])]}});
    out.push_back(b);
  }
  return out;
}

// The launches of kernels in the launch list (the copies of updates not done in place aside).
int kernel_launches(const Lowering& l) {
  int n = 0;
  for (const LaunchStep& step : l.launches.steps) n += step.node >= 0;
  return n;
}

// The lowering steps' results: the launch list (stream, events, buffers), the plan's
// slots, the in-place updates.
nlohmann::json lowering_json(const Graph& g, const Lowering& l) {
  nlohmann::json launches = nlohmann::json::array(), slots = nlohmann::json::array(),
                 in_place = nlohmann::json::array();
  for (const LaunchStep& s : l.launches.steps) {
    nlohmann::json j = {{"label", s.label}, {"stream", s.stream}, {"waits", s.waits}};
    if (s.record >= 0) j["records"] = s.record;
    if (s.node >= 0) j.update({{"node", s.node}, {"buffers", buffers_json(g, l, s.node)}});
    if (!s.merged.empty()) {  // a horizontal launch: its member groups and all their buffers
      j["merged"] = s.merged;
      j["buffers"] = nlohmann::json::array();
      for (std::int32_t member : s.merged)
        for (nlohmann::json& b : buffers_json(g, l, member)) {
          b["node"] = member;
          j["buffers"].push_back(b);
        }
    }
    if (s.assignment >= 0) j["update"] = g.assignments()[std::size_t(s.assignment)].first->name;
    launches.push_back(j);
  }
  for (std::size_t s = 0; s < l.plan.slot_bytes.size(); ++s)
    slots.push_back(
        {{"slot", s}, {"bytes", l.plan.slot_bytes[s]}, {"offset", l.plan.slot_offset[s]}});
  for (std::size_t k = 0; k < l.in_place.size(); ++k) {
    const auto& [var, ref] = g.assignments()[k];
    in_place.push_back({{"variable", var->name},
                        {"value", ref_name(ref)},
                        {"in_place", l.in_place[k].in_place},
                        {"after", l.in_place[k].after}});
  }
  return {{"launches", launches},
          {"events", l.launches.events},
          {"arena_bytes", l.plan.arena_bytes},
          {"slots", slots},
          {"in_place_updates", in_place}};
}

}  // namespace

// Which kernels each node that is not a fused group launches on the GPU: host code only (the
// op entries' source lists), so it needs no device. TF32 is a process-wide switch the conv
// entries read; it is set for the listing as a program of `precision` sets it.
std::vector<HandWrittenLaunch> hand_written_launches(const Graph& g, Precision precision) {
  std::vector<HandWrittenLaunch> out;
#ifdef KILN_HAVE_CUDA
  const bool tf32_before = cuda::allow_tf32();
  cuda::set_allow_tf32(precision == Precision::tf32);
  const std::vector<bool> kernel = kernel_nodes(g);
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(g.nodes().size()); ++id) {
    const Node& n = g.node(id);
    if (!kernel[static_cast<std::size_t>(id)] || n.body) continue;
    const cuda::CudaOpEntry* entry = cuda::cuda_op(n.op->id);
    if (entry == nullptr || !entry->sources) continue;
    std::vector<TensorType> types;
    for (const ValueRef& r : n.inputs) types.push_back(g.type(r));
    HandWrittenLaunch launch{id, n.op->name, {}};
    for (const gpu::KernelSource& s : entry->sources(n, types)) launch.kernels.push_back(s.name);
    if (!launch.kernels.empty()) out.push_back(std::move(launch));
  }
  cuda::set_allow_tf32(tf32_before);
#else
  (void)g;
  (void)precision;
#endif
  return out;
}

FusionView fuse_for_view(const Graph& recorded, Precision precision) {
  FusionView v;
  verify(recorded);
  v.before = apply_conv_statistics(apply_channels_last(
      simplify_for_fusion(apply_precision(eliminate_dead_code(recorded), precision))));
  // The GPU's policy: the view shows the CUDA kernels and their lowering.
  v.after = stage_reductions(fuse(v.before, &v.report), cuda_stage_options(), &v.report);
  v.after = fuse_gemm_epilogues(v.after, &v.report,  // as compile()
                                gemm_epilogue_policy(false, precision == Precision::tf32));
  v.after = fold_channels_last_outputs(v.after, &v.report);
  v.after = rematerialize_outputs(v.after, &v.report);
  verify(v.after);
  for (const FusionReport::Group& entry : v.report.groups)
    v.kernels.push_back(generate_cuda(group_of(v.after, entry)));
#ifdef KILN_HAVE_CUDA  // as compile() lowers it, with the convolutions' scratch
  v.lowering = lower_for_device(v.after, CompileOptions{}.cuda_streams, dump_lowering, true,
                                cuda_scratch_bytes(v.after, precision == Precision::tf32));
#else
  v.lowering = lower_for_device(v.after, CompileOptions{}.cuda_streams, dump_lowering);
#endif
  v.hand_written = hand_written_launches(v.after, precision);
  return v;
}

void add_occupancy(FusionView& v) {
#ifdef KILN_HAVE_CUDA
  KILN_CHECK(gpu::cuda_device_count() > 0, "--device cuda: {}", gpu::cuda_unavailable_reason());
  std::vector<const FusedGroup*> groups;
  for (const FusionReport::Group& entry : v.report.groups)
    groups.push_back(&group_of(v.after, entry));
  for (const auto& kernel : compile_fused_kernels(groups)) {
    const gpu::KernelAttributes a = kernel->attributes();
    v.occupancy.push_back({a.registers_per_thread, a.static_shared_bytes, a.local_bytes_per_thread,
                           static_cast<int>(kernel->launch_shape().block.x),
                           kernel->launch_shape().occupancy});
  }
  v.tuning = gpu::tuning_decisions();
#else
  (void)v;
  throw Error("--device cuda: this build of kiln has no CUDA backend");
#endif
}

// The bytes a kernel that is not a fused group reads and writes: each operand once.
std::int64_t operand_bytes(const Graph& g, const Node& n) {
  std::int64_t bytes = 0;
  for (const ValueRef& in : n.inputs) {
    const TensorType& t = g.type(in);
    bytes += t.shape.numel() * static_cast<std::int64_t>(dtype_size(t.dtype));
  }
  for (const TensorType& t : n.outputs)
    bytes += t.shape.numel() * static_cast<std::int64_t>(dtype_size(t.dtype));
  return bytes;
}

FusionSummary summarise(const FusionView& v) {
  FusionSummary s{count_kernels(v.before), count_kernels(v.after),
                  static_cast<int>(v.report.groups.size()), 0};
  for (const FusionReport::Group& entry : v.report.groups) {
    const FusedGroup& g = group_of(v.after, entry);
    s.bytes_saved += g.unfused_bytes() - g.bytes_read() - g.bytes_written();
    s.fused_bytes += g.bytes_read() + g.bytes_written();
  }
  const std::vector<bool> kernel = kernel_nodes(v.after);
  for (std::size_t id = 0; id < kernel.size(); ++id)
    if (kernel[id] && !v.after.nodes()[id].body)
      s.other_bytes += operand_bytes(v.after, v.after.nodes()[id]);
  return s;
}

std::string render_text(const FusionView& v, const std::string& title, bool with_source) {
  const FusionSummary s = summarise(v);
  std::string out =
      fmt::format("== {}: before fusion ({} ops) ==\n{}", title, s.ops_before, v.before.str());
  out += fmt::format("\n== after fusion ({} kernels, {} of them fused) ==\n{}", s.kernels_after,
                     s.fused_kernels, v.after.str());
  out += "\n== fused kernels ==\n";
  for (std::size_t k = 0; k < v.report.groups.size(); ++k) {
    const FusionReport::Group& entry = v.report.groups[k];
    const FusedGroup& g = group_of(v.after, entry);
    std::string members;
    for (std::int32_t m : entry.members)
      members += fmt::format("{}%{} {}", members.empty() ? "" : ", ", m, v.before.node(m).op->name);
    out += fmt::format(
        "{} (%{}): {}\n  members: {}\n  reads {} B, writes {} B, saves {} B against unfused\n",
        v.kernels[k].name, entry.fused_node, g.summary(), members, g.bytes_read(),
        g.bytes_written(), g.unfused_bytes() - g.bytes_read() - g.bytes_written());
    if (k < v.occupancy.size()) {
      const KernelOccupancy& o = v.occupancy[k];
      out += fmt::format(
          "  cuda: {} registers/thread, {} B shared, {} B spilled/thread, block {}, occupancy "
          "{:.0f}%\n",
          o.registers, o.shared_bytes, o.spill_bytes, o.block, 100 * o.occupancy);
    }
    if (with_source) out += v.kernels[k].source + "\n";
  }
  if (!v.hand_written.empty()) out += "\n== hand-written CUDA kernels, by node ==\n";
  for (const HandWrittenLaunch& h : v.hand_written)
    out += fmt::format("%{} {}: {}\n", h.node, h.op, fmt::join(h.kernels, ", "));
  if (!v.tuning.empty()) out += "\n== autotuned (each candidate's median us; * the choice) ==\n";
  for (const gpu::TuningRecord& r : v.tuning) {
    std::string times;
    for (std::size_t i = 0; i < r.candidates.size(); ++i)
      times += fmt::format(" {}{} {:.1f}", static_cast<int>(i) == r.chosen ? "*" : "",
                           r.candidates[i], r.us[i]);
    out += fmt::format("{}: {} ({}):{}\n", r.problem, r.choice(),
                       r.from_disk ? "kernel cache" : "timed now", times);
  }
  if (!v.lowering.horizontal.empty()) {
    out += "\n== horizontal launches (groups of one kind, one launch each) ==\n";
    for (const LaunchStep& step : v.lowering.launches.steps)
      if (!step.merged.empty())
        out += fmt::format("{} on stream {}: %{}\n", step.label, step.stream,
                           fmt::join(step.merged, " %"));
  }
  out += "\n== stream schedule (critical path on stream 0, the rest on stream 1) ==\n";
  const std::vector<bool> kernel = kernel_nodes(v.after);
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(v.after.nodes().size()); ++id) {
    const Node& n = v.after.node(id);
    if (kernel[static_cast<std::size_t>(id)])
      out += fmt::format("%{} {} -> stream {}\n", id, n.body ? "fused" : n.op->name,
                         v.lowering.stream_of[static_cast<std::size_t>(id)]);
  }
  out += fmt::format(
      "\n== summary ==\nops before: {}\nkernels after: {}\nlaunches (a horizontal launch once): "
      "{}\nbytes saved by fusion: {}\n"
      "bytes read and written by the kernels: {} (fused groups {}, the others {})\n",
      s.ops_before, s.kernels_after, kernel_launches(v.lowering), s.bytes_saved,
      s.fused_bytes + s.other_bytes, s.fused_bytes, s.other_bytes);
  return out;
}

std::string render_dot(const FusionView& v, const std::string& title) {
  std::string out = fmt::format(
      "digraph kiln {{\n  label=\"{}\";\n  labelloc=t;\n  rankdir=TB;\n  node [shape=box, "
      "fontname=\"monospace\", fontsize=10];\n",
      title);
  std::vector<int> cluster(v.before.nodes().size(), -1);
  for (std::size_t k = 0; k < v.report.groups.size(); ++k)
    for (std::int32_t m : v.report.groups[k].members)
      cluster[static_cast<std::size_t>(m)] = static_cast<int>(k);
  auto node_line = [&](std::int32_t id) {
    const Node& n = v.before.node(id);
    const std::string shape = n.op->kind == OpKind::source ? ", shape=ellipse" : "";
    const std::string label =
        n.name.empty() ? n.op->name : fmt::format("{} \\\"{}\\\"", n.op->name, n.name);
    return fmt::format("    n{} [label=\"%{} {}\\n{}\"{}];\n", id, id, label, n.outputs[0].str(),
                       shape);
  };
  for (std::size_t k = 0; k < v.report.groups.size(); ++k) {
    out += fmt::format(
        "  subgraph cluster_{} {{\n    label=\"{}\";\n    style=filled;\n    color=lightblue;\n", k,
        v.kernels[k].name);
    for (std::int32_t m : v.report.groups[k].members) out += node_line(m);
    out += "  }\n";
  }
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(v.before.nodes().size()); ++id) {
    const Node& n = v.before.node(id);
    if (n.op->id == OpId::fill) continue;  // folded into kernels as literals
    if (cluster[static_cast<std::size_t>(id)] < 0) out += node_line(id);
    for (const ValueRef& in : n.inputs)
      if (v.before.node(in.node).op->id != OpId::fill)
        out += fmt::format("  n{} -> n{};\n", in.node, id);
  }
  return out + "}\n";
}

nlohmann::json render_json(const FusionView& v, bool with_source) {
  const FusionSummary s = summarise(v);
  nlohmann::json before = nlohmann::json::array(), after = nlohmann::json::array(),
                 kernels = nlohmann::json::array();
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(v.before.nodes().size()); ++id)
    before.push_back(node_json(id, v.before.node(id)));
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(v.after.nodes().size()); ++id)
    after.push_back(node_json(id, v.after.node(id)));
  for (std::size_t k = 0; k < v.report.groups.size(); ++k) {
    const FusedGroup& g = group_of(v.after, v.report.groups[k]);
    nlohmann::json kernel = {
        {"name", v.kernels[k].name},
        {"node", v.report.groups[k].fused_node},
        {"members", v.report.groups[k].members},
        {"summary", g.summary()},
        {"bytes_read", g.bytes_read()},
        {"bytes_written", g.bytes_written()},
        {"bytes_saved", g.unfused_bytes() - g.bytes_read() - g.bytes_written()}};
    if (with_source) kernel["source"] = v.kernels[k].source;
    if (k < v.occupancy.size()) {
      const KernelOccupancy& o = v.occupancy[k];
      kernel["cuda"] = {{"registers", o.registers},
                        {"shared_bytes", o.shared_bytes},
                        {"spill_bytes", o.spill_bytes},
                        {"block", o.block},
                        {"occupancy", o.occupancy}};
    }
    kernels.push_back(kernel);
  }
  nlohmann::json schedule = nlohmann::json::array();
  const std::vector<bool> kernel = kernel_nodes(v.after);
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(v.after.nodes().size()); ++id)
    if (kernel[static_cast<std::size_t>(id)])
      schedule.push_back(
          {{"node", id}, {"stream", v.lowering.stream_of[static_cast<std::size_t>(id)]}});
  nlohmann::json hand_written = nlohmann::json::array();
  for (const HandWrittenLaunch& h : v.hand_written)
    hand_written.push_back({{"node", h.node}, {"op", h.op}, {"kernels", h.kernels}});
  nlohmann::json tuning = nlohmann::json::array();
  for (const gpu::TuningRecord& r : v.tuning)
    tuning.push_back({{"problem", r.problem},
                      {"choice", r.choice()},
                      {"candidates", r.candidates},
                      {"us", r.us},
                      {"from_cache", r.from_disk}});
  return {{"schedule", schedule},
          {"autotuned", tuning},
          {"hand_written_kernels", hand_written},
          {"lowering", lowering_json(v.after, v.lowering)},
          {"before", before},
          {"after", after},
          {"kernels", kernels},
          {"summary",
           {{"ops_before", s.ops_before},
            {"kernels_after", s.kernels_after},
            {"launches", kernel_launches(v.lowering)},
            {"fused_kernels", s.fused_kernels},
            {"bytes_saved", s.bytes_saved},
            {"fused_bytes", s.fused_bytes},
            {"other_bytes", s.other_bytes}}}};
}

}  // namespace kiln::tools
