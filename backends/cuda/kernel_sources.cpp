// The list of every hand-written kernel, and the CUDA spelling of kiln's dtypes.
#include "backends/cuda/kernel_sources.h"

#include "core/error.h"

namespace kiln::cuda {

const char* cuda_type_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::i32: return "int";
    case DType::i64: return "long long";
    case DType::u8: return "unsigned char";
  }
  KILN_ASSERT(false, "unknown dtype {}", static_cast<int>(dtype));
}

std::vector<IgemmTile> igemm_tiles(IgemmMode mode, DType dtype) {
  const bool f64 = dtype == DType::f64;  // half the K step where a 32-row one overflows shared memory
  if (mode != IgemmMode::grad_weight) return {{64, 64, 1, f64 ? 16 : 32}, {32, 64, 1, f64 ? 16 : 32}};
  if (f64) return {{32, 16, 2, 16}, {64, 32, 1, 16}};
  return {{32, 16, 4, 16}, {64, 32, 2, 16}};
}

std::vector<jit::KernelSource> all_kernel_sources() {
  std::vector<jit::KernelSource> all;
  for (DType t : {DType::f32, DType::f64}) {
    all.push_back(im2col_source(t));
    all.push_back(col2im_source(t));
    for (IgemmMode mode : {IgemmMode::forward, IgemmMode::grad_input, IgemmMode::grad_weight})
      for (IgemmTile tile : igemm_tiles(mode, t)) all.push_back(conv_igemm_source(mode, tile, t));
    all.push_back(conv_splitk_sum_source(t));
    for (PoolKernel p : {PoolKernel::forward, PoolKernel::grad, PoolKernel::select}) all.push_back(max_pool_source(p, t));
    for (PoolFast p : {PoolFast::forward_k2, PoolFast::forward_any, PoolFast::select_k2, PoolFast::select_any,
                       PoolFast::grad_cells2, PoolFast::grad_cells, PoolFast::grad_overlap})
      all.push_back(max_pool_fast_source(p, t));
  }
  for (std::size_t bytes : {1, 2, 4, 8}) all.push_back(transpose_source(bytes));
  for (DType label : {DType::i32, DType::i64, DType::u8}) {
    for (DType out : {DType::f32, DType::f64}) all.push_back(one_hot_source(label, out));
    all.push_back(one_hot_finish_source(label));
  }
  for (DType t : {DType::f32, DType::f64, DType::i32, DType::i64, DType::u8}) all.push_back(fill_source(t));
  return all;
}

}  // namespace kiln::cuda
