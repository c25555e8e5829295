// The channels-last passes' tiles, timed per shape (conv_tuning.h).
#include "backends/cuda/conv_tuning.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <random>

#include "backends/cuda/conv_mma.h"
#include "backends/cuda/kernel_registry.h"
#include "core/error.h"
#include "core/half.h"
#include "gpu/autotune.h"
#include "gpu/cuda_check.h"

namespace kiln::cuda {
namespace {

std::vector<std::string> candidate_labels() {
  std::vector<std::string> labels;
  for (NhwcTile t : kNhwcCandidates) labels.push_back(nhwc_tile_label(t));
  return labels;
}

std::string wgrad_tile_label(WgradTile t) {
  return fmt::format("{}x{}w{}x{}k{}", t.bm, t.bn, t.wm, t.wn, t.bk);
}
std::vector<std::string> wgrad_labels() {
  std::vector<std::string> labels;
  for (WgradTile t : kWgradCandidates) labels.push_back(wgrad_tile_label(t));
  return labels;
}

// `elements` values of `dtype` uniform in [-1, 1), in device memory freed with the object.
class RandomOperand {
 public:
  RandomOperand(DType dtype, std::int64_t elements) {
    const std::size_t bytes = static_cast<std::size_t>(elements) * dtype_size(dtype);
    KILN_CUDA_CHECK(cudaMalloc(&data_, std::max<std::size_t>(bytes, 16)));
    std::vector<std::uint32_t> words((bytes + 3) / 4);
    std::mt19937 rng(12345);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    auto half = [&] {
      const float v = uniform(rng);
      return dtype == DType::bf16 ? float_to_bf16_bits(v) : float_to_f16_bits(v);
    };
    for (std::uint32_t& w : words)
      w = dtype == DType::f32 ? std::bit_cast<std::uint32_t>(uniform(rng))
                              : half() | static_cast<std::uint32_t>(half()) << 16;
    KILN_CUDA_CHECK(cudaMemcpy(data_, words.data(), bytes, cudaMemcpyHostToDevice));
  }
  ~RandomOperand() { cudaFree(data_); }
  RandomOperand(const RandomOperand&) = delete;
  RandomOperand& operator=(const RandomOperand&) = delete;
  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
};

// Times every candidate on random operands of the pass's shape.
gpu::TuningRecord time_candidates(DType dtype, const ConvGemmShape& shape, bool dilated,
                                  const std::string& problem) {
  preload_kernels(nhwc_candidate_sources(dtype, dilated));  // in parallel, not one by one
  const std::int64_t channels = shape.k / shape.khkw, images = shape.n / shape.s_hw;
  RandomOperand a(dtype, std::int64_t{shape.m} * shape.k);
  RandomOperand xt(dtype, images * shape.img_h * shape.img_w * channels);
  RandomOperand y(dtype, std::int64_t{shape.m} * shape.n);
  return gpu::autotune(problem, candidate_labels(), [&](std::size_t i, gpu::Stream stream) {
    conv_nhwc_launch(dtype, shape, kNhwcCandidates[i], a.data(), xt.data(), y.data(), stream,
                     dilated);
  });
}

// Times every weight-gradient candidate on random operands of the pass's shape.
gpu::TuningRecord time_wgrad_candidates(DType dtype, const ConvGemmShape& shape,
                                        const MmaSplits& splits, const std::string& problem) {
  const bool split = splits.count > 1, vec_a = conv_mma_vector_dy(shape.s_hw),
             vec_b = conv_mma_vector_x(shape);
  std::vector<gpu::KernelSource> sources;
  for (WgradTile t : kWgradCandidates)
    sources.push_back(conv_mma_wgrad_source(dtype, t, vec_a, split, vec_b));
  preload_kernels(sources);
  const std::int64_t images = shape.k / shape.s_hw, mn = std::int64_t{shape.m} * shape.n;
  RandomOperand dy(dtype, images * shape.m * shape.s_hw);
  RandomOperand x(dtype, images * shape.img_chw);
  RandomOperand out(split ? DType::f32 : dtype, split ? splits.count * mn : mn);
  return gpu::autotune(problem, wgrad_labels(), [&](std::size_t i, gpu::Stream stream) {
    conv_mma_wgrad_launch(dtype, shape, splits, kWgradCandidates[i], dy.data(), x.data(),
                          out.data(), stream);
  });
}

}  // namespace

std::optional<WgradTile> tuned_wgrad_tile(DType dtype, const ConvGemmShape& s,
                                          const MmaSplits& splits, bool may_time) {
  if (!gpu::autotune_enabled() || s.m == 0 || s.n == 0 || !conv_mma_vector_dy(s.s_hw) ||
      gpu::cuda_device_count() == 0)
    return std::nullopt;  // (dy by scalar loads, rare: the default tile)
  const std::string problem = fmt::format(
      "conv_wgrad {} m{} n{} k{} khkw{} kw{} image{}x{} windows{}x{} stride{} pad{}x{} "
      "splits{}x{}{}",
      dtype_name(dtype), s.m, s.n, s.k, s.khkw, s.kw, s.img_h, s.img_w, s.s_hw, s.s_w, s.stride,
      s.pad_h, s.pad_w, splits.count, splits.chunk, conv_mma_vector_x(s) ? " runs" : "");
  std::optional<gpu::TuningRecord> record = gpu::find_tuning(problem, wgrad_labels());
  if (!record && may_time) record = time_wgrad_candidates(dtype, s, splits, problem);
  if (!record) return std::nullopt;
  return kWgradCandidates[record->chosen];
}

std::string nhwc_tile_label(NhwcTile t) {
  return fmt::format("{}x{}w{}x{}p{}s{}", t.bm, t.bn, t.wm, t.wn, t.pieces, t.stages);
}

std::string nhwc_problem(DType dtype, const ConvGemmShape& s, bool dilated) {
  return fmt::format(
      "conv_nhwc {} {} m{} n{} k{} khkw{} kw{} image{}x{} windows{}x{} stride{} pad{}x{}",
      dilated ? "dgrad_s2" : "fwd", dtype == DType::f32 ? "tf32" : dtype_name(dtype), s.m, s.n, s.k,
      s.khkw, s.kw, s.img_h, s.img_w, s.s_hw, s.s_w, s.stride, s.pad_h, s.pad_w);
}

std::optional<NhwcTile> tuned_nhwc_tile(DType dtype, const ConvGemmShape& shape, bool dilated,
                                        bool may_time) {
  if (!gpu::autotune_enabled() || shape.m == 0 || shape.n == 0 || gpu::cuda_device_count() == 0)
    return std::nullopt;  // (no GPU: a lowering for display, as dump's)
  const std::string problem = nhwc_problem(dtype, shape, dilated);
  std::optional<gpu::TuningRecord> record = gpu::find_tuning(problem, candidate_labels());
  if (!record && may_time) record = time_candidates(dtype, shape, dilated, problem);
  if (!record) return std::nullopt;
  return kNhwcCandidates[record->chosen];
}

std::vector<gpu::KernelSource> nhwc_candidate_sources(DType dtype, bool dilated) {
  std::vector<gpu::KernelSource> sources;
  for (NhwcTile t : kNhwcCandidates) sources.push_back(conv_nhwc_source(dtype, t, dilated));
  return sources;
}

}  // namespace kiln::cuda
