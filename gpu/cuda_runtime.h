// The runtime side of kiln_gpu, through the CUDA runtime API only (cudart, never the driver
// API): whether a GPU is there, and loading, launching and inspecting a compiled kernel.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "gpu/kernel_source.h"

// The CUDA runtime's handle types, declared here so that this header needs no CUDA headers;
// they are the very types of cuda_runtime_api.h (cudaStream_t is CUstream_st*, ...).
struct CUstream_st;
struct CUlib_st;
struct CUkern_st;
struct cudaLaunchAttribute_st;

namespace kiln::gpu {

using Stream = CUstream_st*;  // == cudaStream_t; nullptr is the default stream

// Grid or block dimensions, as CUDA's dim3.
struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// Number of CUDA GPUs; 0, without throwing, when there is no driver or no GPU.
int cuda_device_count();
// Why cuda_device_count() is 0 ("no CUDA driver/GPU: ..."); empty when a GPU is there.
std::string cuda_unavailable_reason();
// The architecture of the current device (sm = 10 * major + minor). Throws without a GPU.
JitTarget current_target();

// The GPU that the CUDA backend's choices are made for (which convolution passes, tiles and
// grids): the current device, or where there is none and a tool assumed one (dump's view of a
// GPU step on a machine without a GPU), that one; nullopt otherwise.
struct PlanTarget {
  int sm = 0;   // 10 * major + minor
  int sms = 0;  // streaming multiprocessors
};
std::optional<PlanTarget> plan_target();
// Makes plan_target() answer an sm_`sm` device of `sms` SMs where there is no device; call it
// before the backend's first choice (its answers are kept).
void assume_plan_target(int sm, int sms);

// Whether launches of kernels that begin with KILN_AFTER_PRIOR_GRIDS() are programmatic
// (gpu/kernel_source.h) on an sm_90 or later device: on unless KILN_PROGRAMMATIC_LAUNCH=0;
// set_programmatic_launches turns them on or off for the launches that follow (A/B tests).
bool programmatic_launches();
void set_programmatic_launches(bool on);

// What the compiler made of a kernel (cudaFuncGetAttributes), for occupancy reports.
struct KernelAttributes {
  int registers_per_thread = 0;
  std::size_t local_bytes_per_thread = 0;  // spills and local arrays
  std::size_t static_shared_bytes = 0;
  std::size_t const_bytes = 0;
  int max_threads_per_block = 0;
  int max_dynamic_shared_bytes = 0;
  int binary_version = 0;  // sm of the loaded machine code, e.g. 90
};

// A CUBIN loaded as a CUDA library (cudaLibraryLoadData) and one kernel of it. The library
// is unloaded on destruction. Movable, not copyable.
class LoadedKernel {
 public:
  // after_prior_grids: the kernel's source begins every __global__ function with
  // KILN_AFTER_PRIOR_GRIDS(), so it is launched programmatically where programmatic_launches()
  // allows it (launch, launch_clusters).
  LoadedKernel(const std::vector<char>& cubin, const std::string& name,
               bool after_prior_grids = false);
  explicit LoadedKernel(const CompiledKernel& kernel)
      : LoadedKernel(kernel.cubin, kernel.name, kernel.after_prior_grids) {}
  ~LoadedKernel();
  LoadedKernel(LoadedKernel&& other) noexcept;
  LoadedKernel& operator=(LoadedKernel&& other) noexcept;
  LoadedKernel(const LoadedKernel&) = delete;
  LoadedKernel& operator=(const LoadedKernel&) = delete;

  // Launches asynchronously on `stream`; args[i] points at the i-th kernel parameter.
  // A launch error throws kiln::Error; errors inside the kernel surface at the next sync.
  // Programmatic (the constructor above) where the kernel allows it; captured in a CUDA graph,
  // such a launch's edge from the kernel ahead of it is a programmatic one.
  void launch(Dim3 grid, Dim3 block, std::size_t shared_bytes, Stream stream, void** args) const;
  // As launch, but cooperative: every block is resident at once (or the launch fails), so
  // blocks may wait for each other (a grid-wide barrier). Capturable in a CUDA graph. Never
  // programmatic.
  void launch_cooperative(Dim3 grid, Dim3 block, std::size_t shared_bytes, Stream stream,
                          void** args) const;
  // As launch, in clusters of cluster_x consecutive blocks along x (sm_90: blocks placed
  // together, sharing their shared memory; grid.x a multiple of cluster_x). Capturable.
  void launch_clusters(Dim3 grid, Dim3 block, std::size_t shared_bytes, Stream stream, void** args,
                       unsigned cluster_x) const;
  // Lets launches use more than 48 KiB of dynamic shared memory (up to the device's limit).
  void set_max_dynamic_shared_bytes(int bytes);
  int max_active_blocks_per_sm(int block_size, std::size_t shared_bytes) const;
  KernelAttributes attributes() const;
  const std::string& name() const { return name_; }

 private:
  void unload() noexcept;
  // `attribute` and, where the kernel allows it, the programmatic one.
  void launch_with(Dim3 grid, Dim3 block, std::size_t shared_bytes, Stream stream, void** args,
                   const cudaLaunchAttribute_st* attribute, const char* what) const;
  bool programmatic() const;

  std::string name_;
  bool after_prior_grids_ = false;  // the source's flag, on an sm_90 or later device
  CUlib_st* library_ = nullptr;
  CUkern_st* kernel_ = nullptr;
};

}  // namespace kiln::gpu
