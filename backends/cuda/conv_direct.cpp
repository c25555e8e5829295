// The direct forward convolution of images with few channels (kernels/conv_direct.cuh): its
// form (the tensor cores' for bf16 and f16 where K = C KH KW <= 64, else the CUDA cores'), its
// tile, its source (the geometry's channels, filter and stride are the kernel's constants) and
// its launch.
#include <fmt/format.h>

#include <cstdint>

#include "backends/cuda/conv_passes.h"
#include "backends/cuda/kernel_registry.h"
#include "core/error.h"
#include "kiln_kernel_files.h"

namespace kiln::cuda::conv_detail {

namespace {

constexpr int kThreads = 256;
constexpr int kFilters = 16, kColumns = 4;  // the CUDA cores' F and P
constexpr std::size_t kSharedLimit = 48 * 1024;
constexpr int kMmaFilters = 64, kMmaPixels = 512, kStagePitch = 40;  // the tensor cores' form
constexpr std::size_t kMmaSharedLimit = 160 * 1024;

int run_of(const ConvGeometry& g) {  // KILN_DIRECT_RUN
  return ((kColumns - 1) * static_cast<int>(g.stride) + static_cast<int>(g.kernel_w) + 3) / 4 * 4;
}

bool mma_form(const ConvGeometry& g, DType dtype) {
  return is_low_precision(dtype) && patch_rows(g) <= 64;
}

std::string direct_name(const ConvGeometry& g, DType dtype) {
  return fmt::format("kiln_conv_direct{}_{}_c{}_{}x{}_s{}", mma_form(g, dtype) ? "_mma" : "",
                     dtype_name(dtype), g.in_channels, g.kernel_h, g.kernel_w, g.stride);
}

// The first plan of th rows (from `most`, halving) whose shared memory fits `limit`.
std::optional<DirectPlan> fit_rows(const ConvGeometry& g, std::int64_t most, std::int64_t cols,
                                   std::size_t fixed, std::size_t element, std::size_t limit) {
  for (std::int64_t th = std::min(g.out_h, std::max<std::int64_t>(1, most)); th >= 1;
       th = th == 1 ? 0 : (th + 1) / 2) {
    const std::int64_t rows = (th - 1) * g.stride + g.kernel_h;
    const std::size_t bytes =
        fixed + static_cast<std::size_t>(g.in_channels * rows * cols) * element;
    const std::int64_t tiles = (g.out_h + th - 1) / th;
    if (bytes <= limit && g.batch * tiles < (std::int64_t{1} << 31))
      return DirectPlan{static_cast<int>(th), static_cast<int>(tiles), static_cast<int>(rows),
                        static_cast<int>(cols), bytes};
  }
  return std::nullopt;
}

}  // namespace

// The CUDA cores' form: rows a tile as many as make one item (4 columns of a row) a thread,
// fewer where the tile's input would not fit in 48 KiB; rows of more than 256 items (1024
// columns) not at all. The tensor cores': about 512 pixels a tile (two chunks of 32 a warp).
std::optional<DirectPlan> conv_direct_plan(const ConvGeometry& g, DType dtype) {
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16) return std::nullopt;
  if (g.in_channels < 1 || g.in_channels > 4 || g.kernel_h > 7 || g.kernel_w > 7 || g.stride > 4 ||
      g.batch * g.in_channels * g.height * g.width >= (std::int64_t{1} << 31) ||
      g.batch * g.out_channels * g.out_h * g.out_w >= (std::int64_t{1} << 31) ||
      (g.out_channels + kFilters - 1) / kFilters > 65535)
    return std::nullopt;
  const std::int64_t extent = std::max((g.out_w - 1) * g.stride + g.kernel_w, g.padding + g.width);
  if (mma_form(g, dtype)) {
    const std::size_t fixed =
        static_cast<std::size_t>(kMmaFilters * ((patch_rows(g) + 15) / 16 * 16 + 8) +
                                 8 * kMmaFilters * kStagePitch) *
        2;
    return fit_rows(g, kMmaPixels / g.out_w, (extent + 7) / 8 * 8, fixed, 2, kMmaSharedLimit);
  }
  const std::int64_t groups = (g.out_w + kColumns - 1) / kColumns;  // a thread's items of a row
  if (groups > kThreads) return std::nullopt;
  const std::int64_t cols =
      std::max<std::int64_t>((groups - 1) * kColumns * g.stride + run_of(g), (extent + 3) / 4 * 4);
  return fit_rows(g, kThreads / groups, cols,
                  static_cast<std::size_t>(patch_rows(g)) * kFilters * 4, 4, kSharedLimit);
}

