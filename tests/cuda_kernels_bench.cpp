// Timings of backends/cuda kernels for the report (skipped by default; not a check):
//   ./cuda_kernels_tests -tc="benchmark*" --no-skip
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/cuda/conv.h"
#include "backends/cuda/cublas_handle.h"
#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/conv_mma.h"
#include "backends/cuda/conv_tuning.h"
#include "backends/cuda/layout.h"
#include "backends/cuda/matmul.h"
#include "backends/cuda/pool.h"
#include "core/philox.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_runtime.h"
#include "gpu/kernel_cache.h"
#include "graph/kernels/conv_cpu.h"
#include "graph/kernels/pool_cpu.h"
#include "graph/op_table.h"
#include "tests/cuda_kernels_support.h"

namespace kiln {
using namespace cuda_test;  // NOLINT: the shared test helpers

// Timings for the report, not a check: ./cuda_kernels_tests -tc="benchmark*" --no-skip
// "events": one call between two CUDA events on the default stream (launch gaps included);
// "graph": 20 calls captured in a CUDA graph on a stream and replayed, per call (what a
// training step that replays its graph sees). Median of 50 (events) or 15 (graph) runs.
namespace {

struct BenchTimer {
  cudaStream_t stream = nullptr;
  BenchTimer() { KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
  ~BenchTimer() { (void)cudaStreamDestroy(stream); }

  static double median(std::vector<float> ms) {
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }
  double events_us(const std::function<void(cudaStream_t)>& body) const {
    cudaEvent_t start, stop;
    KILN_CUDA_CHECK(cudaEventCreate(&start));
    KILN_CUDA_CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < 5; ++i) body(nullptr);
    std::vector<float> ms(50);
    for (float& t : ms) {
      KILN_CUDA_CHECK(cudaEventRecord(start, nullptr));
      body(nullptr);
      KILN_CUDA_CHECK(cudaEventRecord(stop, nullptr));
      KILN_CUDA_CHECK(cudaEventSynchronize(stop));
      KILN_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    }
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    return 1000.0 * median(ms);
  }
  // -1 when the body cannot be captured.
  double graph_us(const std::function<void(cudaStream_t)>& body) const {
    constexpr int reps = 20;
    body(stream);
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return -1;
    try {
      for (int i = 0; i < reps; ++i) body(stream);
    } catch (const std::exception&) {
      (void)cudaStreamEndCapture(stream, &graph);
      if (graph) (void)cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      return -1;
    }
    if (cudaStreamEndCapture(stream, &graph) != cudaSuccess ||
        cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
      if (graph) (void)cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      return -1;
    }
    cudaEvent_t start, stop;
    KILN_CUDA_CHECK(cudaEventCreate(&start));
    KILN_CUDA_CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < 2; ++i) KILN_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    std::vector<float> ms(15);
    for (float& t : ms) {
      KILN_CUDA_CHECK(cudaEventRecord(start, stream));
      KILN_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      KILN_CUDA_CHECK(cudaEventRecord(stop, stream));
      KILN_CUDA_CHECK(cudaEventSynchronize(stop));
      KILN_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    }
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    (void)cudaGraphExecDestroy(exec);
    (void)cudaGraphDestroy(graph);
    return 1000.0 * median(ms) / reps;
  }
};

// " us T TFLOP/s R" of one f32 grad_weight pass of `g` (`flops` its work), or " failed: why".
std::string timed_wgrad(const BenchTimer& timer, const kernels::ConvGeometry& g,
                        const DeviceBuffer& x, const DeviceBuffer& dy, DeviceBuffer& dw,
                        const cuda::ConvWorkspace& ws, double flops) {
  std::ostringstream out;
  try {
    const double us = timer.events_us([&](cudaStream_t st) {
      cuda::conv2d_grad_weight(DType::f32, g, x.get(), dy.get(), dw.get(), ws, st);
    });
    out << " us " << us << " TFLOP/s " << flops / us * 1e-6;
  } catch (const std::exception& e) {
    out << " failed: " << e.what();
  }
  return out.str();
}

}  // namespace

