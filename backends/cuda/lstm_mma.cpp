// The host side of the tensor-core LSTM recurrence (kernels/lstm_mma.cuh; notes in lstm.h):
// the kernels' names and sources, their shared memory, when they fit, and their launches.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <string>

#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/lstm.h"
#include "core/error.h"
#include "gpu/cuda_check.h"
#include "kiln_kernel_files.h"

namespace kiln::cuda {
namespace {

constexpr std::int64_t kUnits = 16, kRows = 16;
constexpr unsigned kThreads = 256;

bool low_precision(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }

// Shared bytes: the forward holds u's 64 columns and 16 h rows of H + 8 elements and two
// 16 x 80 f32 partial sums; the backward 16 rows of u and 16 of d_next of 4H + 8 elements
// and eight 16 x 16 partial sums.
std::size_t shared_bytes(bool backward, std::int64_t hidden) {
  const std::int64_t elements = backward ? 32 * (4 * hidden + 8) : 80 * (hidden + 8);
  const std::int64_t sums = backward ? 8 * 16 * 16 : 2 * 16 * 80;
  return static_cast<std::size_t>(2 * elements + 4 * sums);
}

const DeviceKernel& mma_kernel(bool backward, const LstmShape& s) {
  return device_kernel(
      lstm_mma_name(backward, s.dtype), [&] { return lstm_mma_source(backward, s.dtype); },
      shared_bytes(backward, s.hidden));
}

gpu::Dim3 grid_of(const LstmShape& s) {
  return {static_cast<unsigned>(s.hidden / kUnits),
          static_cast<unsigned>((s.batch + kRows - 1) / kRows), 1};
}

}  // namespace

std::string lstm_mma_name(bool backward, DType dtype) {
  return fmt::format("kiln_lstm_mma_{}_{}", backward ? "backward" : "forward", dtype_name(dtype));
}

gpu::KernelSource lstm_mma_source(bool backward, DType dtype) {
  KILN_ASSERT(low_precision(dtype), "lstm mma kernels: dtype {}", dtype_name(dtype));
  return embedded_kernel(lstm_mma_name(backward, dtype), kernel_files::lstm_mma_cuh,
                         backward ? "KILN_LSTM_MMA_BACKWARD" : "KILN_LSTM_MMA_FORWARD",
                         {{"KILN_T", cuda_type_name(dtype)}});
}

bool lstm_mma_fits(const LstmShape& s, bool backward) {
  if (!low_precision(s.dtype) || s.hidden == 0 || s.hidden % kUnits != 0 || s.batch == 0 ||
      detail::lstm_persistent_mode() == detail::LstmPersistent::never)
    return false;
  int device = 0, sms = 0, optin = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const std::size_t bytes = shared_bytes(backward, s.hidden);
  if (bytes > static_cast<std::size_t>(optin)) return false;
  const gpu::Dim3 grid = grid_of(s);
  const int per_sm =
      mma_kernel(backward, s).kernel.max_active_blocks_per_sm(static_cast<int>(kThreads), bytes);
  return static_cast<std::int64_t>(per_sm) * sms >= static_cast<std::int64_t>(grid.x) * grid.y;
}

void lstm_mma_forward(const LstmShape& s, const LstmForwardArgs& a, gpu::Stream stream) {
  const void *projected = a.projected, *u = a.u, *h0 = a.h0, *c0 = a.c0;
  void *hs = a.hs, *cs = a.cs, *acts = a.acts;
  unsigned* barrier = a.barrier;
  int batch = static_cast<int>(s.batch), hidden = static_cast<int>(s.hidden),
      steps = static_cast<int>(s.steps), reverse = s.reverse ? 1 : 0;
  void* params[] = {&projected, &u,       &h0,    &c0,     &hs,    &cs,
                    &acts,      &barrier, &batch, &hidden, &steps, &reverse};
  mma_kernel(false, s).kernel.launch_cooperative(grid_of(s), {kThreads, 1, 1},
                                                 shared_bytes(false, s.hidden), stream, params);
}

void lstm_mma_backward(const LstmShape& s, const LstmBackwardArgs& a, gpu::Stream stream) {
  const void *d_hs = a.d_hs, *d_cs = a.d_cs, *u = a.u, *c0 = a.c0, *cs = a.cs, *acts = a.acts;
  void *d_projected = a.d_projected, *dh0 = a.dh0, *dc0 = a.dc0;
  unsigned* barrier = a.barrier;
  int batch = static_cast<int>(s.batch), hidden = static_cast<int>(s.hidden),
      steps = static_cast<int>(s.steps), reverse = s.reverse ? 1 : 0;
  void* params[] = {&d_hs, &d_cs, &u,       &c0,    &cs,     &acts,  &d_projected,
                    &dh0,  &dc0,  &barrier, &batch, &hidden, &steps, &reverse};
  mma_kernel(true, s).kernel.launch_cooperative(grid_of(s), {kThreads, 1, 1},
                                                shared_bytes(true, s.hidden), stream, params);
}

}  // namespace kiln::cuda
