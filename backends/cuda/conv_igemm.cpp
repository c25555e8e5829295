// A convolution pass as an implicit GEMM (conv_passes.h): its dimensions and the kernels'
// description of it, and the CUDA-core kernel (kernels/conv_igemm.cuh): its tile (the default,
// forced by a test, or autotuned among tiles that sum in the default's order: conv_tuning.h),
// grad_weight's K splits, its sources and its launch.
#include "backends/cuda/conv_igemm.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <vector>

#include "backends/cuda/conv_passes.h"
#include "backends/cuda/conv_tuning.h"
#include "backends/cuda/kernel_registry.h"
#include "core/env_switch.h"
#include "core/error.h"

namespace kiln::cuda {

namespace detail {
namespace {
ConvTiling g_tiling[3];
}  // namespace
void set_conv_tiling_for_testing(ConvPass pass, ConvTiling tiling) {
  g_tiling[static_cast<int>(pass)] = tiling;
}
}  // namespace detail

void conv_igemm_launch(IgemmMode mode, DType dtype, IgemmTile tile, const ConvGemmShape& shape,
                       std::int64_t splits, const void* a, const void* img, void* target,
                       gpu::Stream stream, const ConvClasses* classes, ConvBias bias) {
  const bool by_classes = mode == IgemmMode::grad_input_classes;
  KILN_CHECK(by_classes == (classes != nullptr) && (!by_classes || splits == 1),
             "conv implicit GEMM: the input gradient by classes takes the classes and no K split");
  KILN_CHECK((bias.bias == nullptr && !bias.relu) || (mode == IgemmMode::forward && splits == 1),
             "conv implicit GEMM: a bias or ReLU epilogue asked of a pass other than an unsplit "
             "forward");
  const bool float_out = splits > 1 && is_low_precision(dtype);  // f32 partials
  const DeviceKernel& k = device_kernel(conv_igemm_name(mode, tile, dtype, float_out), [&] {
    return conv_igemm_source(mode, tile, dtype, float_out);
  });
  ConvGemmShape s = shape;
  ConvClasses cl = by_classes ? *classes : ConvClasses{};
  const void* bias_ptr = bias.bias;
  int relu = bias.relu ? 1 : 0;
  void* args[] = {&a, &img, &target, &s, &cl, &bias_ptr, &relu};
  const gpu::Dim3 grid{static_cast<unsigned>((shape.n + tile.bn - 1) / tile.bn),
                       static_cast<unsigned>((shape.m + tile.bm - 1) / tile.bm),
                       static_cast<unsigned>(by_classes ? cl.count : splits)};
  k.kernel.launch(grid, {static_cast<unsigned>(igemm_threads(tile)), 1, 1}, 0, stream, args);
}

namespace conv_detail {
namespace {

// grad_weight's K splits: enough for about two blocks an SM of an H100 or H200 (132 SMs), and
// up to six where each split keeps at least kLongSplitSteps K steps, so that the SMs hold
// enough warps to hide a long K loop's gathers, where the partials' bytes stay small beside
// the split's work; never a split of fewer than kMinSplitSteps (each split's tables, partials
// and sum cost about as much as a few steps). resnet18 fp32 on an H100, device ms at b128 / b512
// with one target for all: 264 blocks 14.985 / 56.283, 528 14.738 / 55.467, 792 14.488 /
// 53.307, 1056 14.603 / 53.354, 1584 14.841 / 53.482; inception's b64 / b256 steps (short K
// loops, small tiles) 0.818 / 2.087 at 264, 0.833 / 2.129 at 792. This rule: resnet18 15.03 /
// 53.40 (b128's stage 1 keeps 64 of the 88 splits it wants; 32-step long splits would give it
// all, not yet measured), inception 0.821 / 2.092. KILN_IGEMM_WGRAD_BLOCKS sets the larger
// target.
constexpr std::int64_t kGradWeightBlocks = 264, kMinSplitSteps = 8, kLongSplitSteps = 64;
std::int64_t grad_weight_more_blocks() {
  static const std::int64_t blocks =
      env_integer("KILN_IGEMM_WGRAD_BLOCKS", 792, 1, 65535, "a block count from 1 to 65535");
  return blocks;
}

std::int32_t i32(std::int64_t v) { return static_cast<std::int32_t>(v); }

// The tiling a test forces on `pass` (bm 0: none).
const detail::ConvTiling& forced_tiling(ConvPass pass) {
  const auto i = static_cast<std::size_t>(pass);
  KILN_ASSERT(i < std::size(detail::g_tiling), "conv pass {}", i);
  return detail::g_tiling[i];
}

// The pass's default tile: forced, else igemm_choose_tile's (it also sets grad_weight's splits).
IgemmTile default_tile(const ConvGeometry& g, DType dtype, ConvPass pass) {
  const GemmDims d = igemm_dims(g, pass);
  const detail::ConvTiling& forced = forced_tiling(pass);
  if (forced.bm > 0) {
    const IgemmTile tile{forced.bm, forced.bn, forced.kg, forced.ks > 0 ? forced.ks : 16,
                         forced.tm, forced.tn};
    KILN_CHECK(
        igemm_tile_valid(tile, dtype),
        "conv: no implicit-GEMM kernel for the forced {}x{}x{} tile (K step {}, {}x{} per thread)",
        tile.bm, tile.bn, tile.kg, tile.ks, tile.tm, tile.tn);
    return tile;
  }
  return igemm_choose_tile(igemm_mode(g, pass), dtype, d.m, d.n);
}

// K splits of grad_weight and the K range of each (a multiple of the tile's K step).
struct Splits {
  std::int64_t count = 1, chunk = 0;
};
Splits splits_for(const GemmDims& d, IgemmTile tile, ConvPass pass, std::int64_t wanted = 0) {
  const std::int64_t bk = static_cast<std::int64_t>(tile.ks) * tile.kg;
  const std::int64_t steps = std::max<std::int64_t>(1, (d.k + bk - 1) / bk);
  if (pass != ConvPass::grad_weight) return {1, steps * bk};
  if (wanted <= 0) {
    const std::int64_t forced = forced_tiling(pass).splits;
    const std::int64_t tiles = ((d.m + tile.bm - 1) / tile.bm) * ((d.n + tile.bn - 1) / tile.bn);
    const std::int64_t more =
        std::min((grad_weight_more_blocks() + tiles - 1) / tiles, steps / kLongSplitSteps);
    wanted = forced > 0 ? forced : std::max((kGradWeightBlocks + tiles - 1) / tiles, more);
  }
  // (a split of at least kMinSplitSteps K steps where the target asks more: each split's
  // tables, partials and sum cost about as much as a few steps)
  const std::int64_t most =
      forced_tiling(pass).splits > 0 ? steps : std::max<std::int64_t>(1, steps / kMinSplitSteps);
  wanted = std::clamp<std::int64_t>(wanted, 1, std::min<std::int64_t>(most, 65535));
  const std::int64_t per = (steps + wanted - 1) / wanted;
  return {(steps + per - 1) / per, per * bk};
}

// The tile the pass runs in: the tuner's choice among tiles of the default's K order (the
// same splits), else the default; forced tiles are never tuned, nor (yet) the classes' passes.
IgemmTile tile_for(const ConvGeometry& g, DType dtype, ConvPass pass, bool may_time) {
  const GemmDims d = igemm_dims(g, pass);
  const IgemmTile base = default_tile(g, dtype, pass);
  const IgemmMode mode = igemm_mode(g, pass);
  if (forced_tiling(pass).bm > 0 || mode == IgemmMode::grad_input_classes) return base;
  const Splits s = splits_for(d, base, pass);
  return tuned_igemm_tile(mode, dtype, gemm_shape(g, pass, d, s.chunk), base, s.count, may_time)
      .value_or(base);
}

// The kernel's description of the pass (gemm_shape's); by classes, one class grid's: H / 2 x
// W / 2 windows at stride 1, each class's shift and taps its own (the kernel's class_shape).
ConvGemmShape igemm_shape(const ConvGeometry& g, ConvPass pass, const GemmDims& d,
                          std::int64_t k_chunk) {
  ConvGemmShape s = gemm_shape(g, pass, d, k_chunk);
  if (igemm_mode(g, pass) != IgemmMode::grad_input_classes) return s;
  s.s_w /= 2;
  s.s_hw /= 4;
  s.pad_h = s.pad_w = 0;
  return s;  // (c_ms: dx's plane; a_ms and K the whole filter's)
}

}  // namespace

bool igemm_by_classes(const ConvGeometry& g) {
  static const bool on = env_switch_on("KILN_IGEMM_CLASSES");
  return on && g.stride == 2 && g.height % 2 == 0 && g.width % 2 == 0;
}

IgemmMode igemm_mode(const ConvGeometry& g, ConvPass pass) {
  switch (pass) {
    case ConvPass::forward:
      return IgemmMode::forward;
    case ConvPass::grad_input:
      return igemm_by_classes(g) ? IgemmMode::grad_input_classes : IgemmMode::grad_input;
    case ConvPass::grad_weight:
      return IgemmMode::grad_weight;
  }
  return IgemmMode::forward;
}

GemmDims igemm_dims(const ConvGeometry& g, ConvPass pass) {
  GemmDims d = dims_of(g, pass);
  if (igemm_mode(g, pass) == IgemmMode::grad_input_classes) d.n /= 4;  // one class's pixels
  return d;
}

GemmDims dims_of(const ConvGeometry& g, ConvPass pass) {
  const std::int64_t b = g.batch, kk = g.kernel_h * g.kernel_w;
  switch (pass) {
    case ConvPass::forward:
      return {g.out_channels, b * g.out_h * g.out_w, g.in_channels * kk};
    case ConvPass::grad_input:
      return {g.in_channels, b * g.height * g.width, g.out_channels * kk};
    case ConvPass::grad_weight:
      return {g.out_channels, g.in_channels * kk, b * g.out_h * g.out_w};
  }
  return {0, 0, 0};
}

// grad_weight's partials (the pass's tile is tuned here, when it is sized).
std::size_t igemm_workspace(const ConvGeometry& g, DType dtype, ConvPass pass) {
  tile_for(g, dtype, pass, true);
  if (pass != ConvPass::grad_weight) return 0;
  const GemmDims d = dims_of(g, pass);
  const Splits s = splits_for(d, default_tile(g, dtype, pass), pass);
  return s.count > 1 ? static_cast<std::size_t>(s.count * d.m * d.n) * wide_size(dtype) : 0;
}

// The GEMM's description for the kernel: which tensor is the image, how its windows are
// laid out, and the strides of A and C along M (kernels/conv_params.h, ConvGemmShape).
ConvGemmShape gemm_shape(const ConvGeometry& g, ConvPass pass, const GemmDims& d,
                         std::int64_t k_chunk) {
  ConvGemmShape s{};
  s.m = i32(d.m);
  s.n = i32(d.n);
  s.k = i32(d.k);
  s.k_chunk = i32(k_chunk);
  s.khkw = i32(g.kernel_h * g.kernel_w);
  s.kw = i32(g.kernel_w);
  if (pass == ConvPass::grad_input) {  // image dy, windows over dx's grid, flipped filter
    s.s_hw = i32(g.height * g.width);
    s.s_w = i32(g.width);
    s.stride = 1;
    s.pad_h = i32(g.kernel_h - 1 - g.padding);
    s.pad_w = i32(g.kernel_w - 1 - g.padding);
    s.img_chw = i32(g.out_channels * g.out_h * g.out_w);
    s.img_hw = i32(g.out_h * g.out_w);
    s.img_h = i32(g.out_h);
    s.img_w = i32(g.out_w);
    s.a_ms = s.khkw;
    s.c_ms = s.s_hw;
    return s;
  }
  s.s_hw = i32(g.out_h * g.out_w);  // image x, windows over y's (dy's) grid
  s.s_w = i32(g.out_w);
  s.stride = i32(g.stride);
  s.pad_h = s.pad_w = i32(g.padding);
  s.img_chw = i32(g.in_channels * g.height * g.width);
  s.img_hw = i32(g.height * g.width);
  s.img_h = i32(g.height);
  s.img_w = i32(g.width);
  s.a_ms = pass == ConvPass::forward ? s.k : s.s_hw;
  s.c_ms = pass == ConvPass::forward ? s.s_hw : s.n;
  return s;
}

void run_igemm(DType dtype, const ConvGeometry& g, ConvPass pass, const void* a, const void* img,
               void* out, const ConvWorkspace& ws, gpu::Stream stream, ConvBias bias) {
  const GemmDims d = igemm_dims(g, pass);
  if (d.m == 0 || d.n == 0) return;
  const IgemmTile base = default_tile(g, dtype, pass);
  Splits splits = splits_for(d, base, pass);
  IgemmTile tile = tile_for(g, dtype, pass, false);
  const std::size_t partial_bytes = static_cast<std::size_t>(d.m * d.n) * wide_size(dtype);
  if (splits.count > 1 &&
      ws.bytes < splits.count * partial_bytes) {  // as many splits as the scratch holds
    splits =
        splits_for(d, base, pass,
                   std::max<std::int64_t>(1, static_cast<std::int64_t>(ws.bytes / partial_bytes)));
    tile = base;  // the tuned tile was timed with the default splits
  }
  if (splits.count > 1)
    KILN_CHECK(reinterpret_cast<std::uintptr_t>(ws.data) % 256 == 0,
               "conv2d_grad_weight: the workspace is not 256-byte aligned");
  const IgemmMode mode = igemm_mode(g, pass);
  const bool by_classes = mode == IgemmMode::grad_input_classes;
  const ConvClasses classes = by_classes ? conv_input_gradient_classes(g, true) : ConvClasses{};
  conv_igemm_launch(mode, dtype, tile, igemm_shape(g, pass, d, splits.chunk), splits.count, a, img,
                    splits.count > 1 ? ws.data : out, stream, by_classes ? &classes : nullptr,
                    bias);
  if (splits.count > 1) splitk_sum(dtype, ws.data, out, d.m * d.n, splits.count, stream);
}

std::vector<gpu::KernelSource> igemm_sources(const ConvGeometry& g, DType dtype, ConvPass pass) {
  const GemmDims d = igemm_dims(g, pass);
  const IgemmTile tile = tile_for(g, dtype, pass, true);
  const IgemmMode mode = igemm_mode(g, pass);
  std::vector<gpu::KernelSource> sources = {conv_igemm_source(mode, tile, dtype)};
  if (splits_for(d, default_tile(g, dtype, pass), pass).count == 1) return sources;
  if (is_low_precision(dtype))  // the splits write f32 partials
    sources.push_back(conv_igemm_source(mode, tile, dtype, true));
  sources.push_back(conv_splitk_sum_source(dtype));
  return sources;
}

}  // namespace conv_detail
}  // namespace kiln::cuda