// KILN-BENCH-BEGIN (public API only: also built against older trees for before/after tables)
TEST_CASE("benchmark: LeNet's conv, pool and fc1 passes (median of 50, CUDA events)" *
          doctest::skip()) {
  SKIP_WITHOUT_GPU();
  BenchTimer timer;
  for (std::int64_t batch : {64, 256}) {
    for (auto [cin, cout, hw] : {std::tuple{1, 32, 28}, {32, 64, 14}}) {
      const auto g = kernels::conv_geometry({batch, cin, hw, hw}, {cout, cin, 3, 3}, 1, 1);
      std::size_t bytes = 0;
      for (auto pass :
           {cuda::ConvPass::forward, cuda::ConvPass::grad_input, cuda::ConvPass::grad_weight})
        bytes = std::max(bytes, cuda::conv_workspace_bytes(g, DType::f32, pass));
      DeviceBuffer x(random_tensor({batch, cin, hw, hw}, DType::f32, 1)),
          w(random_tensor({cout, cin, 3, 3}, DType::f32, 2));
      DeviceBuffer y(random_tensor({batch, cout, hw, hw}, DType::f32, 5)), work(bytes),
          dx(x.bytes()), dw(w.bytes());
      const cuda::ConvWorkspace ws{work.get(), bytes};
      const auto pg = kernels::pool_geometry({batch, cout, hw, hw}, 2, 2);
      DeviceBuffer pooled(random_tensor({batch, cout, hw / 2, hw / 2}, DType::f32, 6)),
          dpool(y.bytes());
      const std::vector<std::pair<std::string, std::function<void(cudaStream_t)>>> ops = {
          {"forward",
           [&](cudaStream_t st) {
             cuda::conv2d_forward(DType::f32, g, x.get(), w.get(), y.get(), ws, st);
           }},
          {"grad_input",
           [&](cudaStream_t st) {
             cuda::conv2d_grad_input(DType::f32, g, y.get(), w.get(), dx.get(), ws, st);
           }},
          {"grad_weight",
           [&](cudaStream_t st) {
             cuda::conv2d_grad_weight(DType::f32, g, x.get(), y.get(), dw.get(), ws, st);
           }},
          {"pool_forward",
           [&](cudaStream_t st) {
             cuda::max_pool2d_forward(DType::f32, pg, y.get(), pooled.get(), st);
           }},
          {"pool_grad",
           [&](cudaStream_t st) {
             cuda::max_pool2d_grad(DType::f32, pg, y.get(), pooled.get(), dpool.get(), st);
           }},
      };
      for (const auto& [name, body] : ops)
        MESSAGE("BENCH B=" << batch << " conv" << (cin == 1 ? 1 : 2) << " " << name << " events_us "
                           << timer.events_us(body) << " graph_us " << timer.graph_us(body)
                           << " workspace " << bytes);
    }
    DeviceBuffer a(random_tensor({batch, 3136}, DType::f32, 3)),
        b(random_tensor({128, 3136}, DType::f32, 4));
    DeviceBuffer c(static_cast<std::size_t>(batch) * 128 * 4);
    const auto fc1 = [&](cudaStream_t st) {
      cuda::matmul({.m = batch,
                    .n = 128,
                    .k = 3136,
                    .trans_b = true,
                    .a = a.get(),
                    .b = b.get(),
                    .c = c.get()},
                   st);
    };
    MESSAGE("BENCH B=" << batch << " fc1 matmul events_us " << timer.events_us(fc1) << " graph_us "
                       << timer.graph_us(fc1) << " workspace 0");
  }
}
// KILN-BENCH-END

