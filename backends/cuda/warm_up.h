// The slow one-time set-up of a GPU, for DeviceWarmUp's thread: the context, and one small
// GEMM through the same cuBLAS path as matmul (its first call loads the library's kernels).
// Never throws; a failure is left for the program's own first call to report.
#pragma once

namespace kiln::cuda {

// DeviceWarmUp counts a warm-up as running before it starts its thread (warm_up_started), and
// warm_up ends it once its last CUDA call is made and its cuBLAS handle destroyed
// (warm_up_ended: also where the thread could not start).
void warm_up_started();
void warm_up_ended() noexcept;
void warm_up(int device) noexcept;

// Waits for every running warm-up: a CUDA program calls it before its first work on the device
// (sizing its scratch tunes kernels; its run launches GEMMs). The warm-up's own handle, stream
// and buffer came and went while a program's GEMMs ran, and cuBLAS then failed now and then
// with CUBLAS_STATUS_INTERNAL_ERROR (cuda_backend_test, H200); the program would wait for the
// context and cuBLAS's kernels in the driver anyway.
void wait_for_warm_ups();

}  // namespace kiln::cuda
