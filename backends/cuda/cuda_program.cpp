// CudaProgram: execution only. The lowering (streams, memory plan, in-place updates, the
// launch list) comes from compile(); the buffers are bound once (device_buffers.h), each
// launch of the list prepared once (op_entry.h, fused kernels), and a run = feeds in, the step
// (direct, captured, or replayed; traced and timed), outputs out through pinned memory, all
// queued (enqueue) behind the run queued before it (run_order.h); the host waits in wait().
#include "backends/cuda/cuda_program.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <map>
#include <set>

#include "backends/cuda/cublas_handle.h"
#include "backends/cuda/warm_up.h"
#include "backends/cuda/device_allocator.h"
#include "backends/cuda/cast.h"
#include "backends/cuda/device_buffers.h"
#include "backends/cuda/host_transfers.h"
#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/op_entry.h"
#include "backends/cuda/run_order.h"
#include "backends/feeds.h"
#include "backends/numerics.h"
#include "backends/trace_writer.h"
#include "core/env_switch.h"
#include "core/log.h"
#include "fusion/cuda_fused.h"
#include "gpu/cuda_check.h"

namespace kiln {
namespace {

class CudaProgram final : public Program {
 public:
  CudaProgram(const Graph& compiled, const Lowering& lowering, const CudaOptions& options);
  ~CudaProgram() override;

  Outputs run(const std::vector<Feed>& feeds) override { return enqueue(feeds).wait(); }
  PendingRun enqueue(const std::vector<Feed>& feeds) override;
  const Graph& graph() const override { return graph_; }
  Device device() const override { return Device::cuda(); }
  std::size_t planned_bytes() const override { return lowering_.plan.arena_bytes; }
  void trace_next_run(const std::string& path) override { trace_path_ = path; }
  double last_step_device_ms() const override { return last_step_ms_; }

 private:
  // A step of the launch list (backends/launch_list.h) with its prepared launch.
  struct Step {
    const LaunchStep* order = nullptr;
    cuda::Launch launch;
  };

  void prepare_launches();
  void collect_kernels(std::vector<const FusedGroup*>& groups,
                       std::vector<gpu::KernelSource>& sources);
  void* status_of(std::int32_t node) const;
  cuda::Launch prepare_node(std::int32_t node);
  std::vector<HorizontalMembers> horizontal_members() const;
  cuda::Launch prepare_horizontal(const LaunchStep& step) const;
  cuda::Launch prepare_update(const LaunchStep& step) const;
  void execute(std::vector<TraceEvent>* trace);
  void launch_step(cudaStream_t main);
  Outputs finish_run();
  void prefetch(const std::vector<Feed>& next) override { buffers_.stager->announce(next); }
  void check_step(std::int32_t node, cudaStream_t stream) const;
  void adopt_variables(cudaStream_t stream);
  void* pointer(ValueRef ref) const { return buffers_.pointer(ref); }