// Tuning data: each pass of LeNet's convolutions at batch 64 and 256 with other tiles
// ({bm, bn, kg, splits, ks, tm, tn}) and splits.
TEST_CASE("benchmark variants: implicit-GEMM tiles and split counts" * doctest::skip()) {
  SKIP_WITHOUT_GPU();
  BenchTimer timer;
  using Tiling = cuda::detail::ConvTiling;
  preload_tiles(tiles_to_test());
  for (auto [batch, cin, cout, hw] : {std::tuple<std::int64_t, int, int, int>{64, 1, 32, 28},
                                      {64, 32, 64, 14},
                                      {256, 1, 32, 28},
                                      {256, 32, 64, 14}}) {
    const auto g = kernels::conv_geometry({batch, cin, hw, hw}, {cout, cin, 3, 3}, 1, 1);
    const std::size_t bytes = 64u << 20;
    DeviceBuffer x(random_tensor({batch, cin, hw, hw}, DType::f32, 1)),
        w(random_tensor({cout, cin, 3, 3}, DType::f32, 2));
    DeviceBuffer y(random_tensor({batch, cout, hw, hw}, DType::f32, 5)), work(bytes), dx(x.bytes()),
        dw(w.bytes());
    const cuda::ConvWorkspace ws{work.get(), bytes};
    const std::vector<Tiling> fwd = {{},
                                     {64, 64, 1, 0, 32},
                                     {32, 64, 1, 0, 32},
                                     {32, 128, 1, 0, 16},
                                     {64, 64, 1, 0, 16, 8, 8},
                                     {64, 128, 1, 0, 16, 8, 8},
                                     {64, 64, 2, 0, 16, 8, 8},
                                     {64, 32, 2, 0, 16, 8, 4},
                                     {32, 64, 1, 0, 32, 4, 8},
                                     {32, 64, 1, 0, 16, 4, 8},
                                     {128, 64, 1, 0, 16, 8, 8},
                                     {32, 32, 4, 0, 16, 8, 8}};
    const std::vector<Tiling> wgrad =
        cin == 1
            ? std::vector<Tiling>{{}, {32, 16, 4, 0, 16}, {32, 16, 2, 0, 32}, {32, 16, 4, 392, 16}}
            : std::vector<Tiling>{{},
                                  {64, 32, 2, 0, 16},
                                  {64, 64, 1, 0, 16, 8, 8},
                                  {64, 64, 1, 18, 16, 8, 8},
                                  {64, 64, 1, 54, 16, 8, 8},
                                  {64, 64, 2, 0, 16, 8, 8},
                                  {64, 32, 2, 0, 16, 8, 4},
                                  {64, 32, 2, 60, 16, 8, 4},
                                  {64, 128, 1, 0, 16, 8, 8},
                                  {32, 32, 4, 0, 16, 8, 8}};
    auto run = [&](cuda::ConvPass pass, const Tiling& t) {
      const std::string name = pass == cuda::ConvPass::forward      ? "forward"
                               : pass == cuda::ConvPass::grad_input ? "grad_input"
                                                                    : "grad_weight";
      std::function<void(cudaStream_t)> body;
      if (pass == cuda::ConvPass::forward)
        body = [&](cudaStream_t st) {
          cuda::conv2d_forward(DType::f32, g, x.get(), w.get(), y.get(), ws, st);
        };
      else if (pass == cuda::ConvPass::grad_input)
        body = [&](cudaStream_t st) {
          cuda::conv2d_grad_input(DType::f32, g, y.get(), w.get(), dx.get(), ws, st);
        };
      else
        body = [&](cudaStream_t st) {
          cuda::conv2d_grad_weight(DType::f32, g, x.get(), y.get(), dw.get(), ws, st);
        };
      std::ostringstream line;
      line << "b" << batch << " conv" << (cin == 1 ? 1 : 2) << " " << name << " ";
      if (t.bm == 0)
        line << "default";
      else
        line << t.bm << "x" << t.bn << "x" << t.kg << "k" << t.ks << "t" << t.tm << "x" << t.tn;
      line << " splits " << t.splits;
      if (t.bm > 0 && !cuda::igemm_tile_valid({t.bm, t.bn, t.kg, t.ks, t.tm, t.tn}, DType::f32))
        return;
      cuda::detail::set_conv_tiling_for_testing(pass, t);
      try {
        const double graph = timer.graph_us(body);
        line << " graph_us " << graph << " events_us " << timer.events_us(body);
      } catch (const std::exception& e) {
        line << " failed: " << e.what();
      }
      cuda::detail::set_conv_tiling_for_testing(pass, {});
      MESSAGE("VARIANT " << line.str());
    };
    for (const Tiling& t : fwd) run(cuda::ConvPass::forward, t);
    if (cin > 1)
      for (const Tiling& t : fwd) run(cuda::ConvPass::grad_input, t);
    for (const Tiling& t : wgrad) run(cuda::ConvPass::grad_weight, t);
  }
}

