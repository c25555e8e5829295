// CPU kernels of the fused LSTM recurrence (ops lstm_sequence and lstm_sequence_grad,
// graph/ops/recurrent_ops.cpp; the math is in docs/lstm_ops.md): per step one GEMM (oneDNN's
// sgemm for float, Eigen for double) and the cell, threads over fixed blocks of hidden units
// and batch rows (the same bits for any thread count).
#pragma once

#include "core/tensor.h"

namespace kiln::kernels {

struct LstmDims {
  std::int64_t steps, batch, hidden;
  bool reverse;
};

// projected: [T*B, 4H], u: [H, 4H], h0, c0: [B, H] -> hs, cs: [T*B, H], acts: [T*B, 4H].
void lstm_forward(const Tensor& projected, const Tensor& u, const Tensor& h0, const Tensor& c0,
                  Tensor& hs, Tensor& cs, Tensor& acts, const LstmDims& d);

// d_hs, d_cs, cs: [T*B, H], u: [H, 4H], c0: [B, H], acts: [T*B, 4H]
//   -> d_projected: [T*B, 4H], dh0, dc0: [B, H].
struct LstmGradInputs {
  const Tensor &d_hs, &d_cs, &u, &c0, &cs, &acts;
};
void lstm_backward(const LstmGradInputs& in, Tensor& d_projected, Tensor& dh0, Tensor& dc0,
                   const LstmDims& d);

}  // namespace kiln::kernels