  Graph graph_;
  Lowering lowering_;  // streams, memory plan, in-place updates, launch list (compile())
  CudaOptions options_;
  cuda::DeviceBuffers buffers_;
  std::vector<std::unique_ptr<CudaFusedKernel>> fused_;
  std::vector<int> fused_of_node_;                                 // index into fused_, or -1
  std::vector<std::unique_ptr<CudaHorizontalKernel>> horizontal_;  // per lowering_.horizontal
  std::vector<Step> steps_;
  std::vector<cudaStream_t> streams_;
  std::vector<cudaEvent_t> events_;  // the launch list's cross-stream events
  cudaEvent_t fork_ = nullptr;
  std::vector<cudaEvent_t> joins_;  // per side stream
  std::size_t first_update_ = 0;    // index of the first variable-update step
  cudaEvent_t step_begin_ = nullptr,
              step_end_ = nullptr;  // timing events around the step's kernels
  double last_step_ms_ = -1;
  std::string trace_path_;
  // The status memory of the nodes whose entry asks for one (cuda/op_entry.h), by node.
  struct NodeStatus {
    std::int32_t node = -1;
    const cuda::CudaOpEntry* entry = nullptr;
    Tensor memory;
  };
  std::vector<NodeStatus> statuses_;
  cudaGraphExec_t graph_exec_ = nullptr;
  int runs_ = 0;
  std::unique_ptr<cuda::PinnedOutputs> outputs_;
  cuda::PinnedUploads uploads_;
  cudaEvent_t done_ = nullptr;  // the run's outputs are in outputs_
  bool priorities_ = env_switch_on("KILN_STREAM_PRIORITIES");
  PendingRun pending_;  // the run queued last
};

CudaProgram::CudaProgram(const Graph& compiled, const Lowering& lowering,
                         const CudaOptions& options)
    : graph_(compiled), lowering_(lowering), options_(options) {
  const std::vector<int>& stream_of = lowering_.stream_of;
  streams_.resize(
      static_cast<std::size_t>(*std::max_element(stream_of.begin(), stream_of.end()) + 1));
  // The critical path's stream (0) and the collectives' (index options.streams) at the
  // device's greatest priority, the side streams at its least, so that the block scheduler
  // starts the critical path's blocks first where both wait (the captured graph keeps each
  // kernel's priority: cudaGraphInstantiateFlagUseNodePriority below). KILN_STREAM_PRIORITIES=0:
  // every stream at the default priority (resnet18 bf16 b512 5.90 against 6.08 device ms on an
  // H100, bench/README.md).
  int least = 0, greatest = 0;
  if (priorities_) KILN_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  for (std::size_t i = 0; i < streams_.size(); ++i) {
    const bool first = i == 0 || static_cast<int>(i) >= options.streams;
    KILN_CUDA_CHECK(cudaStreamCreateWithPriority(&streams_[i], cudaStreamNonBlocking,
                                                 first ? greatest : least));
  }
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  KILN_CUDA_CHECK(cudaEventCreate(&step_begin_));
  KILN_CUDA_CHECK(cudaEventCreate(&step_end_));
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  joins_.resize(streams_.size(), nullptr);
  for (std::size_t s = 1; s < streams_.size(); ++s)
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&joins_[s], cudaEventDisableTiming));
  events_.resize(static_cast<std::size_t>(lowering_.launches.events));
  for (cudaEvent_t& e : events_)
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  cuda::set_allow_tf32(options.tf32);
  if (options.deterministic)
    for (cudaStream_t s : streams_)
      KILN_CUBLAS_CHECK(cublasSetAtomicsMode(cuda::handle_for(s), CUBLAS_ATOMICS_NOT_ALLOWED));
  buffers_ = cuda::bind_device_buffers(graph_, lowering_);
  std::vector<const void*> output_pointers;
  for (const auto& [name, ref] : graph_.outputs()) output_pointers.push_back(pointer(ref));
  outputs_ = std::make_unique<cuda::PinnedOutputs>(graph_, std::move(output_pointers));
  prepare_launches();
}

