// autocast: rewrites a step so that it stores activations in bf16 or f16, by each op's
// AutocastPolicy in the op table (graph/op.h): GEMMs, convolutions and LSTMs read and write
// the low dtype (accumulating in fp32 inside their kernels); reductions read fp32 (the widening
// fuses into their loads) and write fp32; elementwise, layout and pooling ops follow the dtype
// of their inputs of the output's own size, fp32 winning, so that master weights, optimizer
// state and losses stay fp32 while activations stay low; comparisons store their exact 0/1 low.
// Elementwise ops whose values reach no GEMM, convolution or LSTM (the optimizer's update,
// the unscaling of fp16 gradients by the loss scaler, the loss itself) compute in fp32.
// Variables stay fp32 (a GEMM reads a cast of its weight); assignments and named outputs get
// their original dtype back.
//
// Pre: verify(g) holds; `low` is bf16 or f16. Post: verify holds; every variable, input,
// output and assignment has its dtype from before; every op reads inputs of the dtypes its
// policy says (casts inserted, each made once per value and dtype; a fill is remade in the
// dtype, its value rounded); nodes that touch f64 values are left as they are.
#pragma once

#include "graph/graph.h"

namespace kiln {

Graph autocast(const Graph& g, DType low);

}  // namespace kiln
