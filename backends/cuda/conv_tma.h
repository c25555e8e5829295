// The channels-last passes with both operands brought by the TMA (sm_90, bf16/f16): the forward
// (stride 1 or 2) and the input gradient (stride 1, or 2 by classes of dx's pixels: ConvClasses;
// kernels/conv_wgmma_tma.cuh), where a tile of output pixels is whole output rows, each K
// step's patches one box of the NHWC image shifted by the tap; and grad_weight
// (kernels/conv_wgmma_wgrad_tma.cuh).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "backends/cuda/kernels/conv_params.h"
#include "core/dtype.h"
#include "gpu/cuda_runtime.h"
#include "gpu/kernel_source.h"

namespace kiln::cuda {

// A tile: bm filters (64 per multiplying warpgroup) by bn pixels, `stages` buffers; `teams`
// teams of bm / 64 warpgroups: 1, a block a tile; 2, a persistent block an SM whose two teams
// take its tiles in turn (one's epilogue under the other's multiplies). split 2 (one team): a
// cluster of two blocks a tile, each multiplying half of its K steps, the halves summed in the
// first block's shared memory: for passes of too few tiles to fill the SMs.
// halo_bytes > 0: the halo form (kernels/conv_wgmma_tma_halo.cuh: bm 64, two teams, the filter
// resident, a box of rows a column of taps), whose shared memory it is.
struct TmaTile {
  int bm, bn, stages, teams = 1, split = 1;
  std::size_t halo_bytes = 0;
  bool halo() const { return halo_bytes > 0; }
  std::size_t shared_bytes() const {  // the tiles, 1 KiB to align them, two barriers a stage, two
    if (halo()) return halo_bytes;    // more, the staging tiles
    return static_cast<std::size_t>((bm + bn) * 128 * stages + 1024 + 16 * stages + 16) +
           staging_bytes();
  }
  // The store staging: 8 x 72 16-bit values for each consumer warp (staged_store_c in
  // kernels/conv_mma.cuh, kStageWarpBytes), in the plain and the halo form.
  std::size_t staging_bytes() const { return static_cast<std::size_t>(teams * (bm / 16)) * 1152; }
  int threads() const { return teams * 2 * bm + 32; }  // the warpgroups and the producer warp
};

// The tile the pass of `shape` takes, where it fits: wgmma runs (conv_wgmma_enabled), the pass
// is undilated with stride 1 or 2, the image's channels are a multiple of 64 and a tile of bn
// pixels is whole output rows of one image or whole images (a box of the image); KILN_CONV_TMA=0
// turns the TMA passes off, and they stand aside where a tile is forced (conv_tiles_forced).
// The halo form where it fits and is on (KILN_CONV_TMA_HALO=0: never): 64 channels, at most 64
// filters, stride 1, a tile of 128 pixels whole rows of one image (its box rows from the first
// tap's), rows a multiple of 8 pixels, the persistent two teams, and the resident filter with two
// teams' boxes in 227 KiB. `moments`: the pass writes conv2d_moments (the plain form's epilogue).
std::optional<TmaTile> conv_tma_tile(DType dtype, const ConvGemmShape& shape, bool dilated,
                                     bool moments = false);
// The halo form's tile for `shape` on any sm_90 (no GPU needed; conv_tma_tile's geometry).
std::optional<TmaTile> conv_tma_halo_tile(const ConvGemmShape& shape);
// The box of the image that a tile of bn output pixels reads for one tap: (rows, images) of
// whole output rows (a run of rows of one image, or whole images), or nullopt where bn pixels
// are not whole rows.
std::optional<std::pair<int, int>> conv_tma_box(const ConvGemmShape& shape, int bn);
// bm x bn with as many stages as fit (one team: at most 6, and half of 227 KiB where bm is 64;
// two teams: at most 8 in 227 KiB; each less its warps' staging tiles): the tiles conv_tma_tile
// gives. The 64-filter tiles take the persistent two-team form (KILN_CONV_TMA_TEAMS=1: a block
// a tile; stage-1 forward of resnet18 at b128 on the H200, ncu: 45 -> 38 us); two teams of
// 128-filter tiles would need more registers than 544 threads have. The 128-filter tiles split K in
// two (split 2) where their tiles are at most half the SMs and each half has at least 8 K steps
// (KILN_CONV_TMA_SPLIT=0: never).
TmaTile conv_tma_tile_of(int bm, int bn, int teams = 1, int split = 1);
// The split of a one-team tile of bm filters on a pass of `tiles` tiles and `steps` K steps, on
// a device of `sms` SMs (no GPU needed): 2 where the tiles fill at most half the SMs.
int conv_tma_split_of(int bm, std::int64_t tiles, int steps, int sms);
// moments: the kernel whose epilogue also writes conv2d_moments' run moments; classes 4: the
// input gradient of a stride-2 pass by classes of dx's pixels (ConvClasses).
std::string conv_tma_name(DType dtype, TmaTile tile, bool moments = false, int classes = 1);
gpu::KernelSource conv_tma_source(DType dtype, TmaTile tile, bool moments = false, int classes = 1);
// y = A x patches(xt) in `tile` (a: [M][K] tap-major; xt: the NHWC image, 16-byte aligned);
// where `moments` is not null, also y's run moments over 64 pixels, [3, ceil(N / 64), M]
// (graph/ops.h's conv2d_moments; the forward only). Where `classes` is not null (4 classes,
// never split), `shape` is a class's grid and y is dx (ConvClasses). y_channels_last: y is
// stored [pixels][M] (graph/ops.h's y_channels_last; not with moments).
void conv_tma_forward(DType dtype, const ConvGemmShape& shape, TmaTile tile, const void* a,
                      const void* xt, void* y, gpu::Stream stream, float* moments = nullptr,
                      const ConvClasses* classes = nullptr, bool y_channels_last = false);

// grad_weight's TMA pass (kernels/conv_wgmma_wgrad_tma.cuh): dW = dy x patches of x's
// channels-last copy (bf16, f16), or of x's tap columns (f32 under TF32: B's rows of br pixels), K
// (the batch's pixels) split into `splits` pieces of `chunk` pixels.
struct TmaWgradPlan {
  int bm, atoms, stages, ar;  // bm filters by `atoms` x 64 columns; A's rows of ar pixels
  bool wide;                  // one multiply across the atoms (else one a atom)
  int splits, chunk;
  int br = 0;      // f32: B's rows, br pixels of an output row or an image (0: 16-bit NHWC boxes)
  int per_sm = 1;  // blocks an SM: 2 where a tile of one warpgroup fits 3 stages in half of it
  // The halo form (a 16-bit stride-1 3x3 over 64 channels, 64 filters a tile, atoms 9): the
  // output's width OW; B a box of 64 / OW + 2 rows a tap column (0: an atom's box a tap).
  int halo = 0;
  std::size_t stage_bytes() const {
    return static_cast<std::size_t>(halo > 0 ? (bm + 3 * (64 + 2 * halo)) * 128
                                             : (bm + 64 * atoms) * 128);
  }
  std::size_t shared_bytes() const { return stage_bytes() * stages + 1024 + 16 * stages; }
  int threads() const { return halo > 0 ? 3 * 128 + 32 : 2 * bm + 32; }
  std::size_t partial_bytes(std::int64_t m, std::int64_t n) const {
    return static_cast<std::size_t>(splits) * static_cast<std::size_t>(m * n) * 4;
  }
};
// The plan of grad_weight's `shape` where the pass fits: conv_tma_tile's conditions, and each
// K step of 64 pixels whole output rows of one image (OH*OW % 64 == 0, 64 % OW == 0) or whole
// images (OH*OW 16 or 32).
std::optional<TmaWgradPlan> conv_tma_wgrad_plan(DType dtype, const ConvGemmShape& shape);
// The same for a device of `sms` SMs, strides up to max_stride and the multiply form `wide`,
// whatever this machine has (no GPU needed): 64 or 128 filters by the most atoms (4, 3, 2, 1)
// that divide N, K split for about one block an SM, at least 4 steps a split.
// `halo`: the halo form where it fits (conv_tma_wgrad_halo_plan_of; the backend asks for it
// where it pays, conv_tma_wgrad_halo_pays, or as KILN_CONV_WGRAD_HALO says).
std::optional<TmaWgradPlan> conv_tma_wgrad_plan_of(const ConvGemmShape& shape, int max_stride,
                                                   int sms, bool wide, bool halo = true);
// The halo form's plan (kernels/conv_wgmma_wgrad_tma.cuh, HALO): a stride-1 3x3 over 64
// channels whose K steps are whole output rows of 8, 16 or 32 pixels, three stages at least;
// one block an SM, K split for one wave. (x's bytes a step: 3 (R + 2) / R rows' worth where the
// nine taps' boxes read 9: resnet18's stage 1, whose 64 x 192 tiles were bound by L2.)
std::optional<TmaWgradPlan> conv_tma_wgrad_halo_plan_of(const ConvGemmShape& shape, int sms,
                                                        bool wide);
// Whether the halo form pays where it fits (the backend's default): its wave of blocks takes at
// least 32 K steps each (resnet18's stage 1 at b512: 63, -0.07 to -0.12 ms a step on an H100; at
// b128 16, +0.01 to +0.02 ms: its 132 splits' partials cost as much as at b512, the steps a
// quarter).
bool conv_tma_wgrad_halo_pays(const ConvGemmShape& shape, int sms);
// f32's (TF32) plan likewise: K steps of 32 pixels (the same 128-byte rows), stride 1 or 2, x
// read through its tap columns, each step one output row's run of 32 pixels (OW a multiple of
// 32) or whole rows of 8 or 16 (32 % OW == 0), OH*OW a multiple of 32; or, at stride 1, whole
// images of 16 or 8 pixels (OW a multiple of 4; B's rows an image each, br = OH*OW).
std::optional<TmaWgradPlan> conv_tma_tf32_wgrad_plan_of(const ConvGemmShape& shape, int sms,
                                                        bool wide);
// TF32's tap columns of x (kernels/tap_expand.cuh): x3 [B][C][taps][rows][OW] (taps KW, or KW - 1
// without the centre tap where it is boxed from x: tf32_centre_from_x), x3[.][kw][h][j] =
// x[.][h][stride j + kw - pad], rows x's H, or where an image is fewer pixels than a K step
// (OH*OW 16 or 8, stride 1) H + 2 pad_h rows from x's row -pad_h (zeros outside x), so that each
// tap's pixels of an image are one run; its rows, its bytes, and the copy (`shape` the pass's, x3
// 16-byte aligned).
int tf32_tap_rows(const ConvGemmShape& shape);
// Its tap columns: KW, or KW - 1 where the centre tap is boxed from x (tf32_centre_from_x).
int tf32_tap_columns(const ConvGemmShape& shape);
std::size_t tf32_tap_expand_bytes(const ConvGemmShape& shape);
gpu::KernelSource tap_expand_source();
void tf32_tap_expand(const ConvGemmShape& shape, const void* x, void* x3, gpu::Stream stream);
// bm x 64 atoms with as many stages (at most 8) as fit 227 KiB; a tile of one warpgroup (bm 64),
// two blocks an SM where 3 or 4 stages fit half of it (KILN_CONV_WGRAD_TWO_A_SM=0: one).
TmaWgradPlan conv_tma_wgrad_tile_of(int bm, int atoms, int ar, bool wide);
// dy_nhwc: the kernel that reads dy stored channels-last ([pixels][M]; M >= 64, M % 8 == 0:
// conv_tma_wgrad_reads_nhwc_dy), as wgmma's MN-major A.
gpu::KernelSource conv_tma_wgrad_source(DType dtype, const TmaWgradPlan& plan,
                                        bool dy_nhwc = false);
bool conv_tma_wgrad_reads_nhwc_dy(const ConvGemmShape& shape);
// The sum of the splits' partials into dW's order (kernels/conv_wgmma_wgrad_tma.cuh).
gpu::KernelSource conv_tma_wgrad_sum_source(DType dtype);
// dW = dy x patches(xt) (shape.k_chunk = plan.chunk): the splits' f32 partials into
// `partials` (plan.partial_bytes, 16-byte aligned), then their sum into dw. f32: xt is x's tap
// columns and x the NCHW x (the centre tap's, tf32_centre_from_x).
void conv_tma_grad_weight(DType dtype, const ConvGemmShape& shape, const TmaWgradPlan& plan,
                          const void* dy, const void* xt, void* partials, void* dw,
                          gpu::Stream stream, bool dy_nhwc = false, const void* x = nullptr);

namespace detail {
// Turns the TMA passes on or off wherever they fit (nullopt: as KILN_CONV_TMA and
// conv_tiles_forced say).
void set_conv_tma_for_testing(std::optional<bool> on);
// Whether grad_weight's TMA pass multiplies across its atoms at once (true, the default).
void set_conv_tma_wide_for_testing(bool wide);
// The 64-filter tiles' teams: 2 (persistent, the default) or 1 (a block a tile),
// the persistent grid at most max_blocks blocks (0: one an SM), so that a test's small passes
// give each block many tiles.
void set_conv_tma_teams_for_testing(int teams, int max_blocks = 0);
// Whether the 128-filter tiles may split K (conv_tma_split_of; nullopt: as KILN_CONV_TMA_SPLIT
// says), or (always) split wherever a pass has at least two K steps.
enum class TmaSplit { never, automatic, always };
void set_conv_tma_split_for_testing(std::optional<TmaSplit> split);
// Whether the halo form is taken where it fits (nullopt: as KILN_CONV_TMA_HALO says).
void set_conv_tma_halo_for_testing(std::optional<bool> on);
// Whether grad_weight's halo form is taken where it fits (nullopt: as KILN_CONV_WGRAD_HALO says).
void set_conv_wgrad_halo_for_testing(std::optional<bool> on);
}  // namespace detail

}  // namespace kiln::cuda