CudaProgram::~CudaProgram() {
  if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
  for (cudaStream_t s : streams_) {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  if (step_end_) cuda::forget_run_end(step_end_);
  if (done_) cudaEventDestroy(done_);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (cudaEvent_t e : joins_)
    if (e) cudaEventDestroy(e);
  if (fork_) cudaEventDestroy(fork_);
  if (step_begin_) cudaEventDestroy(step_begin_);
  if (step_end_) cudaEventDestroy(step_end_);
}

// The fused groups and the hand-written kernels the step launches, and the status memory of
// the nodes that report errors.
void CudaProgram::collect_kernels(std::vector<const FusedGroup*>& groups,
                                  std::vector<gpu::KernelSource>& sources) {
  std::set<std::string> source_names;
  std::set<std::int32_t> merged;  // run by horizontal launches, not by kernels of their own
  for (const HorizontalLaunch& h : lowering_.horizontal)
    merged.insert(h.nodes.begin(), h.nodes.end());
  fused_of_node_.assign(graph_.nodes().size(), -1);
  for (const Node& n : graph_.nodes()) {
    const auto id = static_cast<std::int32_t>(&n - graph_.nodes().data());
    if (n.body && !merged.count(id)) {
      fused_of_node_[static_cast<std::size_t>(id)] = static_cast<int>(groups.size());
      groups.push_back(dynamic_cast<const FusedGroup*>(n.body.get()));
    }
    if (n.body || n.op->kind == OpKind::source || n.op->alias) continue;
    const cuda::CudaOpEntry* entry = cuda::cuda_op(n.op->id);
    KILN_CHECK(entry != nullptr, "the CUDA backend has no kernel for op '{}'", n.op->name);
    std::vector<TensorType> types;
    for (const ValueRef& r : n.inputs) types.push_back(graph_.type(r));
    if (entry->sources)
      for (gpu::KernelSource& source : entry->sources(n, types))
        if (source_names.insert(source.name).second) sources.push_back(std::move(source));
    const std::size_t status = entry->status_bytes ? entry->status_bytes(n, types) : 0;
    if (status == 0) continue;
    Tensor memory(cuda::device_allocator().allocate(status), 0, {static_cast<std::int64_t>(status)},
                  DType::u8);
    KILN_CUDA_CHECK(cudaMemset(memory.raw(), 0, status));
    statuses_.push_back({static_cast<std::int32_t>(&n - graph_.nodes().data()), entry, memory});
  }
  KILN_CUDA_CHECK(cudaDeviceSynchronize());  // the status memory is zero before any launch
}

void* CudaProgram::status_of(std::int32_t node) const {
  for (const NodeStatus& s : statuses_)
    if (s.node == node) return s.memory.raw();
  return nullptr;
}

void CudaProgram::prepare_launches() {
  std::vector<const FusedGroup*> groups;
  std::vector<gpu::KernelSource> sources;  // hand-written kernels the launches will use
  collect_kernels(groups, sources);
  // Both sets compile in parallel (through the kernel cache), side by side.
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  std::future<void> hand_written = std::async(std::launch::async, [&sources, device] {
    KILN_CUDA_CHECK(cudaSetDevice(device));  // the current device is per thread
    cuda::preload_kernels(sources);
  });
  std::future<void> horizontal = std::async(std::launch::async, [this, device] {
    KILN_CUDA_CHECK(cudaSetDevice(device));
    horizontal_ = compile_horizontal_kernels(horizontal_members());
  });
  fused_ = compile_fused_kernels(groups);
  hand_written.get();
  horizontal.get();
  for (const LaunchStep& step : lowering_.launches.steps) {
    cuda::Launch launch = !step.merged.empty() ? prepare_horizontal(step)
                          : step.node >= 0     ? prepare_node(step.node)
                                               : prepare_update(step);
    if (launch) steps_.push_back({&step, std::move(launch)});
    if (step.node >= 0) first_update_ = steps_.size();
  }
  log().debug("cuda program: {} launches on {} streams, {} fused kernels, arena {} bytes",
              steps_.size(), streams_.size(), fused_.size(), lowering_.plan.arena_bytes);
}

// A node's launch: its fused kernel, or its op's CUDA entry with its scratch in the arena.
cuda::Launch CudaProgram::prepare_node(std::int32_t node) {
  const Node& n = graph_.node(node);
  std::vector<const void*> in;
  std::vector<TensorType> types;
  for (const ValueRef& r : n.inputs) {
    in.push_back(pointer(r));
    types.push_back(graph_.type(r));
  }
  const std::vector<void*>& out = buffers_.ptr[static_cast<std::size_t>(node)];
  if (n.body) {
    const CudaFusedKernel* kernel =
        fused_[static_cast<std::size_t>(fused_of_node_[static_cast<std::size_t>(node)])].get();
    return [kernel, in, out](gpu::Stream s) { kernel->launch(in, out, s); };
  }
  const cuda::CudaOpEntry* entry = cuda::cuda_op(n.op->id);
  const std::size_t wanted = entry->workspace_bytes ? entry->workspace_bytes(n, types) : 0;
  const std::int32_t slot = lowering_.plan.scratch[static_cast<std::size_t>(node)];
  const std::size_t bytes =
      slot < 0 ? 0 : lowering_.plan.slot_bytes[static_cast<std::size_t>(slot)];
  KILN_CHECK(bytes >= wanted,
             "cuda program: %{} ({}) needs {} bytes of scratch but the memory plan gave it {} (a "
             "lowering without cuda_scratch_bytes?)",
             node, n.op->name, wanted, bytes);
  void* ws = slot < 0 ? nullptr : buffers_.scratch(slot);
  cuda::LaunchSetup setup{n, types, in, out, ws, bytes, status_of(node)};
  return entry->prepare(setup);
}

// Each horizontal launch's members with the pointers they read and write.
std::vector<HorizontalMembers> CudaProgram::horizontal_members() const {
  std::vector<HorizontalMembers> launches;
  for (const HorizontalLaunch& h : lowering_.horizontal) {
    HorizontalMembers m;
    for (std::int32_t member : h.nodes) {
      const Node& n = graph_.node(member);
      m.groups.push_back(dynamic_cast<const FusedGroup*>(n.body.get()));
      m.inputs.emplace_back();
      for (const ValueRef& r : n.inputs) m.inputs.back().push_back(pointer(r));
      m.outputs.push_back(buffers_.ptr[static_cast<std::size_t>(member)]);
    }
    launches.push_back(std::move(m));
  }
  return launches;
}

cuda::Launch CudaProgram::prepare_horizontal(const LaunchStep& step) const {
  for (std::size_t k = 0; k < lowering_.horizontal.size(); ++k)
    if (lowering_.horizontal[k].nodes == step.merged) {
      const CudaHorizontalKernel* kernel = horizontal_[k].get();
      return [kernel](gpu::Stream s) { kernel->launch(s); };
    }
  KILN_ASSERT(false, "launch '{}' is no horizontal launch of the lowering", step.label);
  return nullptr;
}

// An assignment not done in place: the new value copied into the variable at the end of the
// step (none when the value already is the variable's storage).
cuda::Launch CudaProgram::prepare_update(const LaunchStep& step) const {
  const auto& [var, ref] = graph_.assignments()[static_cast<std::size_t>(step.assignment)];
  void* dst = nullptr;
  for (const auto& [adopted, tensor] : buffers_.variables)
    if (adopted == var) dst = tensor.raw();
  KILN_ASSERT(dst != nullptr, "assigned variable {} is not read by the step", var->name);
  const void* src = pointer(ref);
  const std::size_t bytes = var->value.nbytes();
  if (src == dst) return nullptr;
  return [=](gpu::Stream s) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
  };
}

