// The plain data that flows through kiln_gpu: a kernel's CUDA C source, the GPU it is
// compiled for, and a compiled kernel as the cache returns it.
#pragma once

#include <string>
#include <vector>

namespace kiln::gpu {

// One kernel to compile: `name` is its extern "C" __global__ function, defined in `code`.
struct KernelSource {
  std::string name;
  std::string code;
  std::vector<std::string> options;  // extra NVRTC options, e.g. "--use_fast_math"
  // Compiled for the target's own variant (sm_90a for sm_90): instructions that exist on that
  // architecture only (wgmma), so the CUBIN loads on it alone.
  bool arch_specific = false;
};

// The GPU architecture a kernel is compiled for: sm = 10 * major + minor (90 for an H100/H200).
struct JitTarget {
  int sm = 90;
};

// A compiled kernel: its name (as in its KernelSource) and CUBIN bytes (an ELF image).
struct CompiledKernel {
  std::string name;
  std::vector<char> cubin;
  bool from_disk = false;    // read from the disk cache
  bool from_memory = false;  // found in the in-memory cache
};

}  // namespace kiln::gpu