gpu::KernelSource conv_direct_source(const ConvGeometry& g, DType dtype) {
  return embedded_kernel(direct_name(g, dtype), kernel_files::conv_direct_cuh,
                         mma_form(g, dtype) ? "KILN_CONV_DIRECT_MMA" : "KILN_CONV_DIRECT",
                         {{"KILN_T", cuda_type_name(dtype)},
                          {"KILN_DIRECT_C", std::to_string(g.in_channels)},
                          {"KILN_DIRECT_KH", std::to_string(g.kernel_h)},
                          {"KILN_DIRECT_KW", std::to_string(g.kernel_w)},
                          {"KILN_DIRECT_S", std::to_string(g.stride)}});
}

std::vector<gpu::KernelSource> conv_direct_sample_sources() {
  std::vector<gpu::KernelSource> all;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (auto [c, k, s] :
         {std::tuple{3, 3, 1}, std::tuple{1, 3, 1}, std::tuple{1, 5, 1}, std::tuple{3, 7, 2}}) {
      ConvGeometry g{};
      g.in_channels = c;
      g.kernel_h = g.kernel_w = k;
      g.stride = s;
      all.push_back(conv_direct_source(g, dtype));
    }
  return all;
}

bool direct_applies_bias(const ConvGeometry& g, DType dtype) { return !mma_form(g, dtype); }

void conv_direct_forward(DType dtype, const ConvGeometry& g, const DirectPlan& plan, const void* x,
                         const void* w, void* y, gpu::Stream stream, ConvBias bias) {
  const bool mma = mma_form(g, dtype);
  KILN_CHECK((bias.bias == nullptr && !bias.relu) || !mma,
             "conv2d: the direct stem kernel's tensor-core form ({}) takes no bias or ReLU",
             dtype_name(dtype));
  const DeviceKernel& k = device_kernel(
      direct_name(g, dtype), [&] { return conv_direct_source(g, dtype); }, plan.shared_bytes);
  int h = static_cast<int>(g.height), wd = static_cast<int>(g.width),
      pad = static_cast<int>(g.padding), oh = static_cast<int>(g.out_h),
      ow = static_cast<int>(g.out_w), co = static_cast<int>(g.out_channels), th = plan.th,
      tiles = plan.tiles, rows = plan.rows, cols = plan.cols;
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  // 1: y's whole stores (the CUDA cores: 4 columns of a row; the tensor cores: 8 pixels of a
  // plane, its tiles starting 16-byte aligned); 2: x's rows in 16-byte pieces.
  const bool stores =
      mma ? (g.out_h * g.out_w) % 8 == 0 && (plan.th * g.out_w) % 8 == 0 : g.out_w % kColumns == 0;
  // 4: ReLU as y is stored (the CUDA cores' form, which also takes the bias).
  int flags =
      (stores && aligned(y) ? 1 : 0) |
      (g.width % static_cast<std::int64_t>(16 / dtype_size(dtype)) == 0 && aligned(x) ? 2 : 0) |
      (bias.relu ? 4 : 0);
  const void* b = bias.bias;
  void* with_bias[] = {&x,  &w,  &b,  &y,     &h,    &wd,   &pad,  &oh,
                       &ow, &co, &th, &tiles, &rows, &cols, &flags};
  void* plain[] = {&x, &w, &y, &h, &wd, &pad, &oh, &ow, &co, &th, &tiles, &rows, &cols, &flags};
  const int filters = mma ? kMmaFilters : kFilters;
  const gpu::Dim3 grid{static_cast<unsigned>(g.batch * plan.tiles),
                       static_cast<unsigned>((g.out_channels + filters - 1) / filters), 1};
  k.kernel.launch(grid, {kThreads, 1, 1}, plan.shared_bytes, stream, mma ? plain : with_bias);
}

}  // namespace kiln::cuda::conv_detail
