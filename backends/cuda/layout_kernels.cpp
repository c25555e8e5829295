// The host side of the layout kernels (kernels/layout.cuh: transpose, concat, one_hot and its
// out-of-range report, fill): each kernel's name and the defines that pick its entry and types.
#include <fmt/format.h>

#include "backends/cuda/kernel_sources.h"
#include "core/error.h"
#include "kiln_kernel_files.h"

namespace kiln::cuda {
namespace {

const char* unsigned_of_size(std::size_t bytes) {
  switch (bytes) {
    case 1:
      return "unsigned char";
    case 2:
      return "unsigned short";
    case 4:
      return "unsigned int";
    case 8:
      return "unsigned long long";
    default:
      break;
  }
  KILN_ASSERT(false, "no layout kernel for {}-byte elements", bytes);
}

}  // namespace

gpu::KernelSource transpose_source(std::size_t element_bytes) {
  return embedded_kernel(fmt::format("kiln_transpose_b{}", element_bytes), kernel_files::layout_cuh,
                         "KILN_TRANSPOSE", {{"KILN_U", unsigned_of_size(element_bytes)}});
}

gpu::KernelSource concat_source(std::size_t element_bytes) {
  return embedded_kernel(fmt::format("kiln_concat_b{}", element_bytes), kernel_files::layout_cuh,
                         "KILN_CONCAT", {{"KILN_U", unsigned_of_size(element_bytes)}});
}

gpu::KernelSource one_hot_source(DType label, DType out) {
  return embedded_kernel(fmt::format("kiln_one_hot_{}_{}", dtype_name(label), dtype_name(out)),
                         kernel_files::layout_cuh, "KILN_ONE_HOT",
                         {{"KILN_L", cuda_type_name(label)}, {"KILN_T", cuda_type_name(out)}});
}

gpu::KernelSource one_hot_finish_source(DType label) {
  return embedded_kernel(fmt::format("kiln_one_hot_finish_{}", dtype_name(label)),
                         kernel_files::layout_cuh, "KILN_ONE_HOT_FINISH",
                         {{"KILN_L", cuda_type_name(label)}});
}

gpu::KernelSource fill_source(DType dtype) {
  return embedded_kernel(fmt::format("kiln_fill_{}", dtype_name(dtype)), kernel_files::layout_cuh,
                         "KILN_FILL", {{"KILN_T", cuda_type_name(dtype)}});
}

}  // namespace kiln::cuda
