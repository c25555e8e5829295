// The table of CUDA op entries, built once from every family's registration.
#include "backends/cuda/op_entry.h"

namespace kiln::cuda {

const CudaOpEntry* cuda_op(OpId op) {
  static const CudaOpTable table = [] {
    CudaOpTable t;
    add_matmul_ops(t);
    add_conv_ops(t);
    add_pool_ops(t);
    add_layout_ops(t);
    add_random_ops(t);
    add_lstm_ops(t);
    add_collective_ops(t);
    return t;
  }();
  const auto it = table.find(op);
  return it == table.end() ? nullptr : &it->second;
}

}  // namespace kiln::cuda
