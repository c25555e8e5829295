// The plain data that flows through kiln_gpu: a kernel's CUDA C source, the GPU it is
// compiled for, and a compiled kernel as the cache returns it.
#pragma once

#include <string>
#include <vector>

#include "core/env_switch.h"

namespace kiln::gpu {

// Programmatic dependent launch (sm_90 and later): a kernel launched with it may be launched
// while the kernel ahead of it in its stream is still running (as that kernel's blocks exit),
// instead of once that kernel has finished and its writes are flushed. Such a kernel begins with
// KILN_AFTER_PRIOR_GRIDS(), before it reads or writes any global memory: it waits until the
// kernels its launch depends on have finished and their writes are visible
// (griddepcontrol.wait). Launched without it, or below sm_90, that does nothing. The kernel
// behind is launched as this one's blocks exit; KILN_EARLY_DEPENDENTS=1 lets it launch once every
// block has passed the wait (griddepcontrol.launch_dependents), for measuring: its blocks then
// sit resident and waiting, and the side streams' kernels found the SMs taken (resnet18 bf16
// b512 on an H100: 5.83 device ms with dependents at exit, 5.87 plain, 6.15 early;
// bench/README.md). Every kiln kernel source starts with this definition
// (backends/cuda/kernel_sources.cpp, fusion/codegen*.cpp).
inline const std::string& after_prior_grids_definition() {
  static const std::string text =
      std::string(
          "#ifndef KILN_AFTER_PRIOR_GRIDS\n"
          "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n"
          "#define KILN_AFTER_PRIOR_GRIDS() asm volatile(\"griddepcontrol.wait;") +
      (env_switch_set("KILN_EARLY_DEPENDENTS") ? "\\n\\tgriddepcontrol.launch_dependents;" : "") +
      "\" ::: \"memory\")\n"
      "#else\n"
      "#define KILN_AFTER_PRIOR_GRIDS() ((void)0)\n"
      "#endif\n"
      "#endif\n";
  return text;
}

// One kernel to compile: `name` is its extern "C" __global__ function, defined in `code`.
struct KernelSource {
  std::string name;
  std::string code;
  std::vector<std::string> options;  // extra NVRTC options, e.g. "--use_fast_math"
  // Compiled for the target's own variant (sm_90a for sm_90): instructions that exist on that
  // architecture only (wgmma), so the CUBIN loads on it alone.
  bool arch_specific = false;
  // Every __global__ function in `code` begins with KILN_AFTER_PRIOR_GRIDS(): its launches may
  // be programmatic (LoadedKernel::launch).
  bool after_prior_grids = false;
};

// The GPU architecture a kernel is compiled for: sm = 10 * major + minor (90 for an H100/H200).
struct JitTarget {
  int sm = 90;
};

// A compiled kernel: its name (as in its KernelSource) and CUBIN bytes (an ELF image).
struct CompiledKernel {
  std::string name;
  std::vector<char> cubin;
  bool from_disk = false;          // read from the disk cache
  bool from_memory = false;        // found in the in-memory cache
  bool after_prior_grids = false;  // as its KernelSource's
};

}  // namespace kiln::gpu
