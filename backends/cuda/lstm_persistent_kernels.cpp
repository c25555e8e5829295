// The host side of the persistent LSTM forward (kernels/lstm_persistent.cuh; notes in lstm.h):
// its name and the defines that pick it.
#include <fmt/format.h>

#include <string>

#include "backends/cuda/kernel_sources.h"
#include "core/error.h"
#include "kiln_kernel_files.h"

namespace kiln::cuda {

std::string lstm_persistent_name(DType dtype) {
  return fmt::format("kiln_lstm_persistent_forward_{}", dtype_name(dtype));
}

gpu::KernelSource lstm_persistent_source(DType dtype) {
  KILN_ASSERT(is_floating(dtype), "lstm kernels: dtype {}", dtype_name(dtype));
  return embedded_kernel(lstm_persistent_name(dtype), kernel_files::lstm_persistent_cuh,
                         "KILN_LSTM_PERSISTENT_FORWARD", {{"KILN_T", cuda_type_name(dtype)}});
}

}  // namespace kiln::cuda