// Forks the side streams from stream 0, launches every step on its stream with its event
// waits, and joins them back; with `trace`, each launch is bracketed by timing events.
void CudaProgram::execute(std::vector<TraceEvent>* trace) {
  // TF32 is a process-wide switch that the convolutions and GEMMs read while launching: set it
  // to this program's own setting, which its workspace was sized for (another program compiled
  // since may have changed it).
  cuda::set_allow_tf32(options_.tf32);
  cudaStream_t main = streams_[0];
  std::vector<cudaEvent_t> timing;
  auto timing_event = [&](cudaStream_t s) {
    timing.emplace_back();
    KILN_CUDA_CHECK(cudaEventCreate(&timing.back()));
    KILN_CUDA_CHECK(cudaEventRecord(timing.back(), s));
  };
  if (trace) timing_event(main);  // the step's start
  if (streams_.size() > 1) {
    KILN_CUDA_CHECK(cudaEventRecord(fork_, main));
    for (std::size_t s = 1; s < streams_.size(); ++s)
      KILN_CUDA_CHECK(cudaStreamWaitEvent(streams_[s], fork_));
  }
  auto join = [&] {
    for (std::size_t s = 1; s < streams_.size(); ++s) {
      KILN_CUDA_CHECK(cudaEventRecord(joins_[s], streams_[s]));
      KILN_CUDA_CHECK(cudaStreamWaitEvent(main, joins_[s]));
    }
  };
  for (std::size_t k = 0; k < steps_.size(); ++k) {
    const LaunchStep& step = *steps_[k].order;
    cudaStream_t stream = streams_[static_cast<std::size_t>(step.stream)];
    if (k == first_update_) join();  // variable updates run after the side streams join
    for (int e : step.waits)
      KILN_CUDA_CHECK(cudaStreamWaitEvent(stream, events_[static_cast<std::size_t>(e)]));
    if (trace) timing_event(stream);
    steps_[k].launch(stream);
    if (trace) timing_event(stream);
    if (options_.check_numerics && step.node >= 0) check_step(step.node, stream);
    if (step.record >= 0)
      KILN_CUDA_CHECK(cudaEventRecord(events_[static_cast<std::size_t>(step.record)], stream));
  }
  if (first_update_ == steps_.size()) join();
  if (!trace) return;
  KILN_CUDA_CHECK(cudaStreamSynchronize(main));
  for (std::size_t k = 0; k < steps_.size(); ++k) {
    float start = 0, end = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&start, timing[0], timing[1 + 2 * k]));
    KILN_CUDA_CHECK(cudaEventElapsedTime(&end, timing[0], timing[2 + 2 * k]));
    const LaunchStep& step = *steps_[k].order;
    const bool one_node = step.node >= 0 && step.merged.empty();
    trace->push_back({step.label, step.stream, 1000.0 * start, 1000.0 * (end - start), step.node,
                      one_node ? graph_.node_flops(step.node) : 0.0,
                      one_node ? graph_.node_bytes(step.node) : 0.0});
  }
  for (cudaEvent_t e : timing) cudaEventDestroy(e);
}