// The first tensor-core GEMM of kiln: n^3 bf16 and f16 (f32 accumulation) against f32, side by
// side on the same rounded random inputs, each checked on 256 sampled outputs against f64 dot
// products on the CPU (bf16/f16: within a few of the output's own rounding; f32: 1e-4).
TEST_CASE("benchmark: bf16 and f16 GEMM on the tensor cores against f32 (n = 8192)" *
          doctest::skip()) {
  SKIP_WITHOUT_GPU();
  constexpr std::int64_t n = 8192;
  BenchTimer timer;
  for (DType low : {DType::bf16, DType::f16}) {
    const Tensor a_low = random_tensor({n, n}, DType::f32, 11).to(low);
    const Tensor b_low = random_tensor({n, n}, DType::f32, 12).to(low);
    const Tensor a32 = a_low.to(DType::f32), b32 = b_low.to(DType::f32);
    DeviceBuffer a(a_low), b(b_low), a_f32(a32), b_f32(b32), c(n * n * 4), c_f32(n * n * 4);
    for (DType dtype : {low, DType::f32}) {
      const bool f32 = dtype == DType::f32;
      const auto body = [&](cudaStream_t st) {
        cuda::matmul({.dtype = dtype,
                      .m = n,
                      .n = n,
                      .k = n,
                      .a = f32 ? a_f32.get() : a.get(),
                      .b = f32 ? b_f32.get() : b.get(),
                      .c = f32 ? c_f32.get() : c.get()},
                     st);
      };
      const double us = timer.events_us(body);
      const Tensor out = (f32 ? c_f32 : c).download({n, n}, dtype);
      Philox rng(5);
      double worst = 0;
      for (int s = 0; s < 256; ++s) {
        const auto i = static_cast<std::int64_t>(rng.next_below(n)),
                   j = static_cast<std::int64_t>(rng.next_below(n));
        double ref = 0, magnitude = 0;
        for (std::int64_t k = 0; k < n; ++k) {
          const double p = static_cast<double>(a32.data<float>()[i * n + k]) *
                           static_cast<double>(b32.data<float>()[k * n + j]);
          ref += p;
          magnitude += std::abs(p);
        }
        const double rtol = f32 ? 1e-4 : 4.0 * (low == DType::bf16 ? 0x1p-8 : 0x1p-11);
        worst = std::max(worst, std::abs(out.at(i * n + j) - ref) /
                                    (rtol * std::abs(ref) + 1e-4 * magnitude / std::sqrt(n)));
      }
      CHECK(worst <= 1.0);
      MESSAGE("BENCH gemm " << n << "^3 " << dtype_name(dtype) << " (inputs rounded to "
                            << dtype_name(low) << ") events_us " << us << " TFLOP/s "
                            << 2.0 * n * n * n / us * 1e-6 << " worst sampled error ratio "
                            << worst);
    }
  }
}

