// Compiles one kernel's CUDA C source to CUBIN for one GPU architecture with NVRTC.
// NVRTC needs no GPU, so this works on any machine that has the CUDA toolkit's libraries.
#pragma once

#include <string>
#include <vector>

#include "gpu/kernel_source.h"

namespace kiln::gpu {

// The CUBIN (an ELF image) of `src` for `target`, compiled with --gpu-architecture=sm_XX,
// -std=c++17 (unless src.options names a -std) and src.options. Throws kiln::Error with the
// kernel's name, NVRTC's log and the numbered source when the compile fails. Thread-safe.
std::vector<char> compile_to_cubin(const KernelSource& src, const JitTarget& target);

// NVRTC's version as "major.minor" (e.g. "13.0"); part of every kernel cache key.
std::string nvrtc_version();

}  // namespace kiln::gpu