// --check-numerics: waits for the launch, then scans host copies of what the node read and wrote.
void CudaProgram::check_step(std::int32_t node, cudaStream_t stream) const {
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  const Node& n = graph_.node(node);
  auto host_copy = [&](const void* ptr, const TensorType& t) {
    Tensor host = Tensor::empty(t.shape, t.dtype);
    KILN_CUDA_CHECK(cudaMemcpy(host.raw(), ptr, host.nbytes(), cudaMemcpyDeviceToHost));
    return host;
  };
  std::vector<Tensor> in, out;
  for (const ValueRef& r : n.inputs) in.push_back(host_copy(pointer(r), graph_.type(r)));
  for (std::size_t i = 0; i < n.outputs.size(); ++i)
    out.push_back(host_copy(buffers_.ptr[static_cast<std::size_t>(node)][i], n.outputs[i]));
  check_numerics(graph_, node, in, out, runs_);
}

// Variables are adopted by their device tensor; a host tensor the user assigned since
// (a new learning rate, a loaded checkpoint) is uploaded into the adopted buffer. A weight's
// low-precision copy (passes/weight_copies.h) is rounded from its weight on the first run and
// whenever the weight was uploaded; after that the step's own update writes it.
void CudaProgram::adopt_variables(cudaStream_t stream) {
  std::map<const Variable*, const Tensor*> uploaded;
  for (auto& [var, adopted] : buffers_.variables) {
    if (runs_ == 0) uploaded.emplace(var.get(), &adopted);
    if (var->value.storage() == adopted.storage()) continue;
    KILN_CHECK(var->value.shape() == adopted.shape() && var->value.dtype() == adopted.dtype(),
               "run: variable '{}' is now {}{} but was compiled as {}{}", var->name,
               dtype_name(var->value.dtype()), var->value.shape().str(),
               dtype_name(adopted.dtype()), adopted.shape().str());
    if (var->value.device().is_cpu())  // through pinned memory: the host tensor may go away
      uploads_.upload(var->value, adopted.raw(), stream);
    else
      KILN_CUDA_CHECK(cudaMemcpyAsync(adopted.raw(), var->value.raw(), adopted.nbytes(),
                                      cudaMemcpyDeviceToDevice, stream));
    var->value = adopted;
    uploaded.emplace(var.get(), &adopted);
  }
  for (auto& [var, adopted] : buffers_.variables) {
    if (!var->copy_of) continue;
    const auto source = uploaded.find(var->copy_of.get());
    if (source == uploaded.end()) continue;
    cuda::cast(source->second->dtype(), adopted.dtype(), adopted.numel(), source->second->raw(),
               adopted.raw(), stream);
  }
}