// The bf16 convolution forward on the tensor cores (conv_mma.cuh) against the CUDA-core
// implicit GEMM in bf16 and in f32, on LeNet's and ResNet-18's shapes; the two bf16 results
// must agree to two bf16 ulps.
TEST_CASE("benchmark: bf16 conv2d forward, tensor cores against CUDA cores and f32" *
          doctest::skip()) {
  SKIP_WITHOUT_GPU();
  BenchTimer timer;
  struct Case {
    const char* name;
    std::int64_t batch, cin, cout, hw;
  };
  for (const Case& c :
       {Case{"lenet conv2", 256, 32, 64, 14}, Case{"resnet18 stage1", 64, 64, 64, 32},
        Case{"resnet18 stage1", 256, 64, 64, 32}, Case{"resnet18 stage2", 256, 128, 128, 16},
        Case{"resnet18 stage3", 256, 256, 256, 8}, Case{"resnet18 stage4", 256, 512, 512, 4}}) {
    const auto g =
        kernels::conv_geometry({c.batch, c.cin, c.hw, c.hw}, {c.cout, c.cin, 3, 3}, 1, 1);
    const Tensor x32 = random_tensor({c.batch, c.cin, c.hw, c.hw}, DType::f32, 1);
    const Tensor w32 = random_tensor({c.cout, c.cin, 3, 3}, DType::f32, 2, -0.1, 0.1);
    DeviceBuffer x(x32.to(DType::bf16)), w(w32.to(DType::bf16)), xf(x32), wf(w32);
    const Shape y_shape{c.batch, c.cout, c.hw, c.hw};
    DeviceBuffer y_tc(y_shape.numel() * 2), y_cc(y_shape.numel() * 2), y_f32(y_shape.numel() * 4);
    const double flops = 2.0 * c.cout * c.cin * 9 * c.batch * c.hw * c.hw;
    auto time = [&](cuda::detail::ConvAlgo algo, DType dtype, DeviceBuffer& a, DeviceBuffer& b,
                    DeviceBuffer& out) {
      cuda::detail::set_conv_algo_for_testing(algo);
      const double us = timer.events_us([&](cudaStream_t st) {
        cuda::conv2d_forward(dtype, g, a.get(), b.get(), out.get(), {}, st);
      });
      cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::automatic);
      return us;
    };
    const double tc = time(cuda::detail::ConvAlgo::automatic, DType::bf16, x, w, y_tc);
    const double cc = time(cuda::detail::ConvAlgo::cuda_cores, DType::bf16, x, w, y_cc);
    const double f32 = time(cuda::detail::ConvAlgo::automatic, DType::f32, xf, wf, y_f32);
    const Tensor a = y_tc.download(y_shape, DType::bf16), b = y_cc.download(y_shape, DType::bf16);
    double worst = 0;
    for (std::int64_t i = 0; i < a.numel(); ++i)
      worst = std::max(worst, std::abs(a.at(i) - b.at(i)) / (0x1p-6 * std::abs(b.at(i)) + 1e-3));
    CHECK(worst <= 1.0);
    MESSAGE("BENCH conv2d fwd " << std::string(c.name) << " B=" << c.batch
                                << " bf16 tensor cores us " << tc << " (" << flops / tc * 1e-6
                                << " TFLOP/s), bf16 CUDA cores us " << cc << ", f32 us " << f32
                                << ", speed-up " << cc / tc << "x; agreement " << worst);
  }
}

// The weight gradient of resnet18's 3x3 stride-1 passes at b512 under TF32, in every wgmma tile
// of the tuner's list (forced) and the default with the tuner's choice: which tile, and how far
// stage 1 (64 filters, 32x32 images: 34.7 TFLOP/s in the H100's step trace of session 26,
// against 65-85 for the other stages) is from the others. The splits are the pass's own.
TEST_CASE("benchmark: TF32 weight-gradient tiles on resnet18's b512 passes" * doctest::skip()) {
  SKIP_WITHOUT_GPU();
  BenchTimer timer;
  cuda::set_allow_tf32(true);
  for (auto [channels, hw] :
       {std::pair<std::int64_t, std::int64_t>{64, 32}, {128, 16}, {256, 8}, {512, 4}}) {
    const std::int64_t batch = 512;
    const auto g =
        kernels::conv_geometry({batch, channels, hw, hw}, {channels, channels, 3, 3}, 1, 1);
    const std::size_t bytes =
        cuda::conv_workspace_bytes(g, DType::f32, cuda::ConvPass::grad_weight);
    DeviceBuffer x(random_tensor({batch, channels, hw, hw}, DType::f32, 1)),
        dy(random_tensor({batch, channels, hw, hw}, DType::f32, 2)), work(bytes),
        dw(static_cast<std::size_t>(channels * channels * 9 * 4));
    const double flops = 2.0 * channels * channels * 9 * batch * hw * hw;
    auto time = [&](std::optional<cuda::WgradTile> tile) {
      cuda::detail::force_wgrad_tile_for_testing(tile);
      std::ostringstream line;
      line << "stage c" << channels << " " << hw << "x" << hw << " ";
      if (tile)
        line << tile->bm << "x" << tile->bn << " warps " << tile->wm << "x" << tile->wn;
      else
        line << "default";
      line << timed_wgrad(timer, g, x, dy, dw, {work.get(), bytes}, flops);
      cuda::detail::force_wgrad_tile_for_testing(std::nullopt);
      MESSAGE("TF32 WGRAD " << line.str());
    };
    time(std::nullopt);
    for (const cuda::WgradTile& t : cuda::kWgmmaWgradCandidates) time(t);
    // The same GEMM (M = C, N = 9 C, K = B H W) as a 1x1 convolution of 9 C channels: every
    // patch run starts on a 16-byte piece, where the 3x3's taps left and right of the centre
    // start one f32 into one (two pieces loaded and shifted; main loads two for every run, the
    // branch tf32-wgrad-expand one where aligned). Against the 3x3: what the taps' shifts cost.
    const auto pointwise =
        kernels::conv_geometry({batch, 9 * channels, hw, hw}, {channels, 9 * channels, 1, 1}, 1, 0);
    const std::size_t pointwise_bytes =
        cuda::conv_workspace_bytes(pointwise, DType::f32, cuda::ConvPass::grad_weight);
    DeviceBuffer x9(random_tensor({batch, 9 * channels, hw, hw}, DType::f32, 3)),
        work9(pointwise_bytes);
    MESSAGE("TF32 WGRAD stage c" << channels << " " << hw << "x" << hw << " as a 1x1 of 9C channels"
                                 << timed_wgrad(timer, pointwise, x9, dy, dw,
                                                {work9.get(), pointwise_bytes}, flops));
  }
  cuda::set_allow_tf32(false);
}

