// The tuner: each candidate timed with CUDA events on a stream of its own, the L2 overwritten
// before each run where the problem asks for it (autotune_flushes_l2), so that no run reads what
// the one before left in the cache.
#include "gpu/autotune.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <mutex>

#include "core/env_switch.h"
#include "core/error.h"
#include "core/log.h"
#include "gpu/cuda_check.h"
#include "gpu/kernel_cache.h"

namespace kiln::gpu {
namespace {

constexpr int kRuns = 7;
constexpr std::size_t kFlushBytes = std::size_t{128} << 20;  // over the H200's 50 MiB L2

TuningTable& table() {
  static TuningTable t(global_kernel_cache().disk_enabled() ? global_kernel_cache().disk_dir()
                                                            : std::filesystem::path());
  return t;
}

struct Device {
  int sm = 0, driver = 0;
};
Device device() {
  Device d;
  d.sm = current_target().sm;
  KILN_CUDA_CHECK(cudaDriverGetVersion(&d.driver));
  return d;
}

// The stream, events and flush buffer of one tuning, released at its end.
class Timer {
 public:
  explicit Timer(bool flush_l2) {
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KILN_CUDA_CHECK(cudaEventCreate(&start_));
    KILN_CUDA_CHECK(cudaEventCreate(&stop_));
    if (!flush_l2) return;
    if (cudaMalloc(&flush_, kFlushBytes) != cudaSuccess) {  // tune with a warm cache instead
      cudaGetLastError();
      flush_ = nullptr;
    }
  }
  ~Timer() {
    cudaStreamSynchronize(stream_);
    if (flush_) cudaFree(flush_);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // Median microseconds of kRuns runs of `run` after one warm-up (which may throw).
  double median_us(const std::function<void(Stream)>& run) {
    run(stream_);
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<float> ms(kRuns);
    for (int r = 0; r < kRuns; ++r) {
      if (flush_) KILN_CUDA_CHECK(cudaMemsetAsync(flush_, r, kFlushBytes, stream_));
      KILN_CUDA_CHECK(cudaEventRecord(start_, stream_));
      run(stream_);
      KILN_CUDA_CHECK(cudaEventRecord(stop_, stream_));
      KILN_CUDA_CHECK(cudaEventSynchronize(stop_));
      KILN_CUDA_CHECK(cudaEventElapsedTime(&ms[static_cast<std::size_t>(r)], start_, stop_));
    }
    std::nth_element(ms.begin(), ms.begin() + kRuns / 2, ms.end());
    return 1000.0 * ms[kRuns / 2];
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  void* flush_ = nullptr;
};

}  // namespace

bool autotune_flushes_l2(std::size_t bytes) {
  static const int policy = [] {  // 0 auto, 1 flush, 2 warm
    const char* v = std::getenv("KILN_AUTOTUNE_L2");
    const std::string text = v == nullptr ? "" : v;
    if (text.empty() || text == "auto") return 0;
    KILN_CHECK(text == "flush" || text == "warm",
               "KILN_AUTOTUNE_L2='{}': expected flush, warm or auto", text);
    return text == "flush" ? 1 : 2;
  }();
  if (policy != 0) return policy == 1;
  static const std::size_t l2 = [] {
    int device = 0, bytes = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&device));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device));
    return static_cast<std::size_t>(bytes);
  }();
  return bytes > l2 / 2;
}

bool autotune_enabled() {
  static const bool enabled = env_switch_on("KILN_AUTOTUNE");
  return enabled;
}

std::optional<TuningRecord> find_tuning(const std::string& problem,
                                        const std::vector<std::string>& candidates) {
  const Device d = device();
  return table().find(problem, candidates, d.sm, d.driver);
}

TuningRecord autotune(const std::string& problem, const std::vector<std::string>& candidates,
                      const std::function<void(std::size_t, Stream)>& launch, bool flush_l2) {
  KILN_ASSERT(!candidates.empty(), "autotune: no candidates for {}", problem);
  static std::mutex one_at_a_time;
  std::lock_guard lock(one_at_a_time);
  const Device d = device();
  if (auto known = table().find(problem, candidates, d.sm, d.driver)) return *known;
  TuningRecord record{problem, candidates, std::vector<double>(candidates.size(), -1.0), -1, false};
  std::exception_ptr first_error;
  Timer timer(flush_l2);
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    try {
      record.us[i] = timer.median_us([&](Stream s) { launch(i, s); });
    } catch (const Error&) {
      if (!first_error) first_error = std::current_exception();
      cudaGetLastError();
      continue;
    }
    if (record.chosen < 0 || record.us[i] < record.us[static_cast<std::size_t>(record.chosen)])
      record.chosen = static_cast<int>(i);
  }
  if (record.chosen < 0) std::rethrow_exception(first_error);
  log().debug("autotune: {}: {} ({:.1f} us)", problem, record.choice(),
              record.us[static_cast<std::size_t>(record.chosen)]);
  table().store(record, d.sm, d.driver);
  return record;
}

std::vector<TuningRecord> tuning_decisions() { return table().used(); }

}  // namespace kiln::gpu
