// Autotuned tiles of the convolution passes: on the tensor cores the channels-last forward and
// grad_input (conv_mma_nhwc.cuh) and the weight gradient (conv_mma_wgrad.cuh), on the CUDA
// cores the implicit GEMM (conv_igemm.cuh). Each pass shape
// times every candidate tile once on the device (gpu/autotune.h) and keeps the fastest in the
// kernel cache. Every candidate of a pass sums K in the same order, so the choice never changes
// a result's bits.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backends/cuda/conv_mma.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/kernels/conv_params.h"
#include "core/dtype.h"
#include "gpu/kernel_source.h"

namespace kiln::cuda {

// The tiles timed: the three of kNhwcTiles, larger ones of 64 x 64 warp tiles (twice the
// tensor-core work per fragment loaded) and of 8 warps, and K steps of 4 pieces in 4 stages
// (less shared memory a block: 3 blocks of 4 warps on an SM where 8-piece tiles fit 2).
inline constexpr NhwcTile kNhwcCandidates[] = {
    {128, 64, 2, 2, 8, 3}, {64, 128, 2, 2, 8, 3}, {64, 64, 2, 2, 8, 4},  {128, 128, 2, 2, 8, 3},
    {128, 64, 2, 1, 8, 3}, {64, 128, 1, 2, 8, 3}, {256, 64, 4, 1, 8, 3}, {128, 128, 2, 4, 8, 3},
    {128, 64, 2, 2, 4, 4}, {64, 128, 2, 2, 4, 4}, {128, 128, 2, 4, 4, 4}};

// The wgmma tiles (sm_90, bf16/f16; conv_wgmma.cuh), timed instead of those above where
// conv_wgmma_enabled: 1 or 2 warpgroups by 64, 128 or 256 pixels, with as many stages as fit
// one block an SM, and fewer, so that two or more blocks fit.
inline constexpr NhwcTile kWgmmaCandidates[] = {
    {128, 128, 2, 1, 8, 4, true}, {128, 64, 2, 1, 8, 5, true},  {64, 128, 1, 1, 8, 5, true},
    {64, 64, 1, 1, 8, 6, true},   {128, 256, 2, 1, 8, 3, true}, {64, 256, 1, 1, 8, 4, true},
    {128, 128, 2, 1, 8, 3, true}, {128, 64, 2, 1, 8, 4, true},  {64, 128, 1, 1, 8, 4, true},
    {64, 64, 1, 1, 8, 4, true}};
// The candidates of a channels-last pass in `dtype` on this device: kWgmmaCandidates where
// conv_wgmma_enabled, else kNhwcCandidates.
std::span<const NhwcTile> nhwc_candidates(DType dtype);

// "bm x bn, warps wm x wn, pieces, stages" as a label without spaces: "128x64w2x2p8s3"
// (wgmma tiles: "128x128g2p8s4", g for warpgroups).
std::string nhwc_tile_label(NhwcTile tile);
// What the tuner calls the pass: its dtype, direction and every field of its shape.
std::string nhwc_problem(DType dtype, const ConvGemmShape& shape, bool dilated);

// The tuned tile of the pass: the cache's decision, else (may_time) each candidate timed now on
// random operands of the shape; nullopt where tuning is off (KILN_AUTOTUNE=0) or, without
// may_time, not yet done. Never call with may_time while a stream is being captured.
std::optional<NhwcTile> tuned_nhwc_tile(DType dtype, const ConvGemmShape& shape, bool dilated,
                                        bool may_time);
// The sources a pass may launch while it is tuned: every candidate's.
std::vector<gpu::KernelSource> nhwc_candidate_sources(DType dtype, bool dilated);

// The tensor-core weight gradient's tiles (conv_mma_wgrad.cuh) likewise, where dy arrives by
// cp.async (conv_mma_vector_dy; else the default tile), its split count fixed by the default
// tile's (conv_mma_wgrad_splits), so every candidate sums each element over the
// same K steps in the same order: the default two, larger ones of 64-wide warp pieces, and
// steps of 64 pixels (half the barriers, twice the loads in flight).
inline constexpr WgradTile kWgradCandidates[] = {
    {64, 64, 2, 2},       {128, 64, 4, 2},    {128, 128, 2, 2},   {64, 128, 1, 2},
    {64, 128, 2, 2},      {128, 128, 2, 4},   {64, 64, 2, 2, 64}, {128, 64, 4, 2, 64},
    {128, 128, 2, 2, 64}, {64, 128, 2, 2, 64}};
// On wgmma (conv_wgmma_enabled) these instead, each summing over the same splits and steps.
inline constexpr WgradTile kWgmmaWgradCandidates[] = {{128, 128, 2, 1, 64, true},
                                                      {64, 128, 1, 1, 64, true},
                                                      {128, 64, 2, 1, 64, true},
                                                      {64, 64, 1, 1, 64, true},
                                                      {128, 256, 2, 1, 64, true}};
// The weight-gradient candidates of `dtype` on this device.
std::span<const WgradTile> wgrad_candidates(DType dtype);
std::optional<WgradTile> tuned_wgrad_tile(DType dtype, const ConvGemmShape& shape,
                                          const MmaSplits& splits, bool may_time);

// The CUDA-core implicit GEMM's tiles (conv_igemm.cuh; f32 and bf16/f16) likewise: the tiles of
// kIgemmCandidates with the default tile's thread groups and K step (kg, ks: the order in which
// each element is summed), the split count the default's.
inline constexpr IgemmTile kIgemmCandidates[] = {
    {64, 128, 1, 16, 8, 8}, {32, 64, 1, 16, 4, 8}, {64, 64, 1, 16, 8, 8},  {128, 64, 1, 16, 8, 8},
    {64, 64, 1, 16, 4, 4},  {32, 32, 1, 16, 4, 4}, {64, 32, 2, 16, 8, 4},  {64, 32, 2, 16, 4, 4},
    {32, 32, 2, 16, 4, 4},  {64, 64, 2, 16, 8, 8}, {32, 64, 2, 16, 4, 8},  {32, 16, 4, 16, 4, 4},
    {64, 64, 2, 16, 4, 4},  {32, 32, 4, 16, 4, 4}, {128, 128, 1, 16, 8, 8}};
std::optional<IgemmTile> tuned_igemm_tile(IgemmMode mode, DType dtype, const ConvGemmShape& shape,
                                          IgemmTile base, std::int64_t splits, bool may_time);
// The candidates timed for a pass whose default tile is `base`: base first, then every tile of
// kIgemmCandidates with its thread groups and K step that has a kernel for `dtype`.
std::vector<IgemmTile> igemm_candidates(IgemmTile base, DType dtype);

}  // namespace kiln::cuda