// fp32's weight gradient on the CUDA cores (the largest share of resnet18's fp32 step: 25.7 of
// 63.4 ms at b512 in session 26's H100 trace, 18-27 TFLOP/s against the forward's 38 in its
// 128x128 tile): the default tile (two thread groups over 64x64 until session 27, whose H100
// run of this case made one group over 64x128 the default: faster on all four) against
// one-group tiles up to 128x128, each with the pass's own split rule, on resnet18's 3x3 passes
// at b512.
TEST_CASE("benchmark: f32 weight-gradient tiles on resnet18's b512 passes" * doctest::skip()) {
  SKIP_WITHOUT_GPU();
  BenchTimer timer;
  using Tiling = cuda::detail::ConvTiling;
  for (auto [channels, hw] :
       {std::pair<std::int64_t, std::int64_t>{64, 32}, {128, 16}, {256, 8}, {512, 4}}) {
    const std::int64_t batch = 512;
    const auto g =
        kernels::conv_geometry({batch, channels, hw, hw}, {channels, channels, 3, 3}, 1, 1);
    const std::size_t bytes = 256u << 20;
    DeviceBuffer x(random_tensor({batch, channels, hw, hw}, DType::f32, 1)),
        dy(random_tensor({batch, channels, hw, hw}, DType::f32, 2)), work(bytes),
        dw(static_cast<std::size_t>(channels * channels * 9 * 4));
    const double flops = 2.0 * channels * channels * 9 * batch * hw * hw;
    for (const Tiling& t : std::vector<Tiling>{{},
                                               {64, 64, 1, 0, 16, 8, 8},
                                               {64, 128, 1, 0, 16, 8, 8},
                                               {128, 64, 1, 0, 16, 8, 8},
                                               {128, 128, 1, 0, 16, 8, 8}}) {
      std::ostringstream line;
      line << "stage c" << channels << " " << hw << "x" << hw << " ";
      if (t.bm == 0)
        line << "default";
      else
        line << t.bm << "x" << t.bn << "x" << t.kg << "t" << t.tm << "x" << t.tn;
      cuda::detail::set_conv_tiling_for_testing(cuda::ConvPass::grad_weight, t);
      line << timed_wgrad(timer, g, x, dy, dw, {work.get(), bytes}, flops);
      cuda::detail::set_conv_tiling_for_testing(cuda::ConvPass::grad_weight, {});
      MESSAGE("F32 WGRAD " << line.str());
    }
  }
}
}  // namespace kiln
