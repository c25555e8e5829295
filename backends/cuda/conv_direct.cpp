// The direct forward convolution of images with few channels (kernels/conv_direct.cuh): its
// tile, its source (the geometry's channels, filter and stride are the kernel's constants)
// and its launch.
#include <fmt/format.h>

#include <cstdint>

#include "backends/cuda/conv_passes.h"
#include "backends/cuda/kernel_registry.h"
#include "core/error.h"
#include "kiln_kernel_files.h"

namespace kiln::cuda::conv_detail {

namespace {

constexpr int kFilters = 16, kColumns = 4, kThreads = 256;  // the kernel's F, P and block
constexpr std::size_t kSharedLimit = 48 * 1024;

int run_of(const ConvGeometry& g) {  // KILN_DIRECT_RUN
  return ((kColumns - 1) * static_cast<int>(g.stride) + static_cast<int>(g.kernel_w) + 3) / 4 * 4;
}

std::string direct_name(const ConvGeometry& g, DType dtype) {
  return fmt::format("kiln_conv_direct_{}_c{}_{}x{}_s{}", dtype_name(dtype), g.in_channels,
                     g.kernel_h, g.kernel_w, g.stride);
}

}  // namespace

// Rows a tile: as many as make one item (4 columns of a row) a thread, fewer where the tile's
// input would not fit in shared memory; rows of more than 256 items (1024 columns) not at all.
std::optional<DirectPlan> conv_direct_plan(const ConvGeometry& g, DType dtype) {
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16) return std::nullopt;
  if (g.in_channels < 1 || g.in_channels > 4 || g.kernel_h > 7 || g.kernel_w > 7 || g.stride > 4 ||
      g.batch * g.in_channels * g.height * g.width >= (std::int64_t{1} << 31) ||
      g.batch * g.out_channels * g.out_h * g.out_w >= (std::int64_t{1} << 31) ||
      (g.out_channels + kFilters - 1) / kFilters > 65535)
    return std::nullopt;
  const std::int64_t groups = (g.out_w + kColumns - 1) / kColumns;  // a thread's items of a row
  if (groups > kThreads) return std::nullopt;
  const std::int64_t cols = std::max<std::int64_t>((groups - 1) * kColumns * g.stride + run_of(g),
                                                   (g.padding + g.width + 3) / 4 * 4);
  const std::size_t filters = static_cast<std::size_t>(patch_rows(g)) * kFilters * 4;
  for (std::int64_t th =
           std::min<std::int64_t>(g.out_h, std::max<std::int64_t>(1, kThreads / groups));
       th >= 1; th = th == 1 ? 0 : (th + 1) / 2) {
    const std::int64_t rows = (th - 1) * g.stride + g.kernel_h;
    const std::size_t bytes = filters + static_cast<std::size_t>(g.in_channels * rows * cols) * 4;
    const std::int64_t tiles = (g.out_h + th - 1) / th;
    if (bytes <= kSharedLimit && g.batch * tiles < (std::int64_t{1} << 31))
      return DirectPlan{static_cast<int>(th), static_cast<int>(tiles), static_cast<int>(rows),
                        static_cast<int>(cols), bytes};
  }
  return std::nullopt;
}

gpu::KernelSource conv_direct_source(const ConvGeometry& g, DType dtype) {
  return embedded_kernel(direct_name(g, dtype), kernel_files::conv_direct_cuh, "KILN_CONV_DIRECT",
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

bool conv_direct_writes_moments(const ConvGeometry& g, DType dtype, const DirectPlan& plan) {
  return is_low_precision(dtype) && g.out_w % kColumns == 0 && (g.out_h * g.out_w) % 64 == 0 &&
         (plan.th * g.out_w) % 64 == 0;
}

void conv_direct_forward(DType dtype, const ConvGeometry& g, const DirectPlan& plan, const void* x,
                         const void* w, void* y, gpu::Stream stream, float* moments) {
  KILN_CHECK(moments == nullptr || conv_direct_writes_moments(g, dtype, plan),
             "conv2d (direct): run moments asked of a {}x{} output in tiles of {} rows", g.out_h,
             g.out_w, plan.th);
  const DeviceKernel& k = device_kernel(
      direct_name(g, dtype), [&] { return conv_direct_source(g, dtype); }, plan.shared_bytes);
  int h = static_cast<int>(g.height), wd = static_cast<int>(g.width),
      pad = static_cast<int>(g.padding), oh = static_cast<int>(g.out_h),
      ow = static_cast<int>(g.out_w), co = static_cast<int>(g.out_channels), th = plan.th,
      tiles = plan.tiles, rows = plan.rows, cols = plan.cols;
  const std::size_t piece = 16 / dtype_size(dtype);
  int flags = (g.out_w % kColumns == 0 && reinterpret_cast<std::uintptr_t>(y) % 16 == 0 ? 1 : 0) |
              (g.width % static_cast<std::int64_t>(piece) == 0 &&
                       reinterpret_cast<std::uintptr_t>(x) % 16 == 0
                   ? 2
                   : 0);
  long long runs = g.batch * g.out_h * g.out_w / 64;
  void* args[] = {&x,  &w,  &y,  &moments, &h,    &wd,   &pad,   &oh,
                  &ow, &co, &th, &tiles,   &rows, &cols, &flags, &runs};
  const gpu::Dim3 grid{static_cast<unsigned>(g.batch * plan.tiles),
                       static_cast<unsigned>((g.out_channels + kFilters - 1) / kFilters), 1};
  k.kernel.launch(grid, {kThreads, 1, 1}, plan.shared_bytes, stream, args);
}

}  // namespace kiln::cuda::conv_detail
