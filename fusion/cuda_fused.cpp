// Launch configuration from occupancy, and batch compilation of fused kernels.
#include "fusion/cuda_fused.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "gpu/block_size.h"
#include "gpu/cuda_check.h"
#include "gpu/kernel_cache.h"

namespace kiln {
namespace {

// The occupancy-best block (gpu/block_size.h) and a grid for `work_items`; `block_threads`
// (CudaKernelSource's) a reduction's own block where that keeps as many threads resident an SM,
// counting the jobs: a grid of J blocks of B threads fills at most J B / SMs threads an SM, so
// batch norm's 1024 jobs in blocks of 64 filled 496 of an H100 SM's 2048 whatever the
// registers allowed (ncu: 23 % of the warps resident).
LaunchShape choose_launch(const gpu::LoadedKernel& kernel, std::int64_t work_items,
                          int vector_width, int block_threads = 0, bool forced = false) {
  const gpu::DeviceLimits limits = gpu::current_device_limits();
  gpu::BlockChoice choice = gpu::choose_block_size(kernel);
  auto filled = [&](int block, int per_sm) {
    return std::min<std::int64_t>(std::int64_t{block} * per_sm,
                                  work_items * block / std::max(1, limits.sms));
  };
  const int own_per_sm = block_threads > 0 ? kernel.max_active_blocks_per_sm(block_threads, 0) : 0;
  if (own_per_sm > 0 &&
      (forced || filled(block_threads, own_per_sm) >= filled(choice.block, choice.blocks_per_sm))) {
    choice.blocks_per_sm = own_per_sm;
    choice.block = block_threads;
  }
  // Elementwise kernels (and finishers) in blocks of 256 where that keeps the occupancy: the
  // smallest block that reaches it (64) made the H200 schedule 4x the blocks, and 256 was
  // faster on every zoo step in bf16 (dcgan at batch 256: 1.695 -> 1.581 ms; resnet 2.660 ->
  // 2.591). Reductions keep the smallest: a block per job, and more of them resident.
  constexpr int kStreamingBlock = 256;
  if (vector_width > 0 && choice.block < kStreamingBlock &&
      kernel.max_active_blocks_per_sm(kStreamingBlock, 0) * kStreamingBlock >=
          choice.block * choice.blocks_per_sm) {
    choice.blocks_per_sm = kernel.max_active_blocks_per_sm(kStreamingBlock, 0);
    choice.block = kStreamingBlock;
  }
  LaunchShape best;
  best.block = {static_cast<unsigned>(choice.block), 1, 1};
  best.blocks_per_sm = choice.blocks_per_sm;
  const int best_threads = choice.block * choice.blocks_per_sm;
  best.occupancy =
      static_cast<double>(best_threads) / static_cast<double>(limits.max_threads_per_sm);
  const std::int64_t resident = static_cast<std::int64_t>(limits.sms) * best.blocks_per_sm;
  const std::int64_t per_block =
      vector_width == 0 ? 1 : static_cast<std::int64_t>(best.block.x) * vector_width;
  const std::int64_t wanted = std::max<std::int64_t>(1, (work_items + per_block - 1) / per_block);
  // Elementwise kernels get one thread per item (per float4) however large: on the H200 a
  // full grid reaches 4.25 TB/s on the fused chain where a grid of resident blocks looping
  // reaches 3.98 (more loads in flight). Reductions loop over their jobs with resident blocks.
  const std::int64_t cap =
      vector_width == 0 && block_threads == 0 ? resident : std::int64_t{0x7fffffff};
  best.grid = {static_cast<unsigned>(std::min(wanted, cap)), 1, 1};
  return best;
}

}  // namespace

// A reduction runs one block per job (work_items jobs); elementwise kernels cover their
// elements with a grid-stride loop (vector_width elements per thread per iteration).
CudaFusedKernel::CudaFusedKernel(CudaKernelSource source, const gpu::CompiledKernel& compiled)
    : source_(std::move(source)), kernel_(compiled) {
  shape_ = choose_launch(kernel_, source_.work_items, source_.reduction ? 0 : source_.vector_width,
                         source_.block_threads, source_.block_forced);
  if (source_.warp_jobs) {  // blocks enough for a warp per row
    const std::int64_t warps = std::max<unsigned>(1, shape_.block.x / 32);
    shape_.grid.x = static_cast<unsigned>(
        std::min<std::int64_t>(shape_.grid.x, (source_.work_items + warps - 1) / warps));
  }
  if (source_.splits <= 1) return;
  if (source_.split_jobs > 0) {  // as many splits as fill the resident blocks once
    const std::int64_t slots =
        std::int64_t{shape_.blocks_per_sm} * gpu::current_device_limits().sms;
    launch_splits_ = std::clamp<std::int64_t>(slots / source_.split_jobs, 1, source_.splits);
    shape_.grid.x = static_cast<unsigned>(source_.split_jobs * launch_splits_);
  }
  const std::size_t element = source_.source.find("typedef double T;") != std::string::npos ? 8 : 4;
  // One partial result per output and split (work_items counts jobs: a column job covers 32
  // outputs).
  partial_stride_ = static_cast<std::size_t>(source_.reduced_outputs * source_.splits) * element;
  KILN_CUDA_CHECK(
      cudaMalloc(&partial_, partial_stride_ * static_cast<std::size_t>(source_.reductions)));
  if (source_.finish_in_kernel) {  // the counts start at 0 and the last block sets them back
    const std::size_t bytes = static_cast<std::size_t>(source_.reduced_outputs) * sizeof(unsigned);
    KILN_CUDA_CHECK(cudaMalloc(&arrivals_, bytes));
    KILN_CUDA_CHECK(cudaMemset(arrivals_, 0, bytes));
    return;
  }
  finish_ = std::make_unique<gpu::LoadedKernel>(compiled.cubin, source_.finish_name,
                                                compiled.after_prior_grids);
  if (source_.finish_threads > 32) {  // a block an output
    finish_shape_.block = {static_cast<unsigned>(source_.finish_threads), 1, 1};
    finish_shape_.grid = {static_cast<unsigned>(std::min<std::int64_t>(source_.reduced_outputs,
                                                                       std::int64_t{0x7fffffff})),
                          1, 1};
  } else {
    finish_shape_ = choose_launch(*finish_, source_.reduced_outputs * 32, 1);  // a warp an output
  }
}

CudaFusedKernel::~CudaFusedKernel() {
  if (partial_) cudaFree(partial_);
  if (arrivals_) cudaFree(arrivals_);
}

void CudaFusedKernel::launch(const std::vector<const void*>& inputs,
                             const std::vector<void*>& outputs, gpu::Stream stream) const {
  std::vector<const void*> pointers(inputs.begin(), inputs.end());
  pointers.insert(pointers.end(), outputs.begin(), outputs.end());
  // With splits the main kernel writes each reduction's partial results and the finisher the
  // reduced outputs (the `reductions` pointers before the row outputs, which are the last) and,
  // where the group has them, from its inputs the row outputs.
  std::vector<const void*> finish_pointers;
  if (source_.finish_in_kernel) {  // (..., partials, row outputs, arrivals, reduced outputs)
    const auto reductions = static_cast<std::size_t>(source_.reductions);
    const std::size_t first =
        pointers.size() - reductions - static_cast<std::size_t>(source_.row_outputs);
    pointers.push_back(arrivals_);
    for (std::size_t r = 0; r < reductions; ++r) {
      const void* reduced = pointers[first + r];
      pointers[first + r] = static_cast<const char*>(partial_) + r * partial_stride_;
      pointers.push_back(reduced);
    }
  } else if (finish_) {
    finish_pointers.push_back(partial_);
    const auto reductions = static_cast<std::size_t>(source_.reductions);
    const auto rows = static_cast<std::size_t>(source_.row_outputs);
    const std::size_t first = pointers.size() - reductions - rows;
    for (std::size_t r = 0; r < reductions; ++r) {
      finish_pointers.push_back(pointers[first + r]);
      pointers[first + r] = static_cast<const char*>(partial_) + r * partial_stride_;
    }
    if (rows > 0) {
      finish_pointers.insert(finish_pointers.end(), inputs.begin(), inputs.end());
      finish_pointers.insert(finish_pointers.end(),
                             outputs.end() - static_cast<std::ptrdiff_t>(rows), outputs.end());
    }
  }
  std::vector<void*> args;
  for (const void*& p : pointers) args.push_back(static_cast<void*>(&p));
  kernel_.launch(shape_.grid, shape_.block, 0, stream, args.data());
  if (!finish_) return;
  std::vector<void*> finish_args;
  for (const void*& p : finish_pointers) finish_args.push_back(static_cast<void*>(&p));
  long long splits = launch_splits_;
  if (source_.split_jobs > 0) finish_args.insert(finish_args.begin() + 1, &splits);
  finish_->launch(finish_shape_.grid, finish_shape_.block, 0, stream, finish_args.data());
}

// The table of generate_cuda_horizontal: per segment n, first tile, whether it takes vectors,
// input and output pointers.
CudaHorizontalKernel::CudaHorizontalKernel(CudaKernelSource source,
                                           const gpu::CompiledKernel& compiled,
                                           const std::vector<const FusedGroup*>& groups,
                                           const std::vector<std::vector<const void*>>& inputs,
                                           const std::vector<std::vector<void*>>& outputs)
    : source_(std::move(source)), kernel_(compiled), segments_(static_cast<int>(groups.size())) {
  std::vector<std::int64_t> table;
  std::int64_t tiles = 0;
  for (std::size_t s = 0; s < groups.size(); ++s) {
    const FusedGroup& g = *groups[s];
    const std::int64_t n = g.shape.numel();
    std::vector<const void*> in;
    for (std::size_t k = 0; k < g.inputs.size(); ++k) {
      const FusedInput& fi = g.inputs[k];  // a slice read in place starts at its offset
      in.push_back(static_cast<const char*>(inputs[s][k]) +
                   fi.offset * static_cast<std::int64_t>(dtype_size(fi.type.dtype)));
    }
    table.push_back(n);
    table.push_back(tiles);
    table.push_back(horizontal_segment_vectorized(g, in, outputs[s]) ? 1 : 0);
    tiles += (n + kHorizontalTile - 1) / kHorizontalTile;
    for (const void* p : in)
      table.push_back(static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(p)));
    for (void* out : outputs[s])
      table.push_back(static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(out)));
  }
  const std::size_t bytes = table.size() * sizeof(std::int64_t);
  KILN_CUDA_CHECK(cudaMalloc(&table_, bytes));
  KILN_CUDA_CHECK(cudaMemcpy(table_, table.data(), bytes, cudaMemcpyHostToDevice));
  const gpu::BlockChoice choice = gpu::choose_block_size(kernel_);
  shape_.block = {static_cast<unsigned>(choice.block), 1, 1};
  shape_.grid = {static_cast<unsigned>(std::max<std::int64_t>(1, tiles)), 1, 1};
  shape_.blocks_per_sm = choice.blocks_per_sm;
}

