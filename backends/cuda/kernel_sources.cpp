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

// Tile choice, from LeNet's passes at batch 64 on an H200 (132 SMs; CUDA-graph time per call):
//  - forward, grad_input: 32-row tiles for up to 64 channels (conv2 forward, 64 channels:
//    32x64 21.5 us, 64x64 24.3 us); 64 columns while that gives at least 264 blocks, else 32
//    columns with two thread groups (conv2 grad_input, 196 vs 392 blocks: 32 vs 23.9 us);
//    32-row K steps when K is long enough to fill them (conv2 forward, K = 288: 21.5 vs 22.5
//    us; conv1, K = 9: 16-row steps, 5.6 vs 8.3 us). f64 keeps 16-row steps (shared memory).
//  - grad_weight: 32x16 with four groups for filters of at most 16 columns (conv1: 9.9 us),
//    else 64x32 (conv2: 24.3 us; 64x64 and other split counts within 0.5 us).
IgemmTile igemm_choose_tile(IgemmMode mode, DType dtype, std::int64_t m, std::int64_t n, std::int64_t k) {
  const bool f64 = dtype == DType::f64;
  if (mode == IgemmMode::grad_weight) {
    if (n <= 16) return f64 ? IgemmTile{32, 16, 2, 16} : IgemmTile{32, 16, 4, 16};
    return f64 ? IgemmTile{64, 32, 1, 16} : IgemmTile{64, 32, 2, 16};
  }
  const int bm = m > 64 ? 64 : 32;
  const std::int64_t blocks = (m + bm - 1) / bm * ((n + 63) / 64);
  if (blocks >= 264) return {bm, 64, 1, !f64 && k >= 128 ? 32 : 16};
  if (f64 && bm == 64) return {64, 32, 1, 16};
  return {bm, 32, 2, 16};
}

std::vector<IgemmTile> igemm_tiles(IgemmMode mode, DType dtype) {
  if (mode == IgemmMode::grad_weight) return {igemm_choose_tile(mode, dtype, 32, 16, 1), igemm_choose_tile(mode, dtype, 64, 64, 1)};
  std::vector<IgemmTile> tiles;
  for (std::int64_t m : {32, 128})
    for (std::int64_t n : {64, 1 << 20})
      for (std::int64_t k : {16, 256}) {
        const IgemmTile t = igemm_choose_tile(mode, dtype, m, n, k);
        bool seen = false;
        for (const IgemmTile& u : tiles) seen = seen || (u.bm == t.bm && u.bn == t.bn && u.kg == t.kg && u.ks == t.ks);
        if (!seen) tiles.push_back(t);
      }
  return tiles;
}

std::vector<jit::KernelSource> all_kernel_sources() {
  std::vector<jit::KernelSource> all;
  for (DType t : {DType::f32, DType::f64}) {
    all.push_back(im2col_source(t));
    all.push_back(col2im_source(t));
    for (IgemmMode mode : {IgemmMode::forward, IgemmMode::grad_input, IgemmMode::grad_weight})
      for (IgemmTile tile : igemm_tiles(mode, t)) all.push_back(conv_igemm_source(mode, tile, t));
    all.push_back(conv_splitk_sum_source(t));
    all.push_back(random_uniform_source(t));
    for (PoolKernel p : {PoolKernel::forward, PoolKernel::grad, PoolKernel::select}) all.push_back(max_pool_source(p, t));
    for (PoolFast p : {PoolFast::forward_k2, PoolFast::forward_any, PoolFast::select_k2, PoolFast::select_any,
                       PoolFast::grad_cells2, PoolFast::grad_cells, PoolFast::grad_overlap})
      all.push_back(max_pool_fast_source(p, t));
    for (bool grad : {false, true}) all.push_back(avg_pool_source(grad, t));
    for (bool backward : {false, true}) all.push_back(lstm_step_source(backward, t));
  }
  for (std::size_t bytes : {1, 2, 4, 8}) all.push_back(transpose_source(bytes));
  for (std::size_t bytes : {1, 2, 4, 8}) all.push_back(concat_source(bytes));
  for (DType label : {DType::i32, DType::i64, DType::u8}) {
    for (DType out : {DType::f32, DType::f64}) all.push_back(one_hot_source(label, out));
    all.push_back(one_hot_finish_source(label));
  }
  for (DType t : {DType::f32, DType::f64, DType::i32, DType::i64, DType::u8}) all.push_back(fill_source(t));
  return all;
}

}  // namespace kiln::cuda
