// The host side of the pooling kernels (kernels/pool.cuh with 64-bit indices,
// kernels/max_pool32.cuh with 32-bit ones): each kernel's name and the defines that pick its
// entry; the CUDA itself is in the .cuh files.
#include <fmt/format.h>

#include "backends/cuda/kernel_sources.h"
#include "core/error.h"
#include "kiln_kernel_files.h"

namespace kiln::cuda {
namespace {

const char* kernel_suffix(PoolKernel which) {
  switch (which) {
    case PoolKernel::forward:
      return "forward";
    case PoolKernel::grad:
      return "grad";
    case PoolKernel::select:
      return "select";
  }
  KILN_ASSERT(false, "unknown pool kernel {}", static_cast<int>(which));
}

const char* pool_entry(PoolKernel which) {
  switch (which) {
    case PoolKernel::forward:
      return "KILN_MAX_POOL_FORWARD";
    case PoolKernel::grad:
      return "KILN_MAX_POOL_GRAD";
    case PoolKernel::select:
      return "KILN_MAX_POOL_SELECT";
  }
  KILN_ASSERT(false, "unknown pool kernel {}", static_cast<int>(which));
}

const char* fast_suffix(PoolFast which) {
  switch (which) {
    case PoolFast::forward_k2:
      return "forward_k2";
    case PoolFast::forward_any:
      return "forward";
    case PoolFast::select_k2:
      return "select_k2";
    case PoolFast::select_any:
      return "select";
    case PoolFast::grad_cells2:
      return "grad_cells2";
    case PoolFast::grad_cells:
      return "grad_cells";
    case PoolFast::grad_overlap:
      return "grad_overlap";
    case PoolFast::grad_planes:
      return "grad_planes";
  }
  KILN_ASSERT(false, "unknown pool kernel {}", static_cast<int>(which));
}

// The entry of max_pool32.cuh that runs `which`, and its constants.
KernelDefines fast_entry(PoolFast which, std::string& entry) {
  switch (which) {
    case PoolFast::forward_k2:
    case PoolFast::forward_any:
      entry = "KILN_MAX_POOL32_FORWARD";
      return {{"KILN_WINDOW", which == PoolFast::forward_k2 ? "2" : "0"}};
    case PoolFast::select_k2:
    case PoolFast::select_any:
      entry = "KILN_MAX_POOL32_SELECT";
      return {{"KILN_WINDOW", which == PoolFast::select_k2 ? "2" : "0"}};
    case PoolFast::grad_cells2:
    case PoolFast::grad_cells:
      entry = "KILN_MAX_POOL32_GRAD_CELLS";
      return {{"KILN_EXACT2", which == PoolFast::grad_cells2 ? "1" : "0"}};
    case PoolFast::grad_overlap:
      entry = "KILN_MAX_POOL32_GRAD_OVERLAP";
      return {};
    case PoolFast::grad_planes:
      entry = "KILN_MAX_POOL32_GRAD_PLANES";
      return {};
  }
  KILN_ASSERT(false, "unknown pool kernel {}", static_cast<int>(which));
}

}  // namespace

std::string max_pool_fast_name(PoolFast which, DType dtype) {
  return fmt::format("kiln_max_pool2d32_{}_{}", fast_suffix(which), dtype_name(dtype));
}

gpu::KernelSource max_pool_fast_source(PoolFast which, DType dtype) {
  std::string entry;
  KernelDefines defines = fast_entry(which, entry);
  defines.insert(defines.begin(), {"KILN_T", cuda_type_name(dtype)});
  return embedded_kernel(max_pool_fast_name(which, dtype), kernel_files::max_pool32_cuh, entry,
                         defines);
}

gpu::KernelSource max_pool_source(PoolKernel which, DType dtype) {
  return embedded_kernel(
      fmt::format("kiln_max_pool2d_{}_{}", kernel_suffix(which), dtype_name(dtype)),
      kernel_files::pool_cuh, pool_entry(which), {{"KILN_T", cuda_type_name(dtype)}});
}

std::string avg_pool_name(bool grad, DType dtype) {
  return fmt::format("kiln_avg_pool2d_{}_{}", grad ? "grad" : "forward", dtype_name(dtype));
}

gpu::KernelSource avg_pool_source(bool grad, DType dtype) {
  return embedded_kernel(avg_pool_name(grad, dtype), kernel_files::pool_cuh,
                         grad ? "KILN_AVG_POOL_GRAD" : "KILN_AVG_POOL_FORWARD",
                         {{"KILN_T", cuda_type_name(dtype)}});
}

}  // namespace kiln::cuda
