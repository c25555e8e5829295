// The tensor-core convolution passes of bf16 and f16 (kernels/conv_mma.cuh, conv_mma_wgrad.cuh):
// their launches over one implicit GEMM each; conv.cpp decides where they run (wherever the
// implicit GEMM would).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/kernels/conv_params.h"
#include "core/dtype.h"
#include "gpu/cuda_runtime.h"

namespace kiln::cuda {

// y = W x patches as `shape` describes the forward GEMM (conv.cpp's gemm_shape): one launch of
// conv_mma_tile_m x 64 tiles; the weights by cp.async where K % 8 == 0 and w is 16-byte aligned.
// grad_input kinds: w is the weights transposed to [Cin][Cout][KH][KW], x is dy.
void conv_mma_forward(DType dtype, const ConvGemmShape& shape, const void* w, const void* x,
                      void* y, gpu::Stream stream, ConvMmaKind kind = ConvMmaKind::forward);
// Whether conv_mma_forward loads the weights of a K-long filter by cp.async (w aligned).
inline bool conv_mma_vector_weights(std::int64_t k) { return k % 8 == 0; }
// Its tile's filters for an M x N GEMM: 128 (each gathered patch feeds twice the tensor-core
// work) where there are that many and the tiles still fill the 132 SMs, else 64.
inline int conv_mma_tile_m(std::int64_t m, std::int64_t n) {
  return m >= 128 && (m + 127) / 128 * ((n + 63) / 64) >= 132 ? 128 : 64;
}

// The channels-last passes (kernels/conv_mma_nhwc.cuh), for images whose channels are a
// multiple of 16 bytes' worth (8 bf16/f16, 4 f32): each piece of a patch column is then one
// 16-byte load.
inline bool conv_nhwc_fits(std::int64_t image_channels, DType dtype) {
  return image_channels % static_cast<std::int64_t>(16 / dtype_size(dtype)) == 0;
}
// The channels-last GEMM's A from w[co, ci, kh, kw] (graph/ops.h, conv_filter_layout) for each
// job, filters of one size (KH*KW = khkw, at most kMaxFilterTaps), in one launch a
// kMaxFilterCopies of them: [co][tap][ci], or (channels_major, the input gradient)
// [ci][tap][co], the taps in the order `taps` gives.
struct FilterLayoutJob {
  const void* w;
  void* a;
  std::int64_t out_channels, in_channels;
};
void nhwc_weights(DType dtype, std::span<const FilterLayoutJob> jobs, std::int64_t khkw,
                  bool channels_major, std::span<const std::int64_t> taps, gpu::Stream stream);
// The order of a filter's taps in that copy: the input gradient's classes' (class_source_tap;
// one class of stride 1: the filter mirrored), or (classes null, the forward) as stored.
std::vector<std::int64_t> conv_filter_taps(const ConvClasses* classes, std::int64_t khkw);
// Its plan for the GEMM of `shape` (dilated: grad_input at stride 2) in `dtype`: the tile
// autotuned for the shape (conv_tuning.h: the kernel cache's decision, else, with may_time,
// every candidate timed now), or where tuning is off or not yet done, 128 x 64 wherever there
// are 128 filters (it was the fastest on every such ResNet-18 pass at batch 128, even at 128
// blocks), else 64 x 128 where that gives a block per SM, else 64 x 64; K is not split (split-K
// partials measured slower on every ResNet-18 shape). KILN_NHWC_TILE=
// "bm,bn,wm,wn,pieces,stages[,splits]" forces one tile and split count for every pass, to
// compare tiles (bench/README.md).
struct NhwcPlan {
  NhwcTile tile;
  std::int64_t splits = 1, chunk = 0;
  std::size_t partial_bytes(std::int64_t m, std::int64_t n) const {
    return splits > 1 ? static_cast<std::size_t>(splits * m * n) * 4 : 0;
  }
};
NhwcPlan conv_nhwc_plan(DType dtype, const ConvGemmShape& shape, bool dilated, bool may_time);
// Whether the tensor-core passes of `dtype` run on wgmma (kernels/conv_wgmma.cuh for the
// channels-last forward and grad_input, kernels/conv_wgmma_wgrad.cuh for grad_weight): bf16,
// f16 or f32 (TF32: conv.cpp lets f32 reach them only under --precision tf32) on an sm_90
// device, unless KILN_WGMMA=0 or the test hook below turns it off; the default tiles are then
// kWgmmaTiles's and conv_wgmma_wgrad_default_tile's, the candidates kWgmmaCandidates and
// kWgmmaWgradCandidates. KILN_NHWC_TILE's eighth field 1 forces a wgmma tile (where wgmma
// runs; the other passes keep their choice). The TMA passes (conv_tma.h) are 16-bit only.
bool conv_wgmma_enabled(DType dtype);
// Whether a tile is forced (KILN_NHWC_TILE, or a test's forced channels-last plan or grad_weight
// tile): the TMA passes (conv_tma.h) then stand aside unless a test turns them on.
bool conv_tiles_forced();
// y = A x patches of the NHWC image xt, `shape` as conv_mma_forward's (dilated: grad_input at
// stride 2); a and xt 16-byte aligned; `partials` (256-byte aligned, plan.partial_bytes) where
// the plan splits K. moments (not null only where the TMA pass runs, conv_tma_tile): the run
// moments of y that its epilogue writes (conv_tma_forward); y_channels_last (the TMA pass only):
// y stored [pixels][M].
void conv_nhwc_forward(DType dtype, const ConvGemmShape& shape, const void* a, const void* xt,
                       void* y, void* partials, gpu::Stream stream, bool dilated,
                       float* moments = nullptr, bool y_channels_last = false);
// One launch of that GEMM in `tile`, K not split (the tuner's candidates).
void conv_nhwc_launch(DType dtype, const ConvGemmShape& shape, NhwcTile tile, const void* a,
                      const void* xt, void* y, gpu::Stream stream, bool dilated);
namespace detail {
// Forces every channels-last pass onto `plan`'s tile and split count (nullopt: the choice
// above), as KILN_NHWC_TILE does; a test hook (not thread-safe).
void force_nhwc_plan_for_testing(std::optional<NhwcPlan> plan);
// Whether conv_wgmma_enabled may say yes (true: as KILN_WGMMA allows).
void set_wgmma_for_testing(bool allowed);
// Whether grad_weight may gather 16-byte runs (true: where conv_mma_vector_x allows).
void set_wgrad_runs_for_testing(bool allowed);
// Forces every tensor-core weight gradient onto `tile` (nullopt: the tuned or default tile).
void force_wgrad_tile_for_testing(std::optional<WgradTile> tile);
}  // namespace detail

// The weight gradient's split of its K = B*OH*OW pixels: `count` pieces of `chunk` (a multiple
// of the 32-pixel step), enough blocks for four per SM of an H100/H200, at least 8 steps each,
// and no more partials than `scratch_bytes` holds (f32, M * N each; count 1 needs none).
struct MmaSplits {
  std::int64_t count = 1, chunk = 0;
};
MmaSplits conv_mma_wgrad_splits(std::int64_t m, std::int64_t n, std::int64_t k,
                                std::size_t scratch_bytes = SIZE_MAX);
inline std::size_t conv_mma_wgrad_scratch(const MmaSplits& s, std::int64_t m, std::int64_t n) {
  return s.count > 1 ? static_cast<std::size_t>(s.count * m * n) * 4 : 0;
}
// The weight tile's filters: 128 where there are that many, else 64 (the default tile's, which
// also sets the split count).
inline int conv_mma_wgrad_tile_m(std::int64_t m) { return m >= 128 ? 128 : 64; }
// The default tile: conv_mma_wgrad_tile_m filters by 64 patch rows, warps of 32 x 32.
inline WgradTile conv_mma_wgrad_default_tile(std::int64_t m) {
  return m >= 128 ? WgradTile{128, 64, 4, 2} : WgradTile{64, 64, 2, 2};
}
// On wgmma (conv_wgmma_enabled): 128 (or 64) filters by 128 patch rows.
inline WgradTile conv_wgmma_wgrad_default_tile(std::int64_t m) {
  return m >= 128 ? WgradTile{128, 128, 2, 1, 64, true} : WgradTile{64, 128, 1, 1, 64, true};
}
// The tile of the pass `shape` (grad_weight's, split by `splits`): autotuned (conv_tuning.h:
// the kernel cache's decision, else, with may_time, every candidate timed now), else the default.
WgradTile conv_mma_wgrad_tile(DType dtype, const ConvGemmShape& shape, const MmaSplits& splits,
                              bool may_time);
// Whether the weight gradient loads dy by cp.async: 8-pixel pieces never cross an image.
inline bool conv_mma_vector_dy(std::int64_t pixels) { return pixels % 8 == 0; }
// Whether it gathers the patches of `shape` (grad_weight's) as 16-byte runs: stride 1 and the
// image's and the output's widths multiples of 8 (x 16-byte aligned too, checked at launch);
// KILN_WGRAD_RUNS=0 or the test hook below turns them off.
bool conv_mma_vector_x(const ConvGemmShape& shape);

// dW[M, N] = dy x patches as `shape` describes grad_weight's GEMM (k_chunk = splits.chunk):
// straight into dw with one split, else f32 partials into `partials` (conv_mma_wgrad_scratch
// bytes, 256-byte aligned) summed in order into dw.
void conv_mma_grad_weight(DType dtype, const ConvGemmShape& shape, const MmaSplits& splits,
                          const void* dy, const void* x, void* dw, void* partials,
                          gpu::Stream stream);
// Its GEMM in `tile` into `target` (dw, or the partials when splits.count > 1), the sum not done.
void conv_mma_wgrad_launch(DType dtype, const ConvGemmShape& shape, const MmaSplits& splits,
                           WgradTile tile, const void* dy, const void* x, void* target,
                           gpu::Stream stream);

}  // namespace kiln::cuda
