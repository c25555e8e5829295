// The table of CUDA op entries, built once from every family's registration.
#include "backends/cuda/op_entry.h"

namespace kiln::cuda {

const CudaOpTable& cuda_op_table() {
  static const CudaOpTable table = [] {
    CudaOpTable t;
#define KILN_CUDA_OP_FAMILY_ADD(family) add_##family##_ops(t);
    KILN_CUDA_OP_FAMILIES(KILN_CUDA_OP_FAMILY_ADD)
#undef KILN_CUDA_OP_FAMILY_ADD
    return t;
  }();
  return table;
}

const CudaOpEntry* cuda_op(OpId op) {
  const auto it = cuda_op_table().find(op);
  return it == cuda_op_table().end() ? nullptr : &it->second;
}

}  // namespace kiln::cuda
