// The fused LSTM recurrence on the GPU (ops lstm_sequence and lstm_sequence_grad,
// docs/lstm_ops.md): one kernel launch per time step, the recurrent GEMM fused with the
// cell; no scratch memory (the carried dc lives in dc0's buffer), so capturable as is.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "fusion/jit/cuda_runtime.h"
#include "fusion/jit/kernel_source.h"

namespace kiln::cuda {

// One direction: `steps` (T) times of `batch` (B) rows, `hidden` (H) units; f32 or f64.
struct LstmShape {
  DType dtype = DType::f32;
  std::int64_t steps = 0, batch = 0, hidden = 0;
  bool reverse = false;
};

// projected [T*B, 4H], u [H, 4H], h0, c0 [B, H] -> hs, cs [T*B, H], acts [T*B, 4H] (rows in
// time order); T launches on `stream`.
struct LstmForwardArgs {
  const void *projected = nullptr, *u = nullptr, *h0 = nullptr, *c0 = nullptr;
  void *hs = nullptr, *cs = nullptr, *acts = nullptr;
};
void lstm_sequence_forward(const LstmShape& shape, const LstmForwardArgs& args, jit::Stream stream);

// d_hs, d_cs [T*B, H], u [H, 4H], c0 [B, H], cs [T*B, H], acts [T*B, 4H] -> d_projected
// [T*B, 4H], dh0, dc0 [B, H]; T + 1 launches on `stream` (the last one writes dh0).
struct LstmBackwardArgs {
  const void *d_hs = nullptr, *d_cs = nullptr, *u = nullptr, *c0 = nullptr, *cs = nullptr, *acts = nullptr;
  void *d_projected = nullptr, *dh0 = nullptr, *dc0 = nullptr;
};
void lstm_sequence_backward(const LstmShape& shape, const LstmBackwardArgs& args, jit::Stream stream);

// Both step kernels of `dtype`, for kernel_sources_for.
std::vector<jit::KernelSource> lstm_kernel_sources(DType dtype);

}  // namespace kiln::cuda
