// CudaProgram: buffers (arena slots, inputs, constants, adopted variables), launches,
// and run = feeds in, step (direct, captured, or replayed), updates, outputs out.
#include "backends/cuda/cuda_program.h"

#include <cuda_runtime_api.h>

#include "backends/cuda/cublas_handle.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/device_allocator.h"
#include "backends/cuda/layout.h"
#include "backends/cuda/transfer.h"
#include "backends/feeds.h"
#include "backends/plan.h"
#include "core/log.h"
#include "fusion/cuda_fused.h"
#include "fusion/jit/cuda_check.h"

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

 private:
  void bind_buffers();
  void prepare_launches();
  void execute(cudaStream_t stream) const;
  void adopt_variables(cudaStream_t stream);
  void* pointer(ValueRef ref) const { return ptr_[static_cast<std::size_t>(ref.node)][static_cast<std::size_t>(ref.index)]; }

  Graph graph_;
  CudaOptions options_;
  MemoryPlan plan_;
  std::size_t arena_bytes_ = 0;
  std::shared_ptr<Storage> arena_;
  std::vector<std::vector<void*>> ptr_;              // device pointer of every value
  std::vector<std::pair<std::int32_t, Tensor>> inputs_;  // input node -> its device buffer
  std::vector<Tensor> constants_;                    // fills and tensor constants, on the device
  std::vector<std::pair<VariablePtr, Tensor>> variables_;  // adopted device tensors
  std::vector<std::unique_ptr<CudaFusedKernel>> fused_;
  std::vector<cuda::Launch> launches_;
  Tensor workspace_, status_;
  bool has_one_hot_ = false;
  std::int64_t one_hot_classes_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaGraphExec_t graph_exec_ = nullptr;
  int runs_ = 0;
};

CudaProgram::CudaProgram(const Graph& compiled, const CudaOptions& options) : graph_(compiled), options_(options), plan_(plan_memory(graph_)) {
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  cuda::set_allow_tf32(options.tf32);
  bind_buffers();
  prepare_launches();
}

CudaProgram::~CudaProgram() {
  if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
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
  for (std::size_t id = 0; id < graph_.nodes().size(); ++id) {
    const Node& n = graph_.nodes()[id];
    auto& out = ptr_[id];
    out.assign(n.outputs.size(), nullptr);
    if (n.op->name == "input") {
      inputs_.emplace_back(static_cast<std::int32_t>(id), Tensor(cuda::device_allocator().allocate(n.outputs[0].shape.numel() * dtype_size(n.outputs[0].dtype)), 0, n.outputs[0].shape, n.outputs[0].dtype));
      out[0] = inputs_.back().second.raw();
    } else if (n.op->name == "variable") {
      if (n.variable->value.device().is_cpu()) n.variable->value = cuda::to_device(n.variable->value);  // parameters move to the GPU
      variables_.emplace_back(n.variable, n.variable->value);
      out[0] = n.variable->value.raw();
    } else if (n.op->name == "fill" || n.op->name == "tensor_constant") {
      const Tensor host = n.op->name == "fill" ? Tensor::full(n.outputs[0].shape, n.attrs.real("value"), n.outputs[0].dtype) : n.constant;
      constants_.push_back(cuda::to_device(host));
      out[0] = constants_.back().raw();
    } else if (n.op->alias) {
      out[0] = pointer(n.inputs[0]);
    } else {
      for (std::size_t i = 0; i < n.outputs.size(); ++i) out[i] = base + offset[static_cast<std::size_t>(plan_.slot[id][i])];
    }
  }
}

