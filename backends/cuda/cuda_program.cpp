// CudaProgram: buffers (arena slots, inputs, constants, adopted variables), launches,
// and run = feeds in, step (direct, captured, or replayed), updates, outputs out.
#include "backends/cuda/cuda_program.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <map>
#include <set>

#include "backends/cuda/cublas_handle.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/device_allocator.h"
#include "backends/cuda/input_stager.h"
#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/layout.h"
#include "backends/cuda/transfer.h"
#include "backends/feeds.h"
#include "backends/numerics.h"
#include "backends/plan.h"
#include "backends/schedule.h"
#include "backends/trace_writer.h"
#include "core/log.h"
#include "fusion/cuda_fused.h"
#include "gpu/cuda_check.h"

namespace kiln {
namespace {

constexpr std::size_t kAlign = 256;

std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

class CudaProgram final : public Program {
 public:
  CudaProgram(const Graph& compiled, const CudaOptions& options);
  ~CudaProgram() override;

  Outputs run(const std::vector<Feed>& feeds) override;
  const Graph& graph() const override { return graph_; }
  Device device() const override { return Device::cuda(); }
  std::size_t planned_bytes() const override { return arena_bytes_; }
  void trace_next_run(const std::string& path) override { trace_path_ = path; }
  double last_step_device_ms() const override { return last_step_ms_; }

 private:
  // One launch of the step: on which stream, after which cross-stream events, and which
  // event it records for readers on another stream.
  struct Step {
    int stream = 0;
    std::int32_t node = -1;  // -1: a variable update
    std::vector<int> waits;
    int record = -1;
    std::string label;
    cuda::Launch launch;
  };

  void bind_buffers();
  void prepare_launches();
  void add_step(std::int32_t node, std::string label, cuda::Launch launch);
  void execute(std::vector<TraceEvent>* trace);
  void prefetch(const std::vector<Feed>& next) override { stager_->announce(next); }
  void check_step(std::int32_t node, cudaStream_t stream) const;
  void adopt_variables(cudaStream_t stream);
  void* pointer(ValueRef ref) const {
    return ptr_[static_cast<std::size_t>(ref.node)][static_cast<std::size_t>(ref.index)];
  }

  Graph graph_;
  CudaOptions options_;
  MemoryPlan plan_;
  std::size_t arena_bytes_ = 0;
  std::shared_ptr<Storage> arena_;
  std::vector<std::vector<void*>> ptr_;        // device pointer of every value
  std::unique_ptr<cuda::InputStager> stager_;  // the inputs' device buffers and their copies
  std::vector<Tensor> constants_;              // fills and tensor constants, on the device
  std::vector<std::pair<VariablePtr, Tensor>> variables_;  // adopted device tensors
  std::vector<std::unique_ptr<CudaFusedKernel>> fused_;
  std::vector<int> stream_of_;  // backends/schedule
  std::vector<Step> steps_;
  std::vector<int> event_of_;               // node -> cross-stream event, or -1
  std::vector<std::size_t> producer_step_;  // node -> its step
  std::map<std::int32_t, std::vector<std::int32_t>>
      run_after_;  // in-place update -> readers of the old value
  std::vector<cudaStream_t> streams_;
  std::vector<cudaEvent_t> events_;  // cross-stream events, then fork and joins
  cudaEvent_t fork_ = nullptr;
  std::vector<cudaEvent_t> joins_;  // per side stream
  std::size_t first_update_ = 0;    // index of the first variable-update step
  cudaEvent_t step_begin_ = nullptr,
              step_end_ = nullptr;  // timing events around the step's kernels
  double last_step_ms_ = -1;
  std::string trace_path_;
  Tensor workspace_, side_workspace_, status_;
  bool has_one_hot_ = false;
  std::int64_t one_hot_classes_ = 0;
  cudaGraphExec_t graph_exec_ = nullptr;
  int runs_ = 0;
};

CudaProgram::CudaProgram(const Graph& compiled, const CudaOptions& options)
    : graph_(compiled),
      options_(options),
      stream_of_(assign_streams(graph_, std::max(1, options.streams))) {
  plan_ = plan_memory(graph_, stream_of_);
  streams_.resize(
      static_cast<std::size_t>(*std::max_element(stream_of_.begin(), stream_of_.end()) + 1));
  for (cudaStream_t& s : streams_)
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  KILN_CUDA_CHECK(cudaEventCreate(&step_begin_));
  KILN_CUDA_CHECK(cudaEventCreate(&step_end_));
  joins_.resize(streams_.size(), nullptr);
  for (std::size_t s = 1; s < streams_.size(); ++s)
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&joins_[s], cudaEventDisableTiming));
  cuda::set_allow_tf32(options.tf32);
  if (options.deterministic)
    for (cudaStream_t s : streams_)
      KILN_CUBLAS_CHECK(cublasSetAtomicsMode(cuda::handle_for(s), CUBLAS_ATOMICS_NOT_ALLOWED));
  bind_buffers();
  prepare_launches();
}