// The step itself: traced launch by launch, run directly, or captured once and replayed.
void CudaProgram::launch_step(cudaStream_t main) {
  if (!trace_path_.empty()) {  // a traced step runs launch by launch, outside any graph
    std::vector<TraceEvent> trace;
    execute(&trace);
    write_trace(trace_path_, trace, fmt::format("kiln cuda step ({} streams)", streams_.size()));
    trace_path_.clear();
  } else if (!options_.graphs || runs_ == 1) {
    execute(nullptr);  // the first run also warms up cuBLAS and loads every kernel
  } else {
    if (!graph_exec_) {
      cudaGraph_t captured = nullptr;
      KILN_CUDA_CHECK(cudaStreamBeginCapture(main, cudaStreamCaptureModeThreadLocal));
      execute(nullptr);
      KILN_CUDA_CHECK(cudaStreamEndCapture(main, &captured));
      KILN_CUDA_CHECK(cudaGraphInstantiate(
          &graph_exec_, captured, priorities_ ? cudaGraphInstantiateFlagUseNodePriority : 0));
      KILN_CUDA_CHECK(cudaGraphDestroy(captured));
      log().debug("cuda program: step captured as a CUDA graph");
    }
    KILN_CUDA_CHECK(cudaGraphLaunch(graph_exec_, main));
  }
}

PendingRun CudaProgram::enqueue(const std::vector<Feed>& feeds) {
  check_feed_names(graph_, feeds);
  pending_.complete();  // one run in flight: the next reuses its staging and output buffers
  cudaStream_t main = streams_[0];
  cuda::wait_for_last_run(main);
  uploads_.start_run();
  buffers_.stager->load(feeds, main);
  adopt_variables(main);
  ++runs_;
  KILN_CUDA_CHECK(cudaEventRecord(step_begin_, main));
  launch_step(main);
  KILN_CUDA_CHECK(cudaEventRecord(step_end_, main));
  cuda::publish_run_end(step_end_);
  buffers_.stager->stage();  // the next batch crosses the bus while this step computes
  outputs_->download(main);
  KILN_CUDA_CHECK(cudaEventRecord(done_, main));
  pending_ = PendingRun([this] { return finish_run(); });
  return pending_;
}

// Waits for the queued run, then its device time, status checks and outputs.
Outputs CudaProgram::finish_run() {
  KILN_CUDA_CHECK(cudaEventSynchronize(done_));
  float step_ms = 0;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&step_ms, step_begin_, step_end_));
  last_step_ms_ = step_ms;
  for (const NodeStatus& s : statuses_)
    if (s.entry->check_status)
      s.entry->check_status(graph_.node(s.node), s.memory.raw(), streams_[0]);
  return outputs_->read();
}

}  // namespace

std::vector<std::size_t> cuda_scratch_bytes(const Graph& compiled, bool tf32) {
  cuda::wait_for_warm_ups();  // sizing tunes convolutions on the device
  cuda::set_allow_tf32(tf32);
  std::vector<std::size_t> bytes(compiled.nodes().size(), 0);
  for (std::size_t id = 0; id < bytes.size(); ++id) {
    const Node& n = compiled.nodes()[id];
    if (n.body || n.op->kind == OpKind::source || n.op->alias) continue;
    const cuda::CudaOpEntry* entry = cuda::cuda_op(n.op->id);
    if (entry == nullptr || !entry->workspace_bytes) continue;  // (no entry: an error later)
    std::vector<TensorType> types;
    for (const ValueRef& r : n.inputs) types.push_back(compiled.type(r));
    bytes[id] = entry->workspace_bytes(n, types);
  }
  return bytes;
}

std::unique_ptr<Program> make_cuda_program(const Graph& compiled, const Lowering& lowering,
                                           const CudaOptions& options) {
  KILN_CHECK(gpu::cuda_device_count() > 0, "device cuda: {}", gpu::cuda_unavailable_reason());
  cuda::wait_for_warm_ups();
  return std::make_unique<CudaProgram>(compiled, lowering, options);
}

}  // namespace kiln
