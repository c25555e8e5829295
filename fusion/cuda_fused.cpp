// Launch configuration from occupancy, and batch compilation of fused kernels.
#include "fusion/cuda_fused.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "fusion/jit/cuda_check.h"
#include "fusion/jit/kernel_cache.h"

namespace kiln {
namespace {

struct DeviceLimits {
  int sms = 0;
  int max_threads_per_sm = 0;
};

DeviceLimits device_limits() {
  int device = 0;
  DeviceLimits l;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&l.max_threads_per_sm,
                                         cudaDevAttrMaxThreadsPerMultiProcessor, device));
  return l;
}

// The block size with the most resident threads per SM (smaller wins a tie: more blocks
// to spread the grid over); reductions need a multiple of 32 up to 1024, as all do.
LaunchShape choose_launch(const jit::LoadedKernel& kernel, const std::string& name,
                          std::int64_t work_items, int vector_width) {
  const DeviceLimits limits = device_limits();
  const int max_block = std::min(kernel.attributes().max_threads_per_block, 1024);
  LaunchShape best;
  int best_threads = -1;
  for (int block = 64; block <= max_block; block *= 2) {
    const int blocks = kernel.max_active_blocks_per_sm(block, 0);
    if (blocks * block > best_threads) {
      best_threads = blocks * block;
      best.block = {static_cast<unsigned>(block), 1, 1};
      best.blocks_per_sm = blocks;
    }
  }
  KILN_CHECK(best_threads > 0, "kernel {} cannot run at any block size", name);
  best.occupancy =
      static_cast<double>(best_threads) / static_cast<double>(limits.max_threads_per_sm);
  const std::int64_t resident = static_cast<std::int64_t>(limits.sms) * best.blocks_per_sm;
  const std::int64_t per_block =
      vector_width == 0 ? 1 : static_cast<std::int64_t>(best.block.x) * vector_width;
  const std::int64_t wanted = std::max<std::int64_t>(1, (work_items + per_block - 1) / per_block);
  // Elementwise kernels get one thread per item (per float4) however large: on the H200 a
  // full grid reaches 4.25 TB/s on the fused chain where a grid of resident blocks looping
  // reaches 3.98 (more loads in flight). Reductions loop over their jobs with resident blocks.
  const std::int64_t cap = vector_width == 0 ? resident : std::int64_t{0x7fffffff};
  best.grid = {static_cast<unsigned>(std::min(wanted, cap)), 1, 1};
  return best;
}

}  // namespace

// A reduction runs one block per job (work_items jobs); elementwise kernels cover their
// elements with a grid-stride loop (vector_width elements per thread per iteration).
CudaFusedKernel::CudaFusedKernel(CudaKernelSource source, const jit::CompiledKernel& compiled)
    : source_(std::move(source)), kernel_(compiled) {
  shape_ = choose_launch(kernel_, source_.name, source_.work_items,
                         source_.reduction ? 0 : source_.vector_width);
  if (source_.splits <= 1) return;
  finish_ = std::make_unique<jit::LoadedKernel>(compiled.cubin, source_.finish_name);
  finish_shape_ = choose_launch(*finish_, source_.finish_name, source_.reduced_outputs, 1);
  const std::size_t element = source_.source.find("typedef double T;") != std::string::npos ? 8 : 4;
  // One partial result per output and split (work_items counts jobs: a column job covers 32
  // outputs).
  KILN_CUDA_CHECK(cudaMalloc(
      &partial_, static_cast<std::size_t>(source_.reduced_outputs * source_.splits) * element));
}

CudaFusedKernel::~CudaFusedKernel() {
  if (partial_) cudaFree(partial_);
}

void CudaFusedKernel::launch(const std::vector<const void*>& inputs,
                             const std::vector<void*>& outputs, jit::Stream stream) const {
  std::vector<const void*> pointers(inputs.begin(), inputs.end());
  pointers.insert(pointers.end(), outputs.begin(), outputs.end());
  void* reduced = nullptr;
  if (finish_) {  // the main kernel writes partial results; the finisher writes the output
    reduced = const_cast<void*>(pointers.back());
    pointers.back() = partial_;
  }
  std::vector<void*> args;
  for (const void*& p : pointers) args.push_back(static_cast<void*>(&p));
  kernel_.launch(shape_.grid, shape_.block, 0, stream, args.data());
  if (!finish_) return;
  const void* partial = partial_;
  void* finish_args[] = {&partial, &reduced};
  finish_->launch(finish_shape_.grid, finish_shape_.block, 0, stream, finish_args);
}

std::vector<std::unique_ptr<CudaFusedKernel>> compile_fused_kernels(
    const std::vector<const FusedGroup*>& groups) {
  std::vector<CudaKernelSource> sources;
  std::vector<jit::KernelSource> requests;
  for (const FusedGroup* g : groups) {
    sources.push_back(generate_cuda(*g));
    requests.push_back({sources.back().name, sources.back().source, {}});
  }
  const std::vector<jit::CompiledKernel> compiled =
      jit::global_kernel_cache().get_or_compile(requests, jit::current_target());
  std::vector<std::unique_ptr<CudaFusedKernel>> kernels;
  for (std::size_t i = 0; i < groups.size(); ++i)
    kernels.push_back(std::make_unique<CudaFusedKernel>(sources[i], compiled[i]));
  return kernels;
}

}  // namespace kiln
