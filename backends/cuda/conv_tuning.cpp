// The convolution passes' tiles, timed per shape (conv_tuning.h).
#include "backends/cuda/conv_tuning.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <mutex>

#include "backends/cuda/conv_igemm.h"
#include "backends/cuda/conv_mma.h"
#include "backends/cuda/kernel_registry.h"
#include "core/error.h"
#include "core/log.h"
#include "gpu/autotune.h"
#include "gpu/cuda_check.h"
#include "gpu/sha256.h"

namespace kiln::cuda {
namespace {

std::vector<std::string> candidate_labels(DType dtype) {
  std::vector<std::string> labels;
  for (NhwcTile t : nhwc_candidates(dtype)) labels.push_back(nhwc_tile_label(t));
  return labels;
}

std::string wgrad_tile_label(WgradTile t) {
  if (t.wgmma) return fmt::format("{}x{}g{}k{}", t.bm, t.bn, t.wm, t.bk);
  return fmt::format("{}x{}w{}x{}k{}", t.bm, t.bn, t.wm, t.wn, t.bk);
}
std::vector<std::string> wgrad_labels(DType dtype) {
  std::vector<std::string> labels;
  for (WgradTile t : wgrad_candidates(dtype)) labels.push_back(wgrad_tile_label(t));
  return labels;
}

// "code" and a short digest of the candidates' kernel sources, the end of every problem: a
// decision timed for other kernel code (an older build's, in the disk cache) is not reused.
// `set` names what the sources depend on (kind, dtype, flags), so that each set is made and
// digested once a process, not once a pass (hundreds of KiB of source each: a warm start's cost).
template <typename Sources>
std::string code_of(const std::string& set, const Sources& sources) {
  static std::mutex mutex;
  static std::map<std::string, std::string> digests;
  std::lock_guard lock(mutex);
  auto [it, added] = digests.try_emplace(set);
  if (added) {
    gpu::Sha256 hash;
    for (const gpu::KernelSource& source : sources()) {
      hash.update_field(source.name).update_field(source.code);
      for (const std::string& option : source.options) hash.update_field(option);
    }
    it->second = "code " + gpu::to_hex(hash.finish()).substr(0, 12);
  }
  return it->second;
}

// `elements` random values of `dtype` with magnitudes in [1, 2) and random signs (a xorshift's
// bits put into the mantissa: cheap, so that tuning a large pass is not spent drawing numbers),
// in device memory freed with the object.
class RandomOperand {
 public:
  RandomOperand(DType dtype, std::int64_t elements) {
    const std::size_t bytes = static_cast<std::size_t>(elements) * dtype_size(dtype);
    KILN_CUDA_CHECK(cudaMalloc(&data_, std::max<std::size_t>(bytes, 16)));
    std::vector<std::uint32_t> words((bytes + 3) / 4);
    std::uint64_t state = 0x9e3779b97f4a7c15ull;
    for (std::uint32_t& w : words) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      const auto r = static_cast<std::uint32_t>(state >> 16);
      if (dtype == DType::f32)  // sign, exponent 0 (1.x), 22 random mantissa bits
        w = ((r & 1u) << 31) | 0x3f800000u | (r >> 10);
      else if (dtype == DType::bf16)  // two of sign, exponent 0, 7 mantissa bits
        w = (r & 0x807f807fu) | 0x3f803f80u;
      else  // f16
        w = (r & 0x83ff83ffu) | 0x3c003c00u;
    }
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
                                  const std::string& problem, bool flush_l2) {
  preload_kernels(nhwc_candidate_sources(dtype, dilated));  // in parallel, not one by one
  const std::int64_t channels = shape.k / shape.khkw, images = shape.n / shape.s_hw;
  RandomOperand a(dtype, std::int64_t{shape.m} * shape.k);
  RandomOperand xt(dtype, images * shape.img_h * shape.img_w * channels);
  RandomOperand y(dtype, std::int64_t{shape.m} * shape.n);
  return gpu::autotune(
      problem, candidate_labels(dtype),
      [&](std::size_t i, gpu::Stream stream) {
        conv_nhwc_launch(dtype, shape, nhwc_candidates(dtype)[i], a.data(), xt.data(), y.data(),
                         stream, dilated);
      },
      flush_l2);
}

// The weight-gradient candidates' sources for a pass.
std::vector<gpu::KernelSource> wgrad_candidate_sources(DType dtype, const ConvGemmShape& s,
                                                       const MmaSplits& splits) {
  std::vector<gpu::KernelSource> sources;
  for (WgradTile t : wgrad_candidates(dtype))
    sources.push_back(conv_mma_wgrad_source(dtype, t, conv_mma_vector_dy(s.s_hw), splits.count > 1,
                                            conv_mma_vector_x(s)));
  return sources;
}

// Times every weight-gradient candidate on random operands of the pass's shape.
gpu::TuningRecord time_wgrad_candidates(DType dtype, const ConvGemmShape& shape,
                                        const MmaSplits& splits, const std::string& problem,
                                        bool flush_l2) {
  const bool split = splits.count > 1;
  preload_kernels(wgrad_candidate_sources(dtype, shape, splits));
  const std::int64_t images = shape.k / shape.s_hw, mn = std::int64_t{shape.m} * shape.n;
  RandomOperand dy(dtype, images * shape.m * shape.s_hw);
  RandomOperand x(dtype, images * shape.img_chw);
  RandomOperand out(split ? DType::f32 : dtype, split ? splits.count * mn : mn);
  return gpu::autotune(
      problem, wgrad_labels(dtype),
      [&](std::size_t i, gpu::Stream stream) {
        conv_mma_wgrad_launch(dtype, shape, splits, wgrad_candidates(dtype)[i], dy.data(), x.data(),
                              out.data(), stream);
      },
      flush_l2);
}

// Bytes of a pass's operands: A (m x k), the image (`images` of img_chw) and the output
// (`splits` f32 partials, or m x n of dtype).
std::size_t operand_bytes(DType dtype, const ConvGemmShape& s, std::int64_t images,
                          std::int64_t splits) {
  const auto mn = static_cast<std::size_t>(std::int64_t{s.m} * s.n);
  const std::size_t out =
      splits > 1 ? static_cast<std::size_t>(splits) * mn * 4 : mn * dtype_size(dtype);
  return (static_cast<std::size_t>(std::int64_t{s.m} * s.k) +
          static_cast<std::size_t>(images * s.img_chw)) *
             dtype_size(dtype) +
         out;
}

// The decisions found so far, by the pass's numbers: a launch outside a captured graph (trace,
// --no-cuda-graphs) asks for its tile each time, and formatting and hashing the problem would
// cost it microseconds.
using PassKey = std::array<long long, 22>;
PassKey pass_key(int kind, DType dtype, const ConvGemmShape& s, const MmaSplits& splits) {
  return {kind,         static_cast<long long>(dtype),
          s.m,          s.n,
          s.k,          s.k_chunk,
          s.s_hw,       s.s_w,
          s.stride,     s.pad_h,
          s.pad_w,      s.img_chw,
          s.img_hw,     s.img_h,
          s.img_w,      s.khkw,
          s.kw,         s.a_ms,
          s.c_ms,       splits.count,
          splits.chunk, conv_mma_vector_x(s)};
}
class ChoiceMemo {
 public:
  std::optional<int> find(const PassKey& key) const {
    std::lock_guard lock(mutex_);
    auto it = chosen_.find(key);
    return it == chosen_.end() ? std::nullopt : std::optional<int>(it->second);
  }
  void keep(const PassKey& key, int chosen) {
    std::lock_guard lock(mutex_);
    chosen_.emplace(key, chosen);
  }

