// The sources of every hand-written kernel (implicit-GEMM convolution, im2col, col2im,
// pooling, transpose, one_hot, fill, random, LSTM steps): each is an embedded kernels/*.cuh
// file after the #define lines that pick its entry and types; they compile without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "gpu/kernel_source.h"

namespace kiln::cuda {

// "float", "double", "int", "long long", "unsigned char"; bf16 and f16 as the storage types
// of kernels/storage.cuh, which a kernel using them includes.
const char* cuda_type_name(DType dtype);

// The kernel `name` of an embedded .cuh file (kiln_kernel_files.h): the file's text after
// "#define <entry> <name>" (the file defines that entry under #ifdef <entry>) and one
// "#define <key> <value>" line per define (types, tile sizes).
using KernelDefines = std::vector<std::pair<std::string, std::string>>;
gpu::KernelSource embedded_kernel(const std::string& name, const char* file_text,
                                  const std::string& entry, const KernelDefines& defines);

// conv_kernels.cpp; x: [B, C, H, W] and col laid out as ConvShape (kernels/conv_params.h) says.
gpu::KernelSource im2col_source(DType dtype);
gpu::KernelSource col2im_source(DType dtype);

// The implicit-GEMM convolution kernels (kernels/conv_igemm.cuh; ConvGemmShape in conv_params.h):
// a BM x BN tile of C per block, KG groups of threads each summing KS rows of every K step
// (of KS * KG rows), 4x4 per thread.
// grad_input_classes: at stride 2, a launch of the classes of dx's pixels (ConvClasses).
enum class IgemmMode { forward = 0, grad_input = 1, grad_weight = 2, grad_input_classes = 3 };
struct IgemmTile {
  int bm = 64, bn = 64, kg = 1, ks = 16;
  int tm = 4, tn = 4;  // each thread's sub-tile: 4 or 8 rows by 4 or 8 columns
  bool operator==(const IgemmTile&) const = default;
};
// Whether a kernel exists for `tile` (shape rules, 64 to 1024 threads, 48 KiB of shared memory).
bool igemm_tile_valid(IgemmTile tile, DType dtype);
int igemm_threads(IgemmTile tile);  // threads per block
std::size_t igemm_static_shared_bytes(IgemmTile tile, DType dtype);
std::size_t wide_size(DType dtype);  // bytes of what kernels compute in: 8 for f64, else 4
// float_out: a bf16/f16 kernel that writes f32 (split-K partials, summed and rounded later).
std::string conv_igemm_name(IgemmMode mode, IgemmTile tile, DType dtype, bool float_out = false);
gpu::KernelSource conv_igemm_source(IgemmMode mode, IgemmTile tile, DType dtype,
                                    bool float_out = false);
// The tile for a pass whose GEMM is C[m, n] = A[m, k] B[k, n], and every tile that choice
// can return for `mode` (the ones all_kernel_sources lists).
IgemmTile igemm_choose_tile(IgemmMode mode, DType dtype, std::int64_t m, std::int64_t n);
std::vector<IgemmTile> igemm_tiles(IgemmMode mode, DType dtype);
// The tensor-core forward (kernels/conv_mma.cuh) of bf16/f16: tiles of bm (64 or 128) filters
// by 64 pixels, 2 * bm threads, 32 K rows a step; vec_a: weights by 16-byte cp.async
// (K % 8 == 0, aligned rows); grad_input: weights transposed to [Cin][Cout][KH][KW], taps
// mirrored.
// kind: the forward, or grad_input at stride 1 or 2 (over dy dilated by 2).
enum class ConvMmaKind { forward, grad_input, grad_input_stride2 };
std::string conv_mma_name(DType dtype, int bm, bool vec_a, ConvMmaKind kind = ConvMmaKind::forward);
gpu::KernelSource conv_mma_source(DType dtype, int bm, bool vec_a,
                                  ConvMmaKind kind = ConvMmaKind::forward);
// The channels-last tensor-core passes (kernels/conv_mma_nhwc.cuh; bf16/f16, or f32 on TF32):
// the GEMM in tiles of bm filters by bn pixels, wm x wn warps, K steps of `pieces` 16-byte
// pieces a row and `stages` of them in flight (dynamic shared memory), over an NHWC image
// with channels % (16 bytes / element) == 0 and A = W'[m, (kh, kw, c)]; dilated: grad_input
// of a stride-2 convolution; split: f32 partials of a K range per blockIdx.z. The two
// conversions before it: an NCHW image to NHWC, and the weights to A (flip: the input
// gradient's flipped, transposed filter).
// wgmma (bf16/f16 on sm_90 only, kernels/conv_wgmma.cuh): warpgroups of 4 warps instead, wm of
// them along the filters (bm = 64 wm; wn 1) multiplying from shared memory in the 128-byte
// swizzle, 8 pieces a step, bn 64, 128 or 256.
struct NhwcTile {
  int bm, bn, wm, wn, pieces, stages;
  bool wgmma = false;
  int threads() const { return (wgmma ? 128 : 32) * wm * wn; }
  std::size_t shared_bytes() const {  // wgmma: unpadded rows, 1 KiB to align the first tile
    return wgmma ? static_cast<std::size_t>((bm + bn) * 16 * pieces * stages + 1024)
                 : static_cast<std::size_t>((bm + bn) * (16 * pieces + 16) * stages);
  }
  bool operator==(const NhwcTile&) const = default;
};
// The tiles conv_nhwc_plan chooses from: 128 x 64 where there are 128 filters, else 64 x 128
// where that fills the SMs, else 64 x 64; K steps of 8 pieces (64 bf16 rows), 3 or 4 stages.
inline constexpr NhwcTile kNhwcTiles[] = {
    {128, 64, 2, 2, 8, 3}, {64, 128, 2, 2, 8, 3}, {64, 64, 2, 2, 8, 4}};
// Likewise on wgmma (conv_wgmma_enabled): 128 x 128 where that fills the SMs, else 64 x 128
// where that does, else 64 x 64.
inline constexpr NhwcTile kWgmmaTiles[] = {
    {128, 128, 2, 1, 8, 4, true}, {64, 128, 1, 1, 8, 5, true}, {64, 64, 1, 1, 8, 6, true}};
// Whether the kernel exists for `tile`: warp pieces of whole 16 x 16 fragments, whole loads
// per thread, 4 or 8 pieces a step, 2-6 stages, at most 256 threads and 227 KiB (wgmma: 1 or 2
// warpgroups, 8 pieces, 3-6 stages).
bool nhwc_tile_valid(NhwcTile tile);
std::string conv_nhwc_name(DType dtype, NhwcTile tile, bool dilated, bool split = false);
gpu::KernelSource conv_nhwc_source(DType dtype, NhwcTile tile, bool dilated, bool split = false);
// element_bytes: 2 or 4.
std::string nhwc_image_name(std::size_t element_bytes);
std::string nhwc_weights_name(bool flip, std::size_t element_bytes);
gpu::KernelSource nhwc_image_source(std::size_t element_bytes);
gpu::KernelSource nhwc_weights_source(bool flip, std::size_t element_bytes);
// The tensor-core weight gradient (kernels/conv_mma_wgrad.cuh): a tile of bm filters by bn
// patch rows, wm x wn warps, bk pixels a step; vec_a: dy by cp.async (OH*OW % 8 == 0);
// float_out: f32 split-K partials; vec_b: the patches as 16-byte runs (conv_mma_vector_x).
// wgmma (sm_90, kernels/conv_wgmma_wgrad.cuh): wm warpgroups along the filters (bm = 64 wm,
// wn 1), 64 pixels a step, three buffers of 128-byte swizzled rows.
struct WgradTile {
  int bm, bn, wm, wn, bk = 32;  // bk: pixels a step of 16-bit types (f32: half as many)
  bool wgmma = false;
  int threads() const { return (wgmma ? 128 : 32) * wm * wn; }
  std::size_t shared_bytes() const {  // two (wgmma: three) buffers of both tiles, the row table
    return wgmma ? static_cast<std::size_t>(3 * (bm + bn) * bk * 2 + bn * 16 + 1024)
                 : static_cast<std::size_t>(2 * (bm + bn) * (bk + 8) * 2 + bn * 16);
  }
  bool operator==(const WgradTile&) const = default;
};
// Whether the kernel exists for `tile`: warp pieces of whole 16 x 16 fragments, steps of 32 or
// 64 pixels, whole loads per thread, at most 256 threads and 227 KiB of shared memory (wgmma: 1
// or 2 warpgroups by 64, 128 or 256 patch rows, 64 pixels).
bool wgrad_tile_valid(WgradTile tile);
std::string conv_mma_wgrad_name(DType dtype, WgradTile tile, bool vec_a, bool float_out,
                                bool vec_b = false);
gpu::KernelSource conv_mma_wgrad_source(DType dtype, WgradTile tile, bool vec_a, bool float_out,
                                        bool vec_b = false);
// out[i] = the ordered sum over z of part[z * mn + i] (split-K partials of grad_weight, f32
// for bf16/f16 outputs).
gpu::KernelSource conv_splitk_sum_source(DType dtype);
// conv2d_bias's epilogue over the forward's stored NCHW output (kernels/conv.cuh).
gpu::KernelSource conv_bias_source(DType dtype);
// conv2d_moments' run moments of a stored NCHW output (kernels/conv.cuh), where the forward's
// epilogue does not compute them.
gpu::KernelSource conv_moments_source(DType dtype);

// pool_kernels.cpp
enum class PoolKernel { forward, grad, select };
gpu::KernelSource max_pool_source(PoolKernel which, DType dtype);  // 64-bit indices, any size
// 32-bit-index kernels (PoolShape32, planes * H * W < 2^30): forward and select with the
// window size fixed at 2 (k2) or any; the gradient as one thread per cell of windows that
// do not overlap (stride >= kernel; cells2: exact 2x2 cells, kernel = stride = 2, even H, W)
// or as a gather per input element (overlap: stride < kernel, or padding; planes: whole planes
// of at most 4096 cells a block, the windows' maxima found once in shared memory).
enum class PoolFast {
  forward_k2,
  forward_any,
  select_k2,
  select_any,
  grad_cells2,
  grad_cells,
  grad_overlap,
  grad_planes
};
std::string max_pool_fast_name(PoolFast which, DType dtype);
gpu::KernelSource max_pool_fast_source(PoolFast which, DType dtype);
// Average pooling (64-bit indices): forward per window, gradient (dy -> dx) per input element.
std::string avg_pool_name(bool grad, DType dtype);
gpu::KernelSource avg_pool_source(bool grad, DType dtype);

// layout_kernels.cpp
gpu::KernelSource transpose_source(std::size_t element_bytes);  // 1, 2, 4 or 8
gpu::KernelSource concat_source(std::size_t element_bytes);     // ConcatPieces (layout_params.h)
gpu::KernelSource one_hot_source(DType label, DType out);
gpu::KernelSource one_hot_finish_source(DType label);
gpu::KernelSource fill_source(DType dtype);

// random.cpp: Philox uniform values (any floating dtype) for random_uniform.
gpu::KernelSource random_uniform_source(DType dtype);

// lstm_kernels.cpp: one time step of lstm_sequence (forward) or lstm_sequence_grad
// (backward), the recurrent GEMM fused with the cell (backends/cuda/lstm.h).
std::string lstm_step_name(bool backward, DType dtype);
gpu::KernelSource lstm_step_source(bool backward, DType dtype);  // any floating dtype
std::string lstm_persistent_name(DType dtype);
gpu::KernelSource lstm_persistent_source(DType dtype);  // the forward, all steps in one launch
// lstm_mma.cpp: all steps of one direction on tensor cores (bf16 and f16 only).
std::string lstm_mma_name(bool backward, DType dtype);
gpu::KernelSource lstm_mma_source(bool backward, DType dtype);

// Every kernel the library can launch, for compile-only tests and preloading.
std::vector<gpu::KernelSource> all_kernel_sources();

}  // namespace kiln::cuda
