// A fused group compiled for the GPU: its generated source, the loaded kernel, and a
// launch that picks the block size with the occupancy API (not a constant).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fusion/codegen.h"
#include "gpu/cuda_runtime.h"

namespace kiln {

struct LaunchShape {
  gpu::Dim3 grid, block;
  int blocks_per_sm = 0;  // at this block size, from the occupancy API
  double occupancy = 0;   // active warps / the SM's maximum
};

class CudaFusedKernel {
 public:
  CudaFusedKernel(CudaKernelSource source, const gpu::CompiledKernel& compiled);
  ~CudaFusedKernel();
  CudaFusedKernel(const CudaFusedKernel&) = delete;
  CudaFusedKernel& operator=(const CudaFusedKernel&) = delete;

  // Pointers: the group's inputs, then its outputs, then the reduction output (device memory).
  void launch(const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
              gpu::Stream stream) const;
  const CudaKernelSource& source() const { return source_; }
  const LaunchShape& launch_shape() const { return shape_; }
  gpu::KernelAttributes attributes() const { return kernel_.attributes(); }

 private:
  CudaKernelSource source_;
  gpu::LoadedKernel kernel_;
  LaunchShape shape_;
  // Split reductions: the finishing kernel and the partial results (allocated once, here).
  std::unique_ptr<gpu::LoadedKernel> finish_;
  LaunchShape finish_shape_;
  long long launch_splits_ = 0;  // CudaKernelSource::split_jobs: the splits the launch picked
  void* partial_ = nullptr;
  std::size_t partial_stride_ = 0;  // bytes of one reduction's partial results
  void* arrivals_ = nullptr;        // CudaKernelSource::finish_in_kernel: a count an output
};

// A horizontal launch (backends/horizontal.h): one kernel over the segments of several groups
// of one kind (generate_cuda_horizontal), its segment table on the device, made once.
class CudaHorizontalKernel {
 public:
  // `groups`: the members; per member its inputs' and outputs' device pointers.
  CudaHorizontalKernel(CudaKernelSource source, const gpu::CompiledKernel& compiled,
                       const std::vector<const FusedGroup*>& groups,
                       const std::vector<std::vector<const void*>>& inputs,
                       const std::vector<std::vector<void*>>& outputs);
  ~CudaHorizontalKernel();
  CudaHorizontalKernel(const CudaHorizontalKernel&) = delete;
  CudaHorizontalKernel& operator=(const CudaHorizontalKernel&) = delete;

  void launch(gpu::Stream stream) const;
  const CudaKernelSource& source() const { return source_; }

 private:
  CudaKernelSource source_;
  gpu::LoadedKernel kernel_;
  LaunchShape shape_;
  void* table_ = nullptr;  // device memory
  int segments_ = 0;
};

// Generates, compiles (in parallel, through the kernel cache) and loads every group.
std::vector<std::unique_ptr<CudaFusedKernel>> compile_fused_kernels(
    const std::vector<const FusedGroup*>& groups);

// The members of one horizontal launch and, per member, its inputs' and outputs' pointers.
struct HorizontalMembers {
  std::vector<const FusedGroup*> groups;
  std::vector<std::vector<const void*>> inputs;
  std::vector<std::vector<void*>> outputs;
};

// Generates, compiles (through the kernel cache) and loads each launch's kernel with its table.
std::vector<std::unique_ptr<CudaHorizontalKernel>> compile_horizontal_kernels(
    const std::vector<HorizontalMembers>& launches);

}  // namespace kiln