 private:
  mutable std::mutex mutex_;
  std::map<PassKey, int> chosen_;
};
ChoiceMemo& memo() {
  static ChoiceMemo m;
  return m;
}

// The candidate index for `problem` (not in the memo): the table's, or (may_time) timed now by
// `time`; kept in the memo.
template <typename Time>
std::optional<int> choose(const PassKey& key, const std::string& problem,
                          const std::vector<std::string>& labels, bool may_time, const Time& time) {
  std::optional<gpu::TuningRecord> record = gpu::find_tuning(problem, labels);
  if (!record && may_time) {
    try {
      record = time();
    } catch (const Error& e) {  // (no memory for the operands, say): the default, untimed
      log().warn("autotune: {}: {}; the pass takes its default tile", problem, e.what());
      cudaGetLastError();  // an allocation's failure is no error of the launches after it
      return std::nullopt;
    }
  }
  if (!record) return std::nullopt;
  memo().keep(key, record->chosen);
  return record->chosen;
}

std::string igemm_label(IgemmTile t) {
  return fmt::format("{}x{}g{}k{}t{}x{}", t.bm, t.bn, t.kg, t.ks, t.tm, t.tn);
}

std::vector<gpu::KernelSource> igemm_candidate_sources(IgemmMode mode, DType dtype,
                                                       const std::vector<IgemmTile>& tiles,
                                                       std::int64_t splits) {
  std::vector<gpu::KernelSource> sources;
  for (IgemmTile t : tiles)
    sources.push_back(conv_igemm_source(mode, t, dtype, splits > 1 && is_low_precision(dtype)));
  return sources;
}

gpu::TuningRecord time_igemm_candidates(IgemmMode mode, DType dtype, const ConvGemmShape& shape,
                                        const std::vector<IgemmTile>& tiles, std::int64_t splits,
                                        const std::string& problem,
                                        const std::vector<std::string>& labels, bool flush_l2) {
  preload_kernels(igemm_candidate_sources(mode, dtype, tiles, splits));
  const std::int64_t pixels = mode == IgemmMode::grad_weight ? shape.k : shape.n;
  const std::int64_t mn = std::int64_t{shape.m} * shape.n;
  RandomOperand a(dtype, std::int64_t{shape.m} * shape.k);
  RandomOperand img(dtype, pixels / shape.s_hw * shape.img_chw);
  RandomOperand out(splits > 1 ? DType::f32 : dtype, splits > 1 ? splits * mn : mn);
  return gpu::autotune(
      problem, labels,
      [&](std::size_t i, gpu::Stream stream) {
        conv_igemm_launch(mode, dtype, tiles[i], shape, splits, a.data(), img.data(), out.data(),
                          stream);
      },
      flush_l2);
}

}  // namespace

std::vector<IgemmTile> igemm_candidates(IgemmTile base, DType dtype) {
  std::vector<IgemmTile> tiles = {base};
  for (IgemmTile t : kIgemmCandidates)
    if (t.kg == base.kg && t.ks == base.ks && !(t == base) && igemm_tile_valid(t, dtype))
      tiles.push_back(t);
  return tiles;
}

std::optional<IgemmTile> tuned_igemm_tile(IgemmMode mode, DType dtype, const ConvGemmShape& s,
                                          IgemmTile base, std::int64_t splits, bool may_time) {
  if (!gpu::autotune_enabled() || s.m == 0 || s.n == 0 || dtype == DType::f64) return std::nullopt;
  const PassKey key = pass_key(3 + static_cast<int>(mode), dtype, s, MmaSplits{splits, s.k_chunk});
  const std::vector<IgemmTile> tiles = igemm_candidates(base, dtype);
  if (const std::optional<int> known = memo().find(key))
    return tiles.at(static_cast<std::size_t>(*known));
  if (gpu::cuda_device_count() == 0) return std::nullopt;
  std::vector<std::string> labels;
  for (IgemmTile t : tiles) labels.push_back(igemm_label(t));
  const std::string base_problem = fmt::format(
      "conv_igemm {} {} m{} n{} k{} khkw{} kw{} image{}x{} windows{}x{} stride{} pad{}x{} "
      "a_ms{} c_ms{} splits{}x{}",
      static_cast<int>(mode), dtype_name(dtype), s.m, s.n, s.k, s.khkw, s.kw, s.img_h, s.img_w,
      s.s_hw, s.s_w, s.stride, s.pad_h, s.pad_w, s.a_ms, s.c_ms, splits, s.k_chunk);
  const std::int64_t pixels = mode == IgemmMode::grad_weight ? s.k : s.n;
  const bool flush = gpu::autotune_flushes_l2(operand_bytes(dtype, s, pixels / s.s_hw, splits));
  const std::string set = fmt::format("igemm {} {} {} {}", static_cast<int>(mode),
                                      dtype_name(dtype), splits > 1, fmt::join(labels, ","));
  const std::string problem = base_problem + " " + gpu::l2_state(flush) + " " + code_of(set, [&] {
                                return igemm_candidate_sources(mode, dtype, tiles, splits);
                              });
  const std::optional<int> chosen = choose(key, problem, labels, may_time, [&] {
    return time_igemm_candidates(mode, dtype, s, tiles, splits, problem, labels, flush);
  });
  if (!chosen) return std::nullopt;
  return tiles.at(static_cast<std::size_t>(*chosen));
}

std::optional<WgradTile> tuned_wgrad_tile(DType dtype, const ConvGemmShape& s,
                                          const MmaSplits& splits, bool may_time) {
  if (!gpu::autotune_enabled() || s.m == 0 || s.n == 0 || !conv_mma_vector_dy(s.s_hw))
    return std::nullopt;  // (dy by scalar loads, rare: the default tile)
  const PassKey key = pass_key(conv_wgmma_enabled(dtype) ? 8 : 2, dtype, s, splits);
  if (const std::optional<int> known = memo().find(key)) return wgrad_candidates(dtype)[*known];
  if (gpu::cuda_device_count() == 0) return std::nullopt;
  const std::string base_problem = fmt::format(
      "conv_wgrad {} m{} n{} k{} khkw{} kw{} image{}x{} windows{}x{} stride{} pad{}x{} "
      "splits{}x{}{}",
      dtype_name(dtype), s.m, s.n, s.k, s.khkw, s.kw, s.img_h, s.img_w, s.s_hw, s.s_w, s.stride,
      s.pad_h, s.pad_w, splits.count, splits.chunk, conv_mma_vector_x(s) ? " runs" : "");
  const bool flush = gpu::autotune_flushes_l2(operand_bytes(dtype, s, s.k / s.s_hw, splits.count));
  const std::string set =
      fmt::format("wgrad {} {} {} {}", dtype_name(dtype), conv_mma_vector_dy(s.s_hw),
                  splits.count > 1, conv_mma_vector_x(s));
  const std::string problem = base_problem + " " + gpu::l2_state(flush) + " " + code_of(set, [&] {
                                return wgrad_candidate_sources(dtype, s, splits);
                              });
  const std::optional<int> chosen = choose(key, problem, wgrad_labels(dtype), may_time, [&] {
    return time_wgrad_candidates(dtype, s, splits, problem, flush);
  });
  if (!chosen) return std::nullopt;
  return wgrad_candidates(dtype)[*chosen];
}

std::string nhwc_tile_label(NhwcTile t) {
  if (t.wgmma) return fmt::format("{}x{}g{}p{}s{}", t.bm, t.bn, t.wm, t.pieces, t.stages);
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
  if (!gpu::autotune_enabled() || shape.m == 0 || shape.n == 0) return std::nullopt;
  const PassKey key =  // kinds 6 and 7: the wgmma candidates' indices
      pass_key((dilated ? 1 : 0) + (conv_wgmma_enabled(dtype) ? 6 : 0), dtype, shape, MmaSplits{});
  if (const std::optional<int> known = memo().find(key)) return nhwc_candidates(dtype)[*known];
  if (gpu::cuda_device_count() == 0) return std::nullopt;  // a lowering for display (dump's)
  const bool flush = gpu::autotune_flushes_l2(operand_bytes(dtype, shape, shape.n / shape.s_hw, 1));
  const std::string problem = nhwc_problem(dtype, shape, dilated) + " " + gpu::l2_state(flush) +
                              " " +
                              code_of(fmt::format("nhwc {} {}", dtype_name(dtype), dilated),
                                      [&] { return nhwc_candidate_sources(dtype, dilated); });
  const std::optional<int> chosen = choose(key, problem, candidate_labels(dtype), may_time, [&] {
    return time_candidates(dtype, shape, dilated, problem, flush);
  });
  if (!chosen) return std::nullopt;
  return nhwc_candidates(dtype)[*chosen];
}

std::vector<gpu::KernelSource> nhwc_candidate_sources(DType dtype, bool dilated) {
  std::vector<gpu::KernelSource> sources;
  for (NhwcTile t : nhwc_candidates(dtype)) sources.push_back(conv_nhwc_source(dtype, t, dilated));
  return sources;
}

std::span<const WgradTile> wgrad_candidates(DType dtype) {
  if (conv_wgmma_enabled(dtype)) return kWgmmaWgradCandidates;
  return kWgradCandidates;
}

std::span<const NhwcTile> nhwc_candidates(DType dtype) {
  if (conv_wgmma_enabled(dtype)) return kWgmmaCandidates;
  return kNhwcCandidates;
}

}  // namespace kiln::cuda