CudaHorizontalKernel::~CudaHorizontalKernel() {
  if (table_) cudaFree(table_);
}

void CudaHorizontalKernel::launch(gpu::Stream stream) const {
  const void* table = table_;
  int segments = segments_;
  void* args[] = {&table, &segments};
  kernel_.launch(shape_.grid, shape_.block, 0, stream, args);
}

std::vector<std::unique_ptr<CudaFusedKernel>> compile_fused_kernels(
    const std::vector<const FusedGroup*>& groups) {
  std::vector<CudaKernelSource> sources;
  std::vector<gpu::KernelSource> requests;
  for (const FusedGroup* g : groups) {
    sources.push_back(generate_cuda(*g));
    requests.push_back(
        {.name = sources.back().name, .code = sources.back().source, .after_prior_grids = true});
  }
  const std::vector<gpu::CompiledKernel> compiled =
      gpu::global_kernel_cache().get_or_compile(requests, gpu::current_target());
  std::vector<std::unique_ptr<CudaFusedKernel>> kernels;
  for (std::size_t i = 0; i < groups.size(); ++i)
    kernels.push_back(std::make_unique<CudaFusedKernel>(sources[i], compiled[i]));
  return kernels;
}

std::vector<std::unique_ptr<CudaHorizontalKernel>> compile_horizontal_kernels(
    const std::vector<HorizontalMembers>& launches) {
  if (launches.empty()) return {};
  std::vector<CudaKernelSource> sources;
  std::vector<gpu::KernelSource> requests;
  for (const HorizontalMembers& l : launches) {
    sources.push_back(generate_cuda_horizontal(*l.groups.front()));
    requests.push_back(
        {.name = sources.back().name, .code = sources.back().source, .after_prior_grids = true});
  }
  const std::vector<gpu::CompiledKernel> compiled =
      gpu::global_kernel_cache().get_or_compile(requests, gpu::current_target());
  std::vector<std::unique_ptr<CudaHorizontalKernel>> kernels;
  for (std::size_t i = 0; i < launches.size(); ++i)
    kernels.push_back(std::make_unique<CudaHorizontalKernel>(
        sources[i], compiled[i], launches[i].groups, launches[i].inputs, launches[i].outputs));
  return kernels;
}

}  // namespace kiln
