// The fused LSTM recurrence on the GPU (ops lstm_sequence and lstm_sequence_grad,
// docs/lstm_ops.md): one kernel launch per time step, the recurrent GEMM fused with the
// cell (the carried dc lives in dc0's buffer), or, for the forward where the shape fits,
// one persistent cooperative launch for all steps (lstm_persistent_kernels.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "gpu/cuda_runtime.h"
#include "gpu/kernel_source.h"

namespace kiln::cuda {

// One direction: `steps` (T) times of `batch` (B) rows, `hidden` (H) units; f32, f64, or
// bf16/f16 (gates and sums in float registers, h, c and the activations stored rounded).
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
  // 2 * lstm_persistent_barriers(shape) zeroed counters of device memory, this op's own: when
  // set (and the shape fits), the forward is one persistent cooperative launch whose
  // barriers count in them.
  unsigned* barrier = nullptr;
};
// Whether `shape`'s forward runs as the persistent kernel on the current device: H a
// multiple of 32 from 64 up, (32 + 16) * H elements of shared memory within 48 KiB, and a
// grid of (H / 8) x ceil(B / 16) blocks that is resident at once and fills at least 3/4 of
// the SMs (a cooperative launch waits for the whole grid to fit, so a small one would stop
// other work from running beside it: row-lstm's two directions, 64 blocks each, took 0.453
// -> 0.503 ms as persistent kernels).
bool lstm_persistent_forward_fits(const LstmShape& shape);
// The barriers (row groups of 16) of the persistent forward, two counters each.
std::int64_t lstm_persistent_barriers(const LstmShape& shape);
void lstm_sequence_forward(const LstmShape& shape, const LstmForwardArgs& args, gpu::Stream stream);

// d_hs, d_cs [T*B, H], u [H, 4H], c0 [B, H], cs [T*B, H], acts [T*B, 4H] -> d_projected
// [T*B, 4H], dh0, dc0 [B, H]; T + 1 launches on `stream` (the last one writes dh0).
struct LstmBackwardArgs {
  const void *d_hs = nullptr, *d_cs = nullptr, *u = nullptr, *c0 = nullptr, *cs = nullptr,
             *acts = nullptr;
  void *d_projected = nullptr, *dh0 = nullptr, *dc0 = nullptr;
};
void lstm_sequence_backward(const LstmShape& shape, const LstmBackwardArgs& args,
                            gpu::Stream stream);

// The step kernels and the persistent forward of `dtype`, for kernel_sources_for.
std::vector<gpu::KernelSource> lstm_kernel_sources(DType dtype);

namespace detail {
// Tests: `never` runs every forward step by step; `when_resident` drops the 3/4-of-the-SMs rule.
enum class LstmPersistent { automatic, when_resident, never };
void set_lstm_persistent_for_testing(LstmPersistent mode);
}  // namespace detail

}  // namespace kiln::cuda