CudaProgram::~CudaProgram() {
  if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
  for (cudaStream_t s : streams_) {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (cudaEvent_t e : joins_)
    if (e) cudaEventDestroy(e);
  if (fork_) cudaEventDestroy(fork_);
  if (step_begin_) cudaEventDestroy(step_begin_);
  if (step_end_) cudaEventDestroy(step_end_);
}

void CudaProgram::bind_buffers() {
  std::vector<std::size_t> offset(plan_.slot_bytes.size());
  for (std::size_t s = 0; s < plan_.slot_bytes.size(); ++s) {
    offset[s] = arena_bytes_;
    arena_bytes_ += align_up(plan_.slot_bytes[s]);
  }
  arena_ = cuda::device_allocator().allocate(std::max<std::size_t>(arena_bytes_, kAlign));
  auto* base = static_cast<char*>(arena_->data());
  ptr_.resize(graph_.nodes().size());
  std::vector<std::int32_t> input_nodes;
  for (std::size_t id = 0; id < graph_.nodes().size(); ++id)
    if (graph_.nodes()[id].op->id == OpId::input)
      input_nodes.push_back(static_cast<std::int32_t>(id));
  stager_ = std::make_unique<cuda::InputStager>(graph_, input_nodes);
  std::size_t next_input = 0;
  for (std::size_t id = 0; id < graph_.nodes().size(); ++id) {
    const Node& n = graph_.nodes()[id];
    auto& out = ptr_[id];
    out.assign(n.outputs.size(), nullptr);
    if (n.op->id == OpId::input) {
      out[0] = stager_->buffer(next_input++);
    } else if (n.op->id == OpId::variable) {
      if (n.variable->value.device().is_cpu())
        n.variable->value = cuda::to_device(n.variable->value);  // parameters move to the GPU
      variables_.emplace_back(n.variable, n.variable->value);
      out[0] = n.variable->value.raw();
    } else if (n.op->id == OpId::fill || n.op->id == OpId::tensor_constant) {
      const Tensor host =
          n.op->id == OpId::fill
              ? Tensor::full(n.outputs[0].shape, n.attrs.real("value"), n.outputs[0].dtype)
              : n.constant;
      constants_.push_back(cuda::to_device(host));
      out[0] = constants_.back().raw();
    } else if (n.op->alias) {
      out[0] = pointer(n.inputs[0]);
    } else {
      for (std::size_t i = 0; i < n.outputs.size(); ++i)
        out[i] = base + offset[static_cast<std::size_t>(plan_.slot[id][i])];
    }
  }
  // Updates that are safe in place write straight into the variables (no copy at the end).
  const std::vector<InPlaceUpdate> in_place = in_place_updates(graph_);
  for (std::size_t k = 0; k < in_place.size(); ++k) {
    const auto& [var, ref] = graph_.assignments()[k];
    // The group then reads the old value and writes the new one at the same element index
    // (its only access to both), so the __restrict__ on its parameters is never contradicted.
    if (!in_place[k].in_place || var->value.device().is_cpu()) continue;
    ptr_[static_cast<std::size_t>(ref.node)][static_cast<std::size_t>(ref.index)] =
        var->value.raw();
    auto& after = run_after_[ref.node];
    after.insert(after.end(), in_place[k].after.begin(), in_place[k].after.end());
  }
}

void CudaProgram::prepare_launches() {
  std::vector<const FusedGroup*> groups;
  std::vector<gpu::KernelSource> sources;  // hand-written kernels the launches will use
  std::set<std::string> source_names;
  std::size_t workspace = 0;
  for (const Node& n : graph_.nodes()) {
    if (n.body) groups.push_back(dynamic_cast<const FusedGroup*>(n.body.get()));
    std::vector<TensorType> types;
    for (const ValueRef& r : n.inputs) types.push_back(graph_.type(r));
    workspace = std::max(workspace, cuda::workspace_bytes_for(n, types));
    for (gpu::KernelSource& source : cuda::kernel_sources_for(n, types))
      if (source_names.insert(source.name).second) sources.push_back(std::move(source));
    if (n.op->id == OpId::one_hot) {
      has_one_hot_ = true;
      one_hot_classes_ = n.attrs.integer("classes");
    }
  }
  // Both sets compile in parallel (through the kernel cache), side by side.
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  std::future<void> hand_written = std::async(std::launch::async, [&sources, device] {
    KILN_CUDA_CHECK(cudaSetDevice(device));  // the current device is per thread
    cuda::preload_kernels(sources);
  });
  fused_ = compile_fused_kernels(groups);
  hand_written.get();
  if (workspace > 0) {
    workspace_ = Tensor(cuda::device_allocator().allocate(workspace), 0,
                        {static_cast<std::int64_t>(workspace)}, DType::u8);
    if (streams_.size() > 1)
      side_workspace_ = Tensor(cuda::device_allocator().allocate(workspace), 0,
                               {static_cast<std::int64_t>(workspace)}, DType::u8);
  }
  event_of_.assign(graph_.nodes().size(), -1);
  producer_step_.assign(graph_.nodes().size(), 0);
  status_ = Tensor(cuda::device_allocator().allocate(cuda::kOneHotStatusBytes), 0,
                   {static_cast<std::int64_t>(cuda::kOneHotStatusBytes)}, DType::u8);
  std::size_t next_group = 0;
  for (const Node& n : graph_.nodes()) {
    if (n.op->kind == OpKind::source || n.op->alias) continue;
    const std::size_t id = static_cast<std::size_t>(&n - graph_.nodes().data());
    std::vector<const void*> in;
    std::vector<TensorType> types;
    for (const ValueRef& r : n.inputs) {
      in.push_back(pointer(r));
      types.push_back(graph_.type(r));
    }
    if (n.body) {
      const CudaFusedKernel* kernel = fused_[next_group++].get();
      std::vector<void*> out = ptr_[id];
      add_step(static_cast<std::int32_t>(id), n.body->summary(),
               [kernel, in, out](gpu::Stream s) { kernel->launch(in, out, s); });
      continue;
    }
    // The convolution workspace is shared, so convolutions stay on one stream (the schedule puts
    // weight gradients on the side stream; the workspace then needs its own copy there).
    const bool side = stream_of_[id] != 0;
    void* ws = workspace_.defined()
                   ? (side && side_workspace_.defined() ? side_workspace_.raw() : workspace_.raw())
                   : nullptr;
    cuda::LaunchSetup setup{n, types, in, ptr_[id], ws, workspace, status_.raw()};
    add_step(static_cast<std::int32_t>(id), n.op->name, cuda::prepare_launch(setup));
  }
  // Assignments: the new values are copied into the variables' storage at the end of the step.
  first_update_ = steps_.size();
  for (const auto& [var, ref] : graph_.assignments()) {
    void* dst = nullptr;
    for (const auto& [adopted, tensor] : variables_)
      if (adopted == var) dst = tensor.raw();
    KILN_ASSERT(dst != nullptr, "assigned variable {} is not read by the step", var->name);
    const void* src = pointer(ref);
    const std::size_t bytes = var->value.nbytes();
    if (src == dst) continue;
    Step copy{0, -1, {}, -1, "update " + var->name, [=](gpu::Stream s) {
                KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
              }};
    steps_.push_back(std::move(copy));  // on stream 0, after the side streams have joined
  }
  log().debug(
      "cuda program: {} launches on {} streams, {} fused kernels, arena {} bytes, workspace {} "
      "bytes",
      steps_.size(), streams_.size(), fused_.size(), arena_bytes_, workspace);
}

// A launch on its scheduled stream, waiting for the values it reads from other streams.
void CudaProgram::add_step(std::int32_t node, std::string label, cuda::Launch launch) {
  Step step{stream_of_[static_cast<std::size_t>(node)],
            node,
            {},
            -1,
            std::move(label),
            std::move(launch)};
  auto wait_for = [&](std::int32_t producer) {  // a node launched earlier
    if (graph_.node(producer).op->kind == OpKind::source ||
        stream_of_[static_cast<std::size_t>(producer)] == step.stream)
      return;
    int& event = event_of_[static_cast<std::size_t>(producer)];
    if (event < 0) {
      event = static_cast<int>(events_.size());
      events_.emplace_back();
      KILN_CUDA_CHECK(cudaEventCreateWithFlags(&events_.back(), cudaEventDisableTiming));
      steps_[producer_step_[static_cast<std::size_t>(producer)]].record = event;
    }
    if (std::find(step.waits.begin(), step.waits.end(), event) == step.waits.end())
      step.waits.push_back(event);
  };
  for (const ValueRef& in : graph_.node(node).inputs) {
    ValueRef root = in;
    while (graph_.node(root.node).op->alias) root = graph_.node(root.node).inputs[0];
    wait_for(root.node);
  }
  if (auto after = run_after_.find(node); after != run_after_.end())
    for (std::int32_t reader : after->second)
      wait_for(reader);  // in-place update: old value read first
  producer_step_[static_cast<std::size_t>(node)] = steps_.size();
  steps_.push_back(std::move(step));
}

// Forks the side streams from stream 0, launches every step on its stream with its event
// waits, and joins them back; with `trace`, each launch is bracketed by timing events.
void CudaProgram::execute(std::vector<TraceEvent>* trace) {
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
    const Step& step = steps_[k];
    cudaStream_t stream = streams_[static_cast<std::size_t>(step.stream)];
    if (k == first_update_) join();  // variable updates run after the side streams join
    for (int e : step.waits)
      KILN_CUDA_CHECK(cudaStreamWaitEvent(stream, events_[static_cast<std::size_t>(e)]));
    if (trace) timing_event(stream);
    step.launch(stream);
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
    trace->push_back({steps_[k].label, steps_[k].stream, 1000.0 * start, 1000.0 * (end - start)});
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
    out.push_back(host_copy(ptr_[static_cast<std::size_t>(node)][i], n.outputs[i]));
  check_numerics(graph_, node, in, out, runs_);
}

// Variables are adopted by their device tensor; a host tensor the user assigned since
// (a new learning rate, a loaded checkpoint) is uploaded into the adopted buffer.
void CudaProgram::adopt_variables(cudaStream_t stream) {
  for (auto& [var, adopted] : variables_) {
    if (var->value.storage() == adopted.storage()) continue;
    KILN_CHECK(var->value.shape() == adopted.shape() && var->value.dtype() == adopted.dtype(),
               "run: variable '{}' is now {}{} but was compiled as {}{}", var->name,
               dtype_name(var->value.dtype()), var->value.shape().str(),
               dtype_name(adopted.dtype()), adopted.shape().str());
    KILN_CUDA_CHECK(cudaMemcpyAsync(adopted.raw(), var->value.raw(), adopted.nbytes(),
                                    cudaMemcpyDefault, stream));
    if (var->value.device().is_cpu())
      KILN_CUDA_CHECK(cudaStreamSynchronize(stream));  // the host tensor may go away
    var->value = adopted;
  }
}

Outputs CudaProgram::run(const std::vector<Feed>& feeds) {
  check_feed_names(graph_, feeds);
  cudaStream_t main = streams_[0];
  stager_->load(feeds, main);
  adopt_variables(main);
  ++runs_;
  KILN_CUDA_CHECK(cudaEventRecord(step_begin_, main));
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
      KILN_CUDA_CHECK(cudaGraphInstantiate(&graph_exec_, captured, 0));
      KILN_CUDA_CHECK(cudaGraphDestroy(captured));
      log().debug("cuda program: step captured as a CUDA graph");
    }
    KILN_CUDA_CHECK(cudaGraphLaunch(graph_exec_, main));
  }
  KILN_CUDA_CHECK(cudaEventRecord(step_end_, main));
  stager_->stage();  // the next batch crosses the bus while this step computes
  Outputs outputs;
  for (const auto& [name, ref] : graph_.outputs()) {
    const TensorType& t = graph_.type(ref);
    Tensor host = Tensor::empty(t.shape, t.dtype);
    KILN_CUDA_CHECK(
        cudaMemcpyAsync(host.raw(), pointer(ref), host.nbytes(), cudaMemcpyDeviceToHost, main));
    outputs[name] = host;
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(main));
  float step_ms = 0;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&step_ms, step_begin_, step_end_));
  last_step_ms_ = step_ms;
  if (has_one_hot_)
    cuda::check_one_hot_status(cuda::read_one_hot_status(status_.raw(), main), one_hot_classes_);
  return outputs;
}

}  // namespace

std::unique_ptr<Program> make_cuda_program(const Graph& compiled, const CudaOptions& options) {
  KILN_CHECK(gpu::cuda_device_count() > 0, "device cuda: {}", gpu::cuda_unavailable_reason());
  return std::make_unique<CudaProgram>(compiled, options);
}

}  // namespace kiln
