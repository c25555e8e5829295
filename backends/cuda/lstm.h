// The fused LSTM recurrence on the GPU (ops lstm_sequence and lstm_sequence_grad,
// docs/lstm_ops.md), by one of three sets of kernels:
//  - steps: one kernel launch per time step, the recurrent GEMM fused with the cell (the
//    carried dc lives in dc0's buffer); every dtype and shape (lstm_kernels.cpp);
//  - persistent: for an f32/f64 forward where the shape fits, one cooperative launch for all
//    steps, f32 or f64 FMA tiles (lstm_persistent_kernels.cpp);
//  - mma: for bf16 and f16 where H % 16 == 0 and the grid is resident, both directions as one
//    cooperative launch each, the recurrent products on tensor cores (lstm_mma.cpp).
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

enum class LstmKernels { steps, persistent, mma };

// projected [T*B, 4H], u [H, 4H], h0, c0 [B, H] -> hs, cs [T*B, H], acts [T*B, 4H] (rows in
// time order); steps: T launches on `stream`.
struct LstmForwardArgs {
  const void *projected = nullptr, *u = nullptr, *h0 = nullptr, *c0 = nullptr;
  void *hs = nullptr, *cs = nullptr, *acts = nullptr;
  // persistent and mma: 2 * lstm_persistent_barriers(shape) zeroed counters of device
  // memory, this op's own, in which the cooperative launch's barriers count.
  unsigned* barrier = nullptr;
  LstmKernels kernels = LstmKernels::steps;
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
  unsigned* barrier = nullptr;  // mma: as the forward's
  LstmKernels kernels = LstmKernels::steps;
};
void lstm_sequence_backward(const LstmShape& shape, const LstmBackwardArgs& args,
                            gpu::Stream stream);

// Whether the tensor-core kernels run `shape` (the forward, or the backward) on the current
// device: bf16 or f16, H a multiple of 16, a grid of (H / 16) x ceil(B / 16) blocks resident
// at once. (Unlike the f32 persistent forward, no rule that the grid fill the SMs: at any
// batch these beat the step kernels, and a small grid leaves SMs to the other streams.)
bool lstm_mma_fits(const LstmShape& shape, bool backward);
// The launches of lstm_mma.cpp: one cooperative launch, counting in args.barrier.
void lstm_mma_forward(const LstmShape& shape, const LstmForwardArgs& args, gpu::Stream stream);
void lstm_mma_backward(const LstmShape& shape, const LstmBackwardArgs& args, gpu::Stream stream);

// The step kernels, the persistent forward and (bf16, f16) the tensor-core kernels of
// `dtype`, for kernel_sources_for.
std::vector<gpu::KernelSource> lstm_kernel_sources(DType dtype);

namespace detail {
// Tests: `never` runs every direction step by step; `when_resident` drops the f32 persistent
// forward's 3/4-of-the-SMs rule.
enum class LstmPersistent { automatic, when_resident, never };
void set_lstm_persistent_for_testing(LstmPersistent mode);
LstmPersistent lstm_persistent_mode();
}  // namespace detail

}  // namespace kiln::cuda
