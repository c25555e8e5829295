// The slow one-time set-up of a GPU, for DeviceWarmUp's thread: the context, and one small
// GEMM through the same cuBLAS path as matmul (its first call loads the library's kernels).
// Never throws; a failure is left for the program's own first call to report.
#pragma once

namespace kiln::cuda {

void warm_up(int device) noexcept;

}  // namespace kiln::cuda