void CudaProgram::prepare_launches() {
  std::vector<const FusedGroup*> groups;
  std::size_t workspace = 0;
  for (const Node& n : graph_.nodes()) {
    if (n.body) groups.push_back(dynamic_cast<const FusedGroup*>(n.body.get()));
    std::vector<TensorType> types;
    for (const ValueRef& r : n.inputs) types.push_back(graph_.type(r));
    workspace = std::max(workspace, cuda::workspace_bytes_for(n, types));
    if (n.op->name == "one_hot") {
      has_one_hot_ = true;
      one_hot_classes_ = n.attrs.integer("classes");
    }
  }
  fused_ = compile_fused_kernels(groups);  // in parallel, through the kernel cache
  if (workspace > 0) workspace_ = Tensor(cuda::device_allocator().allocate(workspace), 0, {static_cast<std::int64_t>(workspace)}, DType::u8);
  status_ = Tensor(cuda::device_allocator().allocate(cuda::kOneHotStatusBytes), 0, {static_cast<std::int64_t>(cuda::kOneHotStatusBytes)}, DType::u8);
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
      launches_.push_back([kernel, in, out](jit::Stream s) { kernel->launch(in, out, s); });
      continue;
    }
    cuda::LaunchSetup setup{n, types, in, ptr_[id], workspace_.defined() ? workspace_.raw() : nullptr, workspace, status_.raw()};
    launches_.push_back(cuda::prepare_launch(setup));
  }
  // Assignments: the new values are copied into the variables' storage at the end of the step.
  for (const auto& [var, ref] : graph_.assignments()) {
    void* dst = nullptr;
    for (const auto& [adopted, tensor] : variables_)
      if (adopted == var) dst = tensor.raw();
    KILN_ASSERT(dst != nullptr, "assigned variable {} is not read by the step", var->name);
    const void* src = pointer(ref);
    const std::size_t bytes = var->value.nbytes();
    if (src != dst) launches_.push_back([=](jit::Stream s) { KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s)); });
  }
  log().debug("cuda program: {} launches, {} fused kernels, arena {} bytes, workspace {} bytes", launches_.size(), fused_.size(), arena_bytes_, workspace);
}

void CudaProgram::execute(cudaStream_t stream) const {
  for (const cuda::Launch& launch : launches_) launch(stream);
}

// Variables are adopted by their device tensor; a host tensor the user assigned since
// (a new learning rate, a loaded checkpoint) is uploaded into the adopted buffer.
void CudaProgram::adopt_variables(cudaStream_t stream) {
  for (auto& [var, adopted] : variables_) {
    if (var->value.storage() == adopted.storage()) continue;
    KILN_CHECK(var->value.shape() == adopted.shape() && var->value.dtype() == adopted.dtype(), "run: variable '{}' is now {}{} but was compiled as {}{}",
               var->name, dtype_name(var->value.dtype()), var->value.shape().str(), dtype_name(adopted.dtype()), adopted.shape().str());
    KILN_CUDA_CHECK(cudaMemcpyAsync(adopted.raw(), var->value.raw(), adopted.nbytes(), cudaMemcpyDefault, stream));
    var->value = adopted;
  }
}

Outputs CudaProgram::run(const std::vector<Feed>& feeds) {
  check_feed_names(graph_, feeds);
  for (const auto& [node, buffer] : inputs_) {
    const Tensor& t = feed_for(graph_.node(node), feeds);
    KILN_CUDA_CHECK(cudaMemcpyAsync(buffer.raw(), t.raw(), t.nbytes(), cudaMemcpyDefault, stream_));
  }
  adopt_variables(stream_);
  ++runs_;
  if (!options_.graphs || runs_ == 1) {
    execute(stream_);  // the first run also warms up cuBLAS and loads every kernel
  } else {
    if (!graph_exec_) {
      cudaGraph_t captured = nullptr;
      KILN_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      execute(stream_);
      KILN_CUDA_CHECK(cudaStreamEndCapture(stream_, &captured));
      KILN_CUDA_CHECK(cudaGraphInstantiate(&graph_exec_, captured, 0));
      KILN_CUDA_CHECK(cudaGraphDestroy(captured));
      log().debug("cuda program: step captured as a CUDA graph");
    }
    KILN_CUDA_CHECK(cudaGraphLaunch(graph_exec_, stream_));
  }
  Outputs outputs;
  for (const auto& [name, ref] : graph_.outputs()) {
    const TensorType& t = graph_.type(ref);
    Tensor host = Tensor::empty(t.shape, t.dtype);
    KILN_CUDA_CHECK(cudaMemcpyAsync(host.raw(), pointer(ref), host.nbytes(), cudaMemcpyDeviceToHost, stream_));
    outputs[name] = host;
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (has_one_hot_) cuda::check_one_hot_status(cuda::read_one_hot_status(status_.raw(), stream_), one_hot_classes_);
  return outputs;
}

}  // namespace

std::unique_ptr<Program> make_cuda_program(const Graph& compiled, const CudaOptions& options) {
  KILN_CHECK(jit::cuda_device_count() > 0, "device cuda: {}", jit::cuda_unavailable_reason());
  return std::make_unique<CudaProgram>(compiled, options);
}

}  // namespace kiln
