// backends/cuda kernels: every hand-written kernel compiles with NVRTC for sm_90 (no GPU
// needed); where a GPU exists, matmul, conv, pooling, transpose, concat, one_hot and fill against
// the CPU reference kernels on fresh random inputs (GEMMs to 1e-4, data movement exactly).
#include <doctest/doctest.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <optional>
#include <utility>
#include <vector>

#include "backends/cuda/conv.h"
#include "backends/cuda/conv_mma.h"
#include "backends/cuda/conv_tma.h"
#include "backends/cuda/conv_tuning.h"
#include "backends/cuda/cublas_handle.h"
#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "core/env_switch.h"
#include "backends/cuda/layout.h"
#include "backends/cuda/matmul.h"
#include "backends/cuda/pool.h"
#include "core/philox.h"
#include "gpu/cuda_check.h"
#include "gpu/nvrtc_compiler.h"
#include "gpu/autotune.h"
#include "gpu/cuda_runtime.h"
#include "gpu/kernel_cache.h"
#include "graph/kernels/conv_cpu.h"
#include "graph/kernels/pool_cpu.h"
#include "graph/op_table.h"
#include "kiln_kernel_files.h"
#include "tests/cuda_kernels_support.h"
#include "tests/support.h"

namespace kiln {
using namespace cuda_test;  // NOLINT: the shared test helpers

namespace {
// TF32 allowed while it lives (off again however the case ends: the later cases are f32).
struct AllowTf32 {
  AllowTf32() { cuda::set_allow_tf32(true); }
  ~AllowTf32() { cuda::set_allow_tf32(false); }
  AllowTf32(const AllowTf32&) = delete;
  AllowTf32& operator=(const AllowTf32&) = delete;
};
}  // namespace

TEST_CASE("every hand-written CUDA kernel compiles with NVRTC for sm_90 (no GPU needed)") {
  const std::vector<gpu::KernelSource> sources = cuda::all_kernel_sources();
  std::set<std::string> names;
  for (const auto& s : sources)
    CHECK_MESSAGE(names.insert(s.name).second, "duplicate kernel " << s.name);
  // This process's own directory: two test runs on one machine must not share it.
  const auto dir = std::filesystem::temp_directory_path() /
                   ("kiln-cuda-kernels-test-cache-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  gpu::KernelCache cache(dir);
  const auto compiled = cache.get_or_compile(sources, {.sm = 90});
  REQUIRE(compiled.size() == sources.size());
  for (std::size_t i = 0; i < compiled.size(); ++i) {
    CHECK(compiled[i].name == sources[i].name);
    CHECK(compiled[i].cubin.size() > 4);
  }
  std::filesystem::remove_all(dir);
  MESSAGE(sources.size() << " hand-written kernels compiled for sm_90");
}

// The kernels are .cuh files embedded at build time (cmake/embed_kernels.cmake): each embedded
// text is self-contained (its kernel headers pasted in) and every entry it defines (an
// `#ifdef KILN_...` block) is the kernel of some source above, so none goes uncompiled.
TEST_CASE("every entry of every embedded kernel file is a compiled kernel source") {
  const std::vector<gpu::KernelSource> sources = cuda::all_kernel_sources();
  int entries = 0;
  for (const cuda::kernel_files::File& file : cuda::kernel_files::all) {
    const std::string text = file.text;
    CHECK_MESSAGE(text.find("#include \"backends/") == std::string::npos,
                  file.path << " still includes a kernel header");
    for (std::size_t at = text.find("\n#ifdef KILN_"); at != std::string::npos;
         at = text.find("\n#ifdef KILN_", at + 1)) {
      const std::size_t begin = at + 8, end = text.find('\n', begin);
      const std::string entry = text.substr(begin, end - begin);
      const bool used = std::any_of(sources.begin(), sources.end(), [&](const auto& s) {
        return s.code.rfind(
                   gpu::after_prior_grids_definition() + "#define " + entry + " " + s.name + "\n",
                   0) == 0;
      });
      CHECK_MESSAGE(used, file.path << ": entry " << entry << " is no kernel's");
      ++entries;
    }
  }
  CHECK(entries >= 20);
  MESSAGE(entries << " entries in " << std::size(cuda::kernel_files::all) << " embedded files");
}

// Every hand-written kernel may be launched programmatically (gpu/kernel_source.h): each entry of
// every source begins with KILN_AFTER_PRIOR_GRIDS(), whose definition the source carries.
TEST_CASE("every hand-written kernel begins with KILN_AFTER_PRIOR_GRIDS() and says so") {
  for (const gpu::KernelSource& s : cuda::all_kernel_sources()) {
    CAPTURE(s.name);
    CHECK(s.after_prior_grids);
    CHECK(s.code.rfind(gpu::after_prior_grids_definition(), 0) == 0);
    CHECK(test::kernels_after_prior_grids(s.code) >= 1);
  }
}

TEST_CASE("cuBLAS status names and the TF32 switch") {
  CHECK(std::string(cuda::cublas_status_name(CUBLAS_STATUS_INVALID_VALUE)) ==
        "CUBLAS_STATUS_INVALID_VALUE");
  CHECK_FALSE(cuda::allow_tf32());
  try {
    KILN_CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("CUBLAS_STATUS_NOT_SUPPORTED") != std::string::npos);
  }
}

namespace {

// Test hooks of conv.cpp, undone at scope exit (also when a check throws).
struct ForceIm2col {
  ForceIm2col() { cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::im2col_gemm); }
  ~ForceIm2col() { cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::automatic); }
};
struct ForceTiling {
  explicit ForceTiling(cuda::detail::ConvTiling forward, cuda::detail::ConvTiling grad_input = {},
                       cuda::detail::ConvTiling grad_weight = {}) {
    cuda::detail::set_conv_tiling_for_testing(cuda::ConvPass::forward, forward);
    cuda::detail::set_conv_tiling_for_testing(cuda::ConvPass::grad_input, grad_input);
    cuda::detail::set_conv_tiling_for_testing(cuda::ConvPass::grad_weight, grad_weight);
  }
  ~ForceTiling() {
    for (auto pass :
         {cuda::ConvPass::forward, cuda::ConvPass::grad_input, cuda::ConvPass::grad_weight})
      cuda::detail::set_conv_tiling_for_testing(pass, {});
  }
};

}  // namespace

TEST_CASE("conv workspace sizes (no GPU needed)") {
  const auto g = kernels::conv_geometry({64, 32, 14, 14}, {64, 32, 3, 3}, 1, 1);
  // Implicit GEMM: forward and grad_input need no scratch; grad_weight's K = 64*196 = 12544
  // (784 steps of 16) is split 88 ways (3 tiles of 64x128, 88 splits wanted for about 264
  // blocks: 9 steps each), one [64, 288] partial each.
  CHECK(cuda::conv_workspace_bytes(g, DType::f32, cuda::ConvPass::forward) == 0);
  CHECK(cuda::conv_workspace_bytes(g, DType::f32, cuda::ConvPass::grad_input) == 0);
  CHECK(cuda::conv_workspace_bytes(g, DType::f32, cuda::ConvPass::grad_weight) ==
        88u * 64 * 288 * 4);
  // Stride 2: grad_input by classes of dx's pixels where dx's sides are even (no scratch),
  // else im2col + GEMM, one [P = 288, OH*OW = 64] patch matrix per image.
  const auto strided = kernels::conv_geometry({64, 32, 14, 14}, {64, 32, 3, 3}, 2, 1);
  CHECK(cuda::conv_workspace_bytes(strided, DType::f32, cuda::ConvPass::grad_input) == 0);
  const auto odd = kernels::conv_geometry({64, 32, 15, 15}, {64, 32, 3, 3}, 2, 1);
  CHECK(cuda::conv_workspace_bytes(odd, DType::f32, cuda::ConvPass::grad_input) ==
        64u * 288 * 64 * 4);
  CHECK(cuda::conv_workspace_bytes(odd, DType::f32, cuda::ConvPass::grad_input, 1) ==
        288u * 64 * 4);
  {
    ForceIm2col im2col;  // P = 288, OH*OW = 196: forward one [P, 196] f32 patch matrix per image
    CHECK(cuda::conv_workspace_bytes(g, DType::f32, cuda::ConvPass::forward) ==
          64u * 288 * 196 * 4);
    CHECK(cuda::conv_workspace_bytes(g, DType::f32, cuda::ConvPass::forward, 1) == 288u * 196 * 4);
    CHECK(cuda::conv_workspace_bytes(g, DType::f32, cuda::ConvPass::grad_weight) ==
          64u * (288 + 64) * 196 * 4);
  }
  const auto pointwise = kernels::conv_geometry({8, 16, 5, 5}, {4, 16, 1, 1}, 1, 0);
  CHECK(cuda::conv_workspace_bytes(pointwise, DType::f32, cuda::ConvPass::forward) == 0);
  // bf16/f16 (DESIGN.md, Precision) run on the tensor cores: grad_input (stride 1 or 2)
  // transposes the 64 x 288 weights into scratch; grad_weight's split-K partials are f32 (392 steps
  // of 32 pixels over 5 tiles of 64 x 64: 49 splits of 8 steps, the fewest steps a split takes);
  // the im2col fallback's patch matrix is of the input's dtype where it is copied (forward) and f32
  // where it holds sums (grad_input's col), and grad_weight sums its chunks in an f32 dW.
  // With 32 input and 64 output channels (multiples of 8) the forward and grad_input read a
  // channels-last copy of their image (x: 64 x 32 x 196, dy: 64 x 64 x 196 or, at stride 2,
  // x 49) and the reordered 64 x 288 weights, all 16-bit, from scratch.
  for (DType low : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(low));
    CHECK(cuda::conv_workspace_bytes(g, low, cuda::ConvPass::forward) ==
          (64u * 32 * 196 + 64u * 288) * 2);
    CHECK(cuda::conv_workspace_bytes(g, low, cuda::ConvPass::grad_input) ==
          (64u * 64 * 196 + 64u * 288) * 2);
    CHECK(cuda::conv_workspace_bytes(g, low, cuda::ConvPass::grad_weight) == 49u * 64 * 288 * 4);
    CHECK(cuda::conv_workspace_bytes(strided, low, cuda::ConvPass::grad_input) ==
          (64u * 64 * 49 + 64u * 288) * 2);
    {
      cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::mma_nchw);
      CHECK(cuda::conv_workspace_bytes(g, low, cuda::ConvPass::forward) == 0);
      CHECK(cuda::conv_workspace_bytes(g, low, cuda::ConvPass::grad_input) == 64u * 288 * 2);
      CHECK(cuda::conv_workspace_bytes(strided, low, cuda::ConvPass::grad_input) == 64u * 288 * 2);
      cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::automatic);
    }
    ForceIm2col im2col;
    CHECK(cuda::conv_workspace_bytes(g, low, cuda::ConvPass::forward) == 64u * 288 * 196 * 2);
    // col [P = 288][64 * 196] and dy transposed [64][64 * 196] in bf16, each rounded up to
    // 256 bytes, then dW [64, 288] in f32.
    CHECK(cuda::conv_workspace_bytes(g, low, cuda::ConvPass::grad_weight) ==
          64u * (288 + 64) * 196 * 2 + 64u * 288 * 4);
  }
  // Below the size rule (M * N * K under 2^26: here 24 x 126 x 144) bf16 stays on the CUDA
  // cores (the implicit GEMM forward: no scratch); forced, it takes the channels-last copy.
  const auto small = kernels::conv_geometry({2, 16, 9, 7}, {24, 16, 3, 3}, 1, 1);
  CHECK(cuda::conv_workspace_bytes(small, DType::bf16, cuda::ConvPass::forward) == 0);
  cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::tensor_cores);
  CHECK(cuda::conv_workspace_bytes(small, DType::bf16, cuda::ConvPass::forward) ==
        (2u * 16 * 63 * 2 + 256 - 1) / 256 * 256 + (24u * 144 * 2 + 255) / 256 * 256);
  cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::automatic);
  // Every tile the passes choose from has a kernel (shared memory, thread count).
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16})
    for (auto mode :
         {cuda::IgemmMode::forward, cuda::IgemmMode::grad_input, cuda::IgemmMode::grad_weight})
      for (cuda::IgemmTile tile : cuda::igemm_tiles(mode, dtype))
        CHECK(cuda::igemm_tile_valid(tile, dtype));
}

// ---- GPU cases ----

namespace {

void check_matmul(std::vector<std::int64_t> batch_dims, std::int64_t m, std::int64_t n,
                  std::int64_t k, bool ta, bool tb, DType dtype, std::uint64_t seed) {
  CAPTURE(m);
  CAPTURE(n);
  CAPTURE(k);
  CAPTURE(ta);
  CAPTURE(tb);
  auto dims = [&](std::int64_t r, std::int64_t c) {
    std::vector<std::int64_t> d = batch_dims;
    d.push_back(r);
    d.push_back(c);
    return Shape(d);
  };
  const Tensor a = random_tensor(ta ? dims(k, m) : dims(m, k), dtype, seed);
  const Tensor b = random_tensor(tb ? dims(n, k) : dims(k, n), dtype, seed + 1);
  const Tensor ref =
      cpu_op("matmul", {{"trans_a", std::int64_t{ta}}, {"trans_b", std::int64_t{tb}}}, {a, b},
             dims(m, n), dtype);
  DeviceBuffer da(a), db(b), dc(ref.nbytes());
  std::int64_t batch = 1;
  for (std::int64_t d : batch_dims) batch *= d;
  cuda::matmul({.dtype = dtype,
                .batch = batch,
                .m = m,
                .n = n,
                .k = k,
                .trans_a = ta,
                .trans_b = tb,
                .a = da.get(),
                .b = db.get(),
                .c = dc.get()},
               nullptr);
  CHECK(gemm_closeness(dc.download(ref.shape(), dtype), ref, rtol_of(dtype)) <= 1.0);
}

}  // namespace

// f32's weight gradient under TF32 (--precision tf32) takes the 16-bit types' tensor-core kernels
// (their K steps the same bytes: half the pixels), wgmma where the plan's device is sm_90, with
// the same split-K partials; without TF32 it stays on the CUDA cores.
TEST_CASE("conv2d grad_weight of f32 under TF32 takes the tensor-core kernels (no GPU needed)") {
  const auto g = kernels::conv_geometry({64, 32, 14, 14}, {64, 32, 3, 3}, 1, 1);
  auto wgrad_kernels = [&] {
    std::vector<std::string> names;
    for (const gpu::KernelSource& k :
         cuda::conv_kernel_sources(g, DType::f32, cuda::ConvPass::grad_weight))
      if (k.name.rfind("kiln_conv_mma_wgrad_", 0) == 0) names.push_back(k.name);
    return names;
  };
  CHECK(wgrad_kernels().empty());
  const AllowTf32 tf32;
  const cuda::MmaSplits splits = cuda::conv_mma_wgrad_splits(64, 288, 64 * 196);
  CHECK(splits.count == 49);
  CHECK(cuda::conv_workspace_bytes(g, DType::f32, cuda::ConvPass::grad_weight) ==
        49u * 64 * 288 * 4);
  const std::vector<std::string> names = wgrad_kernels();
  REQUIRE(names.size() == 1);
  CHECK(names[0].find("_tf32") != std::string::npos);
  CHECK(names[0].find("_vec") == std::string::npos);  // 14 x 14 pixels: dy by scalar loads
  CHECK((names[0].find("wgmma") != std::string::npos) == cuda::conv_wgmma_enabled(DType::f32));
}

TEST_CASE("matmul: all transpose combinations, batched, LeNet's fc1, f64") {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 100;
  for (DType dtype : {DType::f32, DType::f64})
    for (int t = 0; t < 4; ++t) {
      check_matmul({}, 7, 5, 9, t & 1, t & 2, dtype, seed += 2);
      check_matmul({3}, 33, 17, 65, t & 1, t & 2, dtype, seed += 2);
      check_matmul({2, 3}, 4, 6, 1, t & 1, t & 2, dtype, seed += 2);
    }
  check_matmul({}, 64, 128, 3136, false, true, DType::f32, 1);   // x [64, 3136] W^T, W [128, 3136]
  check_matmul({}, 3136, 128, 64, true, false, DType::f32, 3);   // dW^T-shaped: x^T dy
  check_matmul({}, 64, 3136, 128, false, false, DType::f32, 5);  // dx = dy W
}

TEST_CASE("matmul: K = 0 is an empty sum, all zeros") {
  SKIP_WITHOUT_GPU();
  // Not compared with the CPU kernel: Eigen leaves the output untouched when K = 0.
  DeviceBuffer a(16), b(16), c(5 * 4 * sizeof(float));
  cuda::fill(DType::f32, 3.0, 20, c.get(), nullptr);
  cuda::matmul({.m = 5, .n = 4, .k = 0, .a = a.get(), .b = b.get(), .c = c.get()}, nullptr);
  check_identical(c.download({5, 4}, DType::f32), Tensor::zeros({5, 4}, DType::f32));
}

TEST_CASE("matmul: TF32 when allowed stays within TF32's precision") {
  SKIP_WITHOUT_GPU();
  cuda::set_allow_tf32(true);
  const Tensor a = random_tensor({256, 512}, DType::f32, 11),
               b = random_tensor({512, 128}, DType::f32, 12);
  const Tensor ref = cpu_op("matmul", {{"trans_a", std::int64_t{0}}, {"trans_b", std::int64_t{0}}},
                            {a, b}, {256, 128}, DType::f32);
  DeviceBuffer da(a), db(b), dc(ref.nbytes());
  cuda::matmul({.m = 256, .n = 128, .k = 512, .a = da.get(), .b = db.get(), .c = dc.get()},
               nullptr);
  cuda::set_allow_tf32(false);
  CHECK(gemm_closeness(dc.download(ref.shape(), DType::f32), ref, 1e-2) <= 1.0);
}

namespace {

// Forward, grad_input and grad_weight of one convolution against conv_cpu; `chunk` limits
// the workspace to that many images (0: the whole batch).
// `t` in `dtype` (f32 from bf16/f16: exact), or `t` itself.
Tensor widened(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = Tensor::empty(t.shape(), dtype);
  for (std::int64_t i = 0; i < t.numel(); ++i) out.data<float>()[i] = static_cast<float>(t.at(i));
  return out;
}

void check_conv(const Shape& xs, const Shape& ws, std::int64_t stride, std::int64_t padding,
                DType dtype, std::uint64_t seed, std::int64_t chunk = 0,
                std::int64_t max_workspace = -1, double rtol = 0) {
  if (rtol == 0) rtol = rtol_of(dtype);
  CAPTURE(xs.str());
  CAPTURE(ws.str());
  CAPTURE(stride);
  CAPTURE(padding);
  CAPTURE(chunk);
  const kernels::ConvGeometry g = kernels::conv_geometry(xs, ws, stride, padding);
  const Shape ys{g.batch, g.out_channels, g.out_h, g.out_w};
  const Tensor x = random_tensor(xs, dtype, seed), w = random_tensor(ws, dtype, seed + 1);
  const Tensor dy = random_tensor(ys, dtype, seed + 2);
  // bf16/f16: the CPU reference in f32 over the same (rounded) inputs.
  const DType ref = is_low_precision(dtype) ? DType::f32 : dtype;
  Tensor y_ref = Tensor::empty(ys, ref), dx_ref = Tensor::empty(xs, ref),
         dw_ref = Tensor::empty(ws, ref);
  kernels::conv2d_forward(widened(x, ref), widened(w, ref), y_ref, g);
  kernels::conv2d_backward_input(widened(dy, ref), widened(w, ref), dx_ref, g);
  kernels::conv2d_backward_weight(widened(x, ref), widened(dy, ref), dw_ref, g);

  std::size_t bytes = 0;
  for (auto pass :
       {cuda::ConvPass::forward, cuda::ConvPass::grad_input, cuda::ConvPass::grad_weight})
    bytes = std::max(bytes, cuda::conv_workspace_bytes(g, dtype, pass, chunk));
  if (max_workspace >= 0) bytes = std::min(bytes, static_cast<std::size_t>(max_workspace));
  DeviceBuffer dx(x), dwt(w), ddy(dy), work(bytes), y(y_ref.nbytes()), dxo(dx_ref.nbytes()),
      dwo(dw_ref.nbytes());
  const cuda::ConvWorkspace workspace{work.get(), bytes};
  cuda::conv2d_forward(dtype, g, dx.get(), dwt.get(), y.get(), workspace, nullptr);
  cuda::conv2d_grad_input(dtype, g, ddy.get(), dwt.get(), dxo.get(), workspace, nullptr);
  cuda::conv2d_grad_weight(dtype, g, dx.get(), ddy.get(), dwo.get(), workspace, nullptr);
  CHECK(gemm_closeness(y.download(ys, dtype), y_ref, rtol) <= 1.0);
  CHECK(gemm_closeness(dxo.download(xs, dtype), dx_ref, rtol) <= 1.0);
  CHECK(gemm_closeness(dwo.download(ws, dtype), dw_ref, rtol) <= 1.0);
}

}  // namespace

TEST_CASE("conv2d: LeNet's two convolutions at batch 64") {
  SKIP_WITHOUT_GPU();
  check_conv({64, 1, 28, 28}, {32, 1, 3, 3}, 1, 1, DType::f32, 20);
  check_conv({64, 32, 14, 14}, {64, 32, 3, 3}, 1, 1, DType::f32, 30);
}

TEST_CASE("conv2d: odd sizes, strides, paddings, 1x1, rectangular kernels, f64") {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 200;
  for (DType dtype : {DType::f32, DType::f64})
    for (std::int64_t stride : {1, 2})
      for (std::int64_t padding : {0, 1, 2}) {
        check_conv({3, 2, 7, 5}, {4, 2, 3, 3}, stride, padding, dtype, seed += 3);
        check_conv({2, 3, 9, 6}, {5, 3, 3, 2}, stride, padding, dtype, seed += 3);
      }
  check_conv({2, 3, 5, 7}, {4, 3, 1, 1}, 1, 0, DType::f32, 300);  // pointwise: no im2col
  check_conv({2, 3, 5, 7}, {4, 3, 1, 1}, 2, 0, DType::f32, 303);
  check_conv({1, 1, 3, 3}, {1, 1, 3, 3}, 1, 0, DType::f64, 306);
}

// The input gradient at stride 2 by classes of dx's pixels on the CUDA cores (even sides, at
// least 16 input channels; no scratch, where im2col would need it): 3x3 at paddings 0-2 (a
// class's window shifted either way), 1x1 (three classes of zeros, with and without padding),
// 2x2, 4x4, 5x5 and a 3x2 filter, sides that do not divide the tiles, batch 1; f32, f64, and
// bf16 (passes this small stay off the tensor cores: the size rule).
TEST_CASE("conv2d: grad_input at stride 2 by classes of dx's pixels, f32, f64 and bf16") {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 700;
  for (DType dtype : {DType::f32, DType::f64, DType::bf16})
    for (auto [xs, ws, pad] : {std::tuple{Shape{3, 17, 8, 6}, Shape{9, 17, 3, 3}, 0},
                               std::tuple{Shape{3, 17, 8, 6}, Shape{9, 17, 3, 3}, 1},
                               std::tuple{Shape{1, 20, 10, 14}, Shape{33, 20, 3, 3}, 2},
                               std::tuple{Shape{2, 16, 6, 6}, Shape{5, 16, 1, 1}, 0},
                               std::tuple{Shape{2, 16, 6, 6}, Shape{5, 16, 1, 1}, 1},
                               std::tuple{Shape{2, 18, 8, 8}, Shape{7, 18, 2, 2}, 0},
                               std::tuple{Shape{2, 18, 8, 8}, Shape{7, 18, 4, 4}, 1},
                               std::tuple{Shape{2, 16, 12, 10}, Shape{70, 16, 5, 5}, 2},
                               std::tuple{Shape{2, 16, 6, 8}, Shape{4, 16, 3, 2}, 1}}) {
      CAPTURE(dtype_name(dtype));
      const kernels::ConvGeometry g = kernels::conv_geometry(xs, ws, 2, pad);
      CHECK(cuda::conv_workspace_bytes(g, dtype, cuda::ConvPass::grad_input) == 0);
      check_conv(xs, ws, 2, pad, dtype, seed += 3, 0, -1, dtype == DType::bf16 ? 1.5e-2 : 0);
    }
}

// Under TF32 the f32 forward and grad_input run on the channels-last tensor-core kernels where
// the image's channels are a multiple of 4 (grad_weight stays on the CUDA cores): 16 and 12
// channels, 5x3 at stride 2 and padding 2 (grad_input over dy read as if dilated), 130 filters
// (tiles of 128), a 36-step K, and 6 channels (no channels-last path), within TF32's 1e-2.
TEST_CASE("conv2d: TF32 on the tensor cores stays within TF32's precision") {
  SKIP_WITHOUT_GPU();
  const AllowTf32 tf32;
  check_conv({4, 16, 9, 7}, {24, 16, 3, 3}, 1, 1, DType::f32, 600, 0, -1, 1e-2);
  check_conv({3, 12, 11, 10}, {40, 12, 5, 3}, 2, 2, DType::f32, 610, 0, -1, 1e-2);
  check_conv({2, 8, 8, 8}, {130, 8, 3, 3}, 1, 0, DType::f32, 620, 0, -1, 1e-2);
  check_conv({1, 64, 16, 16}, {64, 64, 3, 3}, 1, 1, DType::f32, 630, 0, -1, 1e-2);
  check_conv({2, 6, 7, 7}, {8, 6, 3, 3}, 1, 1, DType::f32, 640, 0, -1, 1e-2);
}

// Every channels-last tile (the tuner's candidates, and others a benchmark may force), each
// with and without a split K (forced only), against the CPU on shapes that do not divide the
// tiles: 16 and 8 channels (several taps in one step), 136 filters (a partial 128-row tile),
// grad_input at stride 2 (dy read as if dilated), 5x5 and 1x1 kernels at strides 1 and 2, in
// bf16 (the output rounded: 1.5e-2) and TF32 (1e-2); then weights whose channels-last copy
// takes a row in several blocks (7x7 taps of 512 channels; 1864 filters flipped).
TEST_CASE("conv2d: every channels-last tile and forced K splits, bf16 and TF32") {
  SKIP_WITHOUT_GPU();
  struct ForcePlan {  // the default choice again however the case ends
    explicit ForcePlan(cuda::NhwcPlan p) {
      cuda::detail::force_nhwc_plan_for_testing(p);
      // The shapes are below the size rule: the tensor cores all the same.
      cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::tensor_cores);
    }
    ~ForcePlan() {
      cuda::detail::force_nhwc_plan_for_testing(std::nullopt);
      cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::automatic);
      cuda::set_allow_tf32(false);
    }
  };
  std::vector<cuda::NhwcTile> tiles(std::begin(cuda::kNhwcCandidates),
                                    std::end(cuda::kNhwcCandidates));
  for (cuda::NhwcTile t : {cuda::NhwcTile{256, 64, 4, 1, 4, 2}, cuda::NhwcTile{64, 64, 2, 2, 4, 3}})
    tiles.push_back(t);
  if (cuda::conv_wgmma_enabled(DType::bf16))  // sm_90: the wgmma tiles too (TF32's rows too)
    tiles.insert(tiles.end(), std::begin(cuda::kWgmmaCandidates), std::end(cuda::kWgmmaCandidates));
  std::uint64_t seed = 700;
  for (const cuda::NhwcTile& tile : tiles)
    for (std::int64_t splits : {1, 3}) {
      if (tile.wgmma && splits > 1) continue;  // wgmma tiles never split K
      CAPTURE(tile.wgmma);
      CAPTURE(tile.bm);
      CAPTURE(tile.bn);
      CAPTURE(tile.pieces);
      CAPTURE(tile.stages);
      CAPTURE(splits);
      REQUIRE(cuda::nhwc_tile_valid(tile));
      ForcePlan force({tile, splits});
      check_conv({3, 16, 9, 7}, {24, 16, 3, 3}, 1, 1, DType::bf16, seed += 3, 0, -1, 1.5e-2);
      check_conv({2, 8, 11, 10}, {136, 8, 3, 3}, 1, 0, DType::bf16, seed += 3, 0, -1, 1.5e-2);
      check_conv({2, 16, 12, 10}, {32, 16, 3, 3}, 2, 1, DType::bf16, seed += 3, 0, -1, 1.5e-2);
      check_conv({2, 16, 9, 11}, {24, 16, 5, 5}, 1, 2, DType::bf16, seed += 3, 0, -1, 1.5e-2);
      check_conv({3, 16, 10, 9}, {40, 16, 1, 1}, 2, 0, DType::bf16, seed += 3, 0, -1, 1.5e-2);
      // 9 K steps of 64 (more than the stages in flight), 200 filters: a partial 128-row tile.
      check_conv({2, 64, 12, 10}, {200, 64, 3, 3}, 1, 1, DType::bf16, seed += 3, 0, -1, 1.5e-2);
      // Channels a multiple of the K step (nhwc_taps_aligned: each step within one tap): two
      // steps a tap at stride 2; 25 taps, whose input gradient has two steps a tap too.
      check_conv({2, 128, 9, 7}, {64, 128, 3, 3}, 2, 1, DType::bf16, seed += 3, 0, -1, 1.5e-2);
      check_conv({2, 64, 7, 9}, {128, 64, 5, 5}, 1, 2, DType::bf16, seed += 3, 0, -1, 1.5e-2);
      cuda::set_allow_tf32(true);
      check_conv({2, 16, 9, 7}, {40, 16, 3, 3}, 1, 1, DType::f32, seed += 3, 0, -1, 1e-2);
      check_conv({2, 8, 12, 10}, {16, 8, 3, 3}, 2, 1, DType::f32, seed += 3, 0, -1, 1e-2);
      // 64 channels: TF32's K step of 32 (8 f32 pieces a wgmma row) within one tap.
      check_conv({2, 64, 7, 9}, {72, 64, 3, 3}, 1, 1, DType::f32, seed += 3, 0, -1, 1e-2);
      cuda::set_allow_tf32(false);
    }
  cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::tensor_cores);
  check_conv({1, 512, 7, 7}, {16, 512, 7, 7}, 1, 3, DType::bf16, seed += 3, 0, -1, 1.5e-2);
  check_conv({1, 16, 7, 7}, {1864, 16, 3, 3}, 1, 1, DType::bf16, seed += 3, 0, -1, 1.5e-2);
  cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::automatic);
}

namespace {

// y and dx of one bf16 convolution in channels-last tile `tile` (forced), as their bytes.
std::pair<Tensor, Tensor> nhwc_outputs(cuda::NhwcTile tile, const Shape& xs, const Shape& ws,
                                       std::int64_t stride, std::uint64_t seed) {
  cuda::detail::force_nhwc_plan_for_testing(cuda::NhwcPlan{tile});
  const kernels::ConvGeometry g = kernels::conv_geometry(xs, ws, stride, 1);
  const Shape ys{g.batch, g.out_channels, g.out_h, g.out_w};
  const Tensor x = random_tensor(xs, DType::bf16, seed),
               w = random_tensor(ws, DType::bf16, seed + 1);
  const Tensor dy = random_tensor(ys, DType::bf16, seed + 2);
  std::size_t bytes = 0;
  for (auto pass : {cuda::ConvPass::forward, cuda::ConvPass::grad_input})
    bytes = std::max(bytes, cuda::conv_workspace_bytes(g, DType::bf16, pass));
  DeviceBuffer dx(x), dw(w), ddy(dy), work(bytes), y(ys.numel() * 2), dxo(xs.numel() * 2);
  cuda::conv2d_forward(DType::bf16, g, dx.get(), dw.get(), y.get(), {work.get(), bytes}, nullptr);
  cuda::conv2d_grad_input(DType::bf16, g, ddy.get(), dw.get(), dxo.get(), {work.get(), bytes},
                          nullptr);
  cuda::detail::force_nhwc_plan_for_testing(std::nullopt);
  return {y.download(ys, DType::bf16), dxo.download(xs, DType::bf16)};
}

}  // namespace

// The tuner may pick any candidate on any machine, so every candidate must give the same bits:
// each sums K in the same order (16 rows a step, ascending, never split).
TEST_CASE("conv2d: every tuning candidate gives the same bits, forward and grad_input") {
  SKIP_WITHOUT_GPU();
  cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::tensor_cores);
  std::uint64_t seed = 900;
  for (auto [xs, ws, stride] : {std::tuple{Shape{3, 16, 9, 7}, Shape{136, 16, 3, 3}, 1},
                                std::tuple{Shape{2, 32, 12, 10}, Shape{72, 32, 3, 3}, 2},
                                std::tuple{Shape{5, 64, 8, 8}, Shape{64, 64, 3, 3}, 1}}) {
    CAPTURE(xs.str());
    const auto first = nhwc_outputs(cuda::kNhwcCandidates[0], xs, ws, stride, seed += 3);
    for (const cuda::NhwcTile& tile : cuda::kNhwcCandidates) {
      CAPTURE(cuda::nhwc_tile_label(tile));
      const auto other = nhwc_outputs(tile, xs, ws, stride, seed);
      check_identical(other.first, first.first);
      check_identical(other.second, first.second);
    }
    if (!cuda::conv_wgmma_enabled(DType::bf16)) continue;  // sm_90: its own candidates alike
    const auto wgmma = nhwc_outputs(cuda::kWgmmaCandidates[0], xs, ws, stride, seed);
    for (const cuda::NhwcTile& tile : cuda::kWgmmaCandidates) {
      CAPTURE(cuda::nhwc_tile_label(tile));
      const auto other = nhwc_outputs(tile, xs, ws, stride, seed);
      check_identical(other.first, wgmma.first);
      check_identical(other.second, wgmma.second);
    }
  }
  cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::automatic);
}

// The TMA pass's boxes (no GPU needed): whole rows of one image, or whole images, else none.
TEST_CASE("conv TMA boxes are whole output rows or whole images (no GPU needed)") {
  auto shape = [](int s_h, int s_w, int stride = 1) {
    cuda::ConvGemmShape g{};
    g.s_w = s_w;
    g.s_hw = s_h * s_w;
    g.stride = stride;
    return g;
  };
  using Box = std::optional<std::pair<int, int>>;
  CHECK(cuda::conv_tma_box(shape(32, 32), 256) == Box(std::pair(8, 1)));   // 8 of 32 rows
  CHECK(cuda::conv_tma_box(shape(16, 16), 256) == Box(std::pair(16, 1)));  // one image
  CHECK(cuda::conv_tma_box(shape(8, 8), 256) == Box(std::pair(8, 4)));     // four images
  CHECK(cuda::conv_tma_box(shape(4, 4), 128) == Box(std::pair(4, 8)));
  CHECK(cuda::conv_tma_box(shape(12, 12), 128) == std::nullopt);  // 128 pixels: not whole rows
  CHECK(cuda::conv_tma_box(shape(20, 32), 256) == std::nullopt);  // 8 rows do not divide 20
  CHECK(cuda::conv_tma_box(shape(6, 8), 128) == std::nullopt);    // 2.67 images
  CHECK(cuda::conv_tma_box(shape(1, 512), 256) == std::nullopt);  // wider than a box
  // Stride 2: the box spans twice the rows of the image (every second one loaded).
  CHECK(cuda::conv_tma_box(shape(16, 16, 2), 128) == Box(std::pair(8, 1)));
  CHECK(cuda::conv_tma_box(shape(4, 4, 2), 128) == Box(std::pair(4, 8)));
  CHECK(cuda::conv_tma_box(shape(256, 1, 2), 256) == std::nullopt);  // a box of 512 image rows
}

// When a 128-filter TMA tile splits K over a cluster of two blocks (no GPU needed): resnet18's
// stage-4 passes at batch 128 (64 tiles of 128 x 128, 72 K steps) on 132 SMs, not stage 3's
// (128 tiles) nor stage 4's at batch 512 (256), not the 64-filter tiles, not short K.
TEST_CASE("conv TMA split: only where the tiles fill at most half the SMs (no GPU needed)") {
  CHECK(cuda::conv_tma_split_of(128, 64, 72, 132) == 2);
  CHECK(cuda::conv_tma_split_of(128, 66, 36, 132) == 2);
  CHECK(cuda::conv_tma_split_of(128, 67, 72, 132) == 1);
  CHECK(cuda::conv_tma_split_of(128, 128, 36, 132) == 1);
  CHECK(cuda::conv_tma_split_of(128, 256, 72, 132) == 1);
  CHECK(cuda::conv_tma_split_of(64, 8, 72, 132) == 1);
  CHECK(cuda::conv_tma_split_of(128, 4, 15, 132) == 1);
  const cuda::TmaTile t = cuda::conv_tma_tile_of(128, 128, 1, 2);
  CHECK(t.split == 2);
  CHECK(t.teams == 1);
  CHECK(t.stages == cuda::conv_tma_tile_of(128, 128).stages);
  CHECK(cuda::conv_tma_name(DType::bf16, t) !=
        cuda::conv_tma_name(DType::bf16, cuda::conv_tma_tile_of(128, 128)));
}

// The TMA pass's halo form (no GPU needed): resnet18's stage-1 passes (64 channels and filters,
// 32x32, 3x3), forward and input gradient, and a 1x1 of 64 channels; not 128 channels, more than
// 64 filters, stride 2, rows of 14 or 4 pixels (a tile of whole images), rows of 64 (too much
// shared memory), a 5x5 (its 25 taps' filter does not fit beside the boxes) or a 1x7 (seven
// columns of taps: 14 boxes of 16 KiB); a 1x5 fits.
TEST_CASE("conv TMA halo form: where it fits (no GPU needed)") {
  // The forward's GEMM of a kh x kw convolution at stride 1: co filters, c channels, oh x ow.
  auto shape = [](int batch, int c, int oh, int ow, int co, int kh, int kw, int stride = 1) {
    cuda::ConvGemmShape g{};
    g.m = co;
    g.khkw = kh * kw;
    g.kw = kw;
    g.k = c * kh * kw;
    g.n = batch * oh * ow;
    g.s_hw = oh * ow;
    g.s_w = ow;
    g.stride = stride;
    return g;
  };
  const auto stage1 = cuda::conv_tma_halo_tile(shape(512, 64, 32, 32, 64, 3, 3));
  REQUIRE(stage1.has_value());
  CHECK(stage1->bm == 64);
  CHECK(stage1->bn == 128);
  CHECK(stage1->teams == 2);
  // the filter (9 taps of 8 KiB), two teams' 3 boxes of 4 + 2 rows of 32 pixels, 1 KiB, eight
  // warps' staging tiles of 8 x 72
  CHECK(stage1->shared_bytes() == 1024 + 9 * 8192 + 2 * 3 * 6 * 32 * 128 + 8 * 8 * 72 * 2);
  CHECK(stage1->shared_bytes() <= 227 * 1024);
  CHECK(cuda::conv_tma_name(DType::bf16, *stage1) == "kiln_conv_nhwc_tma_halo_64x128_bf16");
  CHECK(cuda::conv_tma_halo_tile(shape(2, 64, 16, 16, 64, 3, 3)).has_value());  // 8 rows a tile
  CHECK(cuda::conv_tma_halo_tile(shape(2, 64, 16, 16, 48, 3, 3)).has_value());  // 48 filters
  CHECK(cuda::conv_tma_halo_tile(shape(2, 64, 32, 32, 32, 1, 1)).has_value());
  CHECK(cuda::conv_tma_halo_tile(shape(2, 64, 16, 16, 64, 1, 5)).has_value());
  CHECK_FALSE(cuda::conv_tma_halo_tile(shape(2, 64, 16, 16, 64, 1, 7)));
  CHECK_FALSE(cuda::conv_tma_halo_tile(shape(2, 128, 16, 16, 64, 3, 3)));
  CHECK_FALSE(cuda::conv_tma_halo_tile(shape(2, 64, 16, 16, 65, 3, 3)));
  CHECK_FALSE(cuda::conv_tma_halo_tile(shape(2, 64, 16, 16, 64, 3, 3, 2)));
  CHECK_FALSE(cuda::conv_tma_halo_tile(shape(2, 64, 14, 14, 64, 3, 3)));
  CHECK_FALSE(cuda::conv_tma_halo_tile(shape(2, 64, 4, 4, 64, 3, 3)));
  CHECK_FALSE(cuda::conv_tma_halo_tile(shape(2, 64, 8, 64, 64, 3, 3)));
  CHECK_FALSE(cuda::conv_tma_halo_tile(shape(2, 64, 32, 32, 64, 5, 5)));
}

// grad_weight's GEMM of a k x k convolution: co filters, c channels, an oh x ow output (x's size
// from the stride and padding).
namespace {
cuda::ConvGemmShape wgrad_gemm_shape(int batch, int c, int oh, int ow, int co, int k, int stride,
                                     int pad = 0) {
  cuda::ConvGemmShape g{};
  g.m = co;
  g.khkw = k * k;
  g.n = c * k * k;
  g.k = batch * oh * ow;
  g.s_hw = oh * ow;
  g.s_w = ow;
  g.stride = stride;
  g.img_w = (ow - 1) * stride + k - 2 * pad;
  g.img_h = (oh - 1) * stride + k - 2 * pad;
  g.pad_h = g.pad_w = pad;
  g.kw = k;
  return g;
}
}  // namespace

// grad_weight's TMA plans (no GPU needed): resnet18's passes at batch 128 (and stage 4 at 512) on
// 132 SMs, the splits (by the model of waves and partials) covering K in whole 64-pixel steps,
// and the shapes it leaves alone.
TEST_CASE("conv TMA grad_weight plans: atoms, A's rows, splits (no GPU needed)") {
  auto shape = [](auto... a) { return wgrad_gemm_shape(a...); };
  auto plan = [](const cuda::ConvGemmShape& g, int max_stride = 2) {  // (without the halo form)
    return cuda::conv_tma_wgrad_plan_of(g, max_stride, 132, true, false);
  };
  struct Expected {
    cuda::ConvGemmShape g;
    int bm, atoms, ar, splits;
  };
  // (stage 1: tiles of one warpgroup, two blocks an SM: 86 splits of 3 tiles fill 264 slots)
  for (const Expected& e : {Expected{shape(128, 64, 32, 32, 64, 3, 1), 64, 3, 64, 86},
                            Expected{shape(128, 128, 16, 16, 128, 3, 1), 128, 3, 64, 22},
                            Expected{shape(128, 256, 8, 8, 256, 3, 1), 128, 4, 64, 7},
                            // 72 tiles: 2 splits would be two waves of 16 steps on 132 SMs, no
                            // quicker than one of 32, and twice the partials
                            Expected{shape(128, 512, 4, 4, 512, 3, 1), 128, 4, 16, 1},
                            // b512: 3 splits, two waves of 43 steps (2: two of 64)
                            Expected{shape(512, 512, 4, 4, 512, 3, 1), 128, 4, 16, 3},
                            // 36 tiles: 3 splits fill 108 SMs (4: two waves)
                            Expected{shape(512, 256, 4, 4, 512, 3, 2), 128, 4, 16, 3},
                            Expected{shape(128, 256, 4, 4, 512, 1, 2), 128, 4, 16, 8},
                            Expected{shape(3, 64, 8, 4, 64, 3, 1), 64, 3, 32, 1}}) {
    CAPTURE(e.g.n);
    CAPTURE(e.g.s_hw);
    const auto p = plan(e.g);
    REQUIRE(p.has_value());
    CHECK(p->bm == e.bm);
    CHECK(p->atoms == e.atoms);
    CHECK(p->ar == e.ar);
    CHECK(p->splits == e.splits);
    CHECK(p->wide);
    CHECK(p->chunk % 64 == 0);
    CHECK(static_cast<std::int64_t>(p->splits) * p->chunk >= e.g.k);     // K covered,
    CHECK(static_cast<std::int64_t>(p->splits - 1) * p->chunk < e.g.k);  // no split empty
    CHECK(p->shared_bytes() * p->per_sm <= 227 * 1024);
    CHECK(p->per_sm == (e.bm == 64 ? 2 : 1));
  }
  CHECK_FALSE(plan(shape(8, 96, 16, 16, 64, 3, 1)));     // 96 channels: not whole atoms
  CHECK_FALSE(plan(shape(8, 64, 12, 12, 64, 3, 1)));     // 144 pixels: steps straddle rows
  CHECK_FALSE(plan(shape(8, 64, 2, 128, 64, 3, 1)));     // a row wider than a step
  CHECK_FALSE(plan(shape(8, 64, 16, 16, 64, 9, 1)));     // 81 taps: past the sum's 64
  CHECK_FALSE(plan(shape(8, 64, 16, 16, 64, 3, 3)));     // stride 3
  CHECK_FALSE(plan(shape(8, 64, 16, 16, 64, 3, 2), 1));  // stride 2 turned off
  // the sum of the splits compiles, 16-bit and f32 (TF32's)
  for (DType dtype : {DType::bf16, DType::f16, DType::f32})
    CHECK(gpu::compile_to_cubin(cuda::conv_tma_wgrad_sum_source(dtype), {.sm = 90}).size() > 4);
}

// grad_weight's halo form (no GPU needed): stride-1 3x3 passes over 64 channels whose 64-pixel
// K steps are whole output rows of 8, 16 or 32 (resnet18's stage 1 at b512: 8192 steps in 131
// splits of 63, a block an SM), a box of 64 / OW + 2 rows a tap column, in at least three stages.
TEST_CASE("conv TMA grad_weight's halo form: where it fits (no GPU needed)") {
  auto shape = [](auto... a) { return wgrad_gemm_shape(a...); };
  struct Expected {
    cuda::ConvGemmShape g;
    int stages, splits;
  };
  for (const Expected& e : {Expected{shape(512, 64, 32, 32, 64, 3, 1, 1), 4, 131},
                            Expected{shape(8, 64, 16, 16, 200, 3, 1, 1), 4, 8},
                            Expected{shape(3, 64, 8, 8, 48, 3, 1, 1), 4, 1}}) {
    CAPTURE(e.g.s_w);
    const auto p = cuda::conv_tma_wgrad_plan_of(e.g, 2, 132, true);
    REQUIRE(p.has_value());
    CHECK(p->halo == e.g.s_w);
    CHECK(p->bm == 64);
    CHECK(p->atoms == 9);
    CHECK(p->stages == e.stages);
    CHECK(p->splits == e.splits);
    CHECK(p->threads() == 416);
    CHECK(p->shared_bytes() <= 227 * 1024);
    CHECK(p->stage_bytes() == static_cast<std::size_t>(64 + 3 * (64 + 2 * e.g.s_w)) * 128);
    CHECK(static_cast<std::int64_t>(p->splits) * p->chunk >= e.g.k);     // K covered,
    CHECK(static_cast<std::int64_t>(p->splits - 1) * p->chunk < e.g.k);  // no split empty
    // its kernel compiles for sm_90a, multiplying across the boxes or a box at a time
    for (bool wide : {true, false}) {
      cuda::TmaWgradPlan q = *p;
      q.wide = wide;
      CHECK(gpu::compile_to_cubin(cuda::conv_tma_wgrad_source(DType::bf16, q, true), {.sm = 90})
                .size() > 4);
    }
    // switched off: the nine taps' atoms
    const auto atoms = cuda::conv_tma_wgrad_plan_of(e.g, 2, 132, true, false);
    REQUIRE(atoms.has_value());
    CHECK(atoms->halo == 0);
  }
  // where it pays (the default): a wave's blocks of 32 steps or more: resnet18's stage 1 at b512
  // (63 steps a block on 132 SMs), not at b128 or b256 (16, 31); 200 filters (4 tiles) at b128
  CHECK(cuda::conv_tma_wgrad_halo_pays(shape(512, 64, 32, 32, 64, 3, 1, 1), 132));
  CHECK_FALSE(cuda::conv_tma_wgrad_halo_pays(shape(128, 64, 32, 32, 64, 3, 1, 1), 132));
  CHECK_FALSE(cuda::conv_tma_wgrad_halo_pays(shape(256, 64, 32, 32, 64, 3, 1, 1), 132));
  CHECK(cuda::conv_tma_wgrad_halo_pays(shape(128, 64, 32, 32, 200, 3, 1, 1), 132));
  // 128 channels, stride 2, a 5x5, rows of 4 or 64 pixels (64: two stages' room), 12x12 planes
  for (const cuda::ConvGemmShape& g :
       {shape(8, 128, 16, 16, 64, 3, 1, 1), shape(8, 64, 16, 16, 64, 3, 2, 1),
        shape(8, 64, 16, 16, 64, 5, 1, 2), shape(8, 64, 8, 4, 64, 3, 1, 1),
        shape(8, 64, 4, 64, 64, 3, 1, 1), shape(8, 64, 12, 12, 64, 3, 1, 1)}) {
    CAPTURE(g.n);
    CAPTURE(g.s_w);
    CHECK_FALSE(cuda::conv_tma_wgrad_halo_plan_of(g, 132, true));
  }
}

// f32's grad_weight plans under TF32 (no GPU needed): K steps of 32 pixels read from x's tap
// columns, B's rows a run of 32 pixels of an output row (OW a multiple of 32) or a whole row of
// 16 or 8; resnet18's 3x3 passes at b512 on 132 SMs (stride 1, and stride 2 into stages 2 and
// 3), a 5x5 whose output is wider than x, and the shapes it leaves alone.
TEST_CASE("conv TMA grad_weight plans under TF32: B's rows, splits (no GPU needed)") {
  auto shape = [](auto... a) { return wgrad_gemm_shape(a...); };
  struct Expected {
    cuda::ConvGemmShape g;
    int bm, atoms, br, ar = 32;
  };
  for (const Expected& e : {Expected{shape(512, 64, 32, 32, 64, 3, 1, 1), 64, 3, 32},
                            Expected{shape(512, 128, 16, 16, 128, 3, 1, 1), 128, 3, 16},
                            Expected{shape(512, 256, 8, 8, 256, 3, 1, 1), 128, 4, 8},
                            Expected{shape(2, 64, 8, 64, 200, 3, 1, 1), 128, 3, 32},
                            Expected{shape(1, 64, 6, 32, 64, 5, 1, 0), 64, 1, 32},
                            Expected{shape(512, 64, 16, 16, 128, 3, 2, 1), 128, 3, 16},
                            Expected{shape(512, 128, 8, 8, 256, 3, 2, 1), 128, 3, 8},
                            Expected{shape(512, 128, 8, 8, 256, 1, 2, 0), 128, 2, 8},
                            Expected{shape(8, 64, 14, 32, 64, 3, 1, 0), 64, 3, 32},
                            Expected{shape(8, 64, 4, 64, 64, 5, 1, 4), 64, 1, 32},
                            // whole images of 16 or 8 pixels at stride 1 (resnet18's stage 4)
                            Expected{shape(512, 512, 4, 4, 512, 3, 1, 1), 128, 4, 16, 16},
                            Expected{shape(3, 64, 2, 4, 64, 3, 1, 1), 64, 3, 8, 8},
                            Expected{shape(3, 64, 1, 16, 64, 5, 1, 2), 64, 1, 16, 16}}) {
    CAPTURE(e.g.n);
    CAPTURE(e.g.s_hw);
    const auto p = cuda::conv_tma_tf32_wgrad_plan_of(e.g, 132, true);
    REQUIRE(p.has_value());
    CHECK(p->bm == e.bm);
    CHECK(p->atoms == e.atoms);
    CHECK(p->br == e.br);
    CHECK(p->ar == e.ar);
    CHECK(p->chunk % 32 == 0);
    // x3's rows: x's, or for whole images x's with KH - 1 zero rows about them; its tap columns
    // all KW but the centre's where the output rows are as wide as x's at stride 1
    CHECK(cuda::tf32_tap_rows(e.g) == e.g.img_h + (e.g.s_hw < 32 ? e.g.khkw / e.g.kw - 1 : 0));
    const bool centre = e.g.stride == 1 && e.g.s_hw % 32 == 0 && e.g.img_w == e.g.s_w;
    CHECK(cuda::tf32_tap_columns(e.g) == e.g.kw - (centre ? 1 : 0));
    CHECK(static_cast<std::int64_t>(p->splits) * p->chunk >= e.g.k);     // K covered,
    CHECK(static_cast<std::int64_t>(p->splits - 1) * p->chunk < e.g.k);  // no split empty
    CHECK(p->shared_bytes() <= 227 * 1024);
  }
  auto plan = [](const cuda::ConvGemmShape& g) {
    return cuda::conv_tma_tf32_wgrad_plan_of(g, 132, true);
  };
  CHECK(cuda::tf32_tap_columns(shape(8, 64, 32, 32, 64, 1, 1, 0)) == 0);  // a 1x1: x itself
  CHECK_FALSE(plan(shape(512, 256, 4, 4, 512, 3, 2, 1)));  // images of 16 at stride 2
  CHECK_FALSE(plan(shape(8, 64, 2, 2, 64, 3, 1, 1)));      // rows of 2: x3's rows 8 bytes
  CHECK_FALSE(plan(shape(8, 64, 16, 16, 128, 3, 3, 1)));   // stride 3
  CHECK_FALSE(plan(shape(8, 64, 12, 12, 64, 3, 1, 1)));    // 144 pixels an image
  CHECK_FALSE(plan(shape(8, 64, 16, 24, 64, 3, 1, 1)));    // rows of 24: steps straddle them
  CHECK_FALSE(plan(shape(8, 96, 16, 16, 64, 3, 1, 1)));    // 96 channels: not whole atoms
}

// f32's weight gradient under TF32 by the TMA pass over x's tap columns against the CPU (TF32's
// 1e-2; the forward and input gradient as before): 1x1s first (boxes that start on 16 bytes
// without the tap columns too), B's rows of 16, 8 and 32 pixels (two runs a row of 64), 200
// filters (a partial tile), 256 channels (four atoms a tile), a 5x5 without padding (x wider than
// the output) and one whose padding makes the output wider than x, stride 2 (3x3, an odd 15x15
// image, a 1x1), whole images a block of B's rows at stride 1 (4x4 with 64 and 512 channels and
// an odd batch, 2x4 and 1x16 images, 5x5s whose taps reach two rows past x, a 1x1), one multiply
// across the atoms and one an atom; and shapes it leaves to the register-gather kernels (14x14
// outputs, 4x4 at stride 2) still right.
TEST_CASE("conv2d: TF32's weight gradient by TMA matches the CPU") {
  SKIP_WITHOUT_GPU();
  if (!cuda::conv_wgmma_enabled(DType::f32) || !env_switch_on("KILN_TF32_TMA_WGRAD"))
    return;  // sm_90 only, and not with KILN_TF32_TMA_WGRAD=0
  const AllowTf32 tf32;
  struct TensorCores {  // (the small passes too)
    TensorCores() { cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::tensor_cores); }
    ~TensorCores() {
      cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::automatic);
      cuda::detail::set_conv_tma_wide_for_testing(true);
    }
  } on;
  std::uint64_t seed = 2600;
  for (auto [xs, ws, stride, pad] : {std::tuple{Shape{2, 64, 8, 8}, Shape{64, 64, 1, 1}, 1, 0},
                                     std::tuple{Shape{2, 64, 32, 32}, Shape{64, 64, 1, 1}, 1, 0},
                                     std::tuple{Shape{2, 64, 16, 16}, Shape{64, 64, 3, 3}, 1, 1},
                                     std::tuple{Shape{3, 128, 8, 8}, Shape{128, 128, 3, 3}, 1, 1},
                                     std::tuple{Shape{2, 64, 32, 32}, Shape{200, 64, 3, 3}, 1, 1},
                                     std::tuple{Shape{1, 64, 8, 64}, Shape{64, 64, 3, 3}, 1, 1},
                                     std::tuple{Shape{2, 256, 8, 8}, Shape{64, 256, 3, 3}, 1, 1},
                                     std::tuple{Shape{2, 64, 8, 8}, Shape{64, 64, 1, 1}, 1, 0},
                                     std::tuple{Shape{1, 64, 10, 36}, Shape{64, 64, 5, 5}, 1, 0},
                                     std::tuple{Shape{2, 64, 16, 16}, Shape{64, 64, 3, 3}, 1, 0},
                                     std::tuple{Shape{1, 64, 4, 60}, Shape{64, 64, 5, 5}, 1, 4},
                                     std::tuple{Shape{2, 64, 16, 16}, Shape{128, 64, 3, 3}, 2, 1},
                                     std::tuple{Shape{2, 64, 15, 15}, Shape{64, 64, 3, 3}, 2, 1},
                                     std::tuple{Shape{3, 128, 16, 16}, Shape{128, 128, 1, 1}, 2, 0},
                                     std::tuple{Shape{3, 64, 4, 4}, Shape{64, 64, 3, 3}, 1, 1},
                                     std::tuple{Shape{2, 512, 4, 4}, Shape{512, 512, 3, 3}, 1, 1},
                                     std::tuple{Shape{3, 64, 2, 4}, Shape{64, 64, 3, 3}, 1, 1},
                                     std::tuple{Shape{3, 64, 1, 16}, Shape{64, 64, 5, 5}, 1, 2},
                                     std::tuple{Shape{2, 64, 4, 4}, Shape{128, 64, 5, 5}, 1, 2},
                                     std::tuple{Shape{3, 128, 4, 4}, Shape{64, 128, 1, 1}, 1, 0},
                                     std::tuple{Shape{2, 64, 8, 8}, Shape{64, 64, 3, 3}, 2, 1}}) {
    const kernels::ConvGeometry g = kernels::conv_geometry(xs, ws, stride, pad);
    bool by_tma = false;
    for (const gpu::KernelSource& k :
         cuda::conv_kernel_sources(g, DType::f32, cuda::ConvPass::grad_weight))
      by_tma = by_tma || k.name.rfind("kiln_conv_wgrad_tma_", 0) == 0;
    CAPTURE(xs.str());
    CAPTURE(ws.str());
    const int pixels = static_cast<int>(g.out_h * g.out_w), ow = static_cast<int>(g.out_w);
    CHECK(by_tma == ((pixels % 32 == 0 && ow >= 8) ||
                     (stride == 1 && (pixels == 16 || pixels == 8) && ow % 4 == 0)));
    for (bool wide : {true, false}) {
      cuda::detail::set_conv_tma_wide_for_testing(wide);
      check_conv(xs, ws, stride, pad, DType::f32, seed += 3, 0, -1, 1e-2);
    }
  }
}

// f32's forward and stride-1 input gradient under TF32 on the TMA pass (K steps of 32 channels,
// one 128-byte row) against the CPU at TF32's 1e-2, and which passes take it: 32 channels (a step
// a tap), 96 (three), 200 filters and an odd batch (partial tiles; the input gradient's image
// dy, 200 channels, is not whole steps), 64 filters (two teams), stride 2 (the forward; its
// input gradient keeps the dilated register-gather pass), an unpadded 3x3 (dx's 10x10 rows do
// not tile 128 pixels), a 5x5, and resnet18's stage 4 at batch 4 (too few tiles: K split across
// a cluster of two blocks).
TEST_CASE("conv2d: TF32's forward and input gradient by TMA match the CPU") {
  SKIP_WITHOUT_GPU();
  if (!cuda::conv_wgmma_enabled(DType::f32) || !env_switch_on("KILN_TF32_TMA") ||
      !env_switch_on("KILN_CONV_TMA"))
    return;  // sm_90 only, and not with KILN_TF32_TMA=0 or KILN_CONV_TMA=0
  const AllowTf32 tf32;
  std::uint64_t seed = 2900;
  struct Case {
    Shape xs, ws;
    std::int64_t stride, pad;
    bool input_gradient_by_tma;
  };
  for (const auto& [xs, ws, stride, pad, dx_by_tma] :
       {Case{{2, 32, 16, 16}, {64, 32, 3, 3}, 1, 1, true},
        Case{{2, 64, 32, 32}, {128, 64, 3, 3}, 1, 1, true},
        Case{{3, 96, 8, 8}, {200, 96, 3, 3}, 1, 1, false},
        Case{{2, 64, 16, 16}, {96, 64, 3, 3}, 1, 1, true},
        Case{{2, 64, 16, 16}, {64, 64, 3, 3}, 2, 1, false},
        Case{{2, 128, 10, 10}, {256, 128, 3, 3}, 1, 0, false},
        Case{{2, 64, 8, 8}, {64, 64, 5, 5}, 1, 2, true},
        Case{{4, 512, 4, 4}, {512, 512, 3, 3}, 1, 1, true}}) {
    const kernels::ConvGeometry g = kernels::conv_geometry(xs, ws, stride, pad);
    CAPTURE(xs.str());
    CAPTURE(ws.str());
    auto by_tma = [&](cuda::ConvPass pass) {
      for (const gpu::KernelSource& k : cuda::conv_kernel_sources(g, DType::f32, pass))
        if (k.name.rfind("kiln_conv_nhwc_tma_", 0) == 0) return true;
      return false;
    };
    CHECK(by_tma(cuda::ConvPass::forward));
    CHECK(by_tma(cuda::ConvPass::grad_input) == dx_by_tma);
    check_conv(xs, ws, stride, pad, DType::f32, seed += 3, 0, -1, 1e-2);
  }
}

// The TMA passes (conv_tma.h): the forward and grad_input where a tile is whole output rows or
// whole images, against the CPU and the wgmma tiles' bits; grad_weight where a K step of 64
// pixels is whole rows of one image (A's rows 64 pixels: the 128-byte swizzle) or whole images
// of 32 or 16 pixels (the 64- and 32-byte swizzles), with one multiply across a tile's atoms and
// one an atom, split and not, partial filter tiles and a last step past the batch. Shapes a pass
// does not fit fall back.
TEST_CASE("conv2d: the TMA channels-last passes match the CPU and the wgmma tiles' bits") {
  SKIP_WITHOUT_GPU();
  if (!cuda::conv_wgmma_enabled(DType::bf16)) return;  // sm_90 only
  struct TmaOn {
    TmaOn() {
      cuda::detail::set_conv_tma_for_testing(true);
      cuda::detail::set_conv_tma_split_for_testing(cuda::detail::TmaSplit::never);
      cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::tensor_cores);
    }
    ~TmaOn() {
      cuda::detail::set_conv_tma_for_testing(std::nullopt);
      cuda::detail::set_conv_tma_split_for_testing(std::nullopt);
      cuda::detail::set_conv_tma_wide_for_testing(true);
      cuda::detail::set_conv_tma_teams_for_testing(2);  // the default
      cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::automatic);
      cuda::detail::set_conv_wgrad_halo_for_testing(std::nullopt);
    }
  };
  std::uint64_t seed = 1300;
  // 16x16 (a tile of 16 rows), 8x8 (4 images a tile, the last tile past the batch), 32x32 with
  // a partial 128-filter tile, 4x4 (16 images a tile; grad_weight's K of 32 pixels in one step
  // of 4 images), a 1x1, 128 channels (atoms of a tile across taps), 8x4 images (grad_weight's
  // 32-pixel rows), 4x4 with 256 channels (four atoms a tile), stride 2 (3x3 and 1x1, an odd
  // 15x15 image whose last windows pass its edge and whose input gradient is the dilated pass;
  // on images of an even height and a width a multiple of 4 the input gradient by classes of
  // dx's pixels: 3x3 without padding, whose classes read outside dy, 5x5, 2x2, 1x1 with three
  // classes of zeros, 256 rows of dx; a width of 6, dilated); rows of 64 at stride 1 and by
  // classes of 32, and a 3x3 without padding; a 5x5 on 12x12 (no whole-row tile: the usual
  // kernels); and resnet18's stage-1 layer on 32x32 and 48 filters on 32x16 (the halo form, which
  // the first shape and the input gradient of the unpadded 3x3 take too); 1x1 filters over
  // 4096 pixels at stride 1 and 2 (grad_weight in 16 splits, two thread groups a sum of them).
  for (auto [xs, ws, stride, pad] :
       {std::tuple{Shape{2, 64, 16, 16}, Shape{64, 64, 3, 3}, 1, 1},
        std::tuple{Shape{3, 128, 8, 8}, Shape{128, 128, 3, 3}, 1, 1},
        std::tuple{Shape{2, 64, 32, 32}, Shape{200, 64, 3, 3}, 1, 1},
        std::tuple{Shape{2, 64, 4, 4}, Shape{64, 64, 3, 3}, 1, 1},
        std::tuple{Shape{2, 64, 8, 8}, Shape{64, 64, 1, 1}, 1, 0},
        std::tuple{Shape{2, 128, 16, 16}, Shape{128, 128, 3, 3}, 1, 1},
        std::tuple{Shape{3, 64, 8, 4}, Shape{64, 64, 3, 3}, 1, 1},
        std::tuple{Shape{5, 256, 4, 4}, Shape{256, 256, 3, 3}, 1, 1},
        std::tuple{Shape{2, 64, 32, 32}, Shape{128, 64, 3, 3}, 2, 1},
        std::tuple{Shape{3, 128, 16, 16}, Shape{256, 128, 1, 1}, 2, 0},
        std::tuple{Shape{3, 64, 15, 15}, Shape{64, 64, 3, 3}, 2, 1},
        std::tuple{Shape{2, 64, 8, 8}, Shape{64, 64, 3, 3}, 2, 0},
        std::tuple{Shape{1, 64, 16, 16}, Shape{64, 64, 5, 5}, 2, 2},
        std::tuple{Shape{3, 64, 8, 8}, Shape{128, 64, 2, 2}, 2, 0},
        std::tuple{Shape{2, 256, 8, 8}, Shape{64, 256, 3, 3}, 2, 1},
        std::tuple{Shape{2, 64, 8, 6}, Shape{64, 64, 3, 3}, 2, 1},
        std::tuple{Shape{1, 64, 8, 64}, Shape{64, 64, 3, 3}, 1, 1},
        std::tuple{Shape{1, 64, 16, 64}, Shape{64, 64, 3, 3}, 2, 1},
        std::tuple{Shape{2, 64, 16, 16}, Shape{64, 64, 3, 3}, 1, 0},
        std::tuple{Shape{1, 64, 12, 12}, Shape{64, 64, 5, 5}, 1, 2},
        std::tuple{Shape{2, 64, 32, 32}, Shape{64, 64, 3, 3}, 1, 1},
        std::tuple{Shape{2, 64, 32, 16}, Shape{48, 64, 3, 3}, 1, 1},
        std::tuple{Shape{3, 64, 8, 8}, Shape{64, 64, 3, 3}, 1, 1},
        std::tuple{Shape{16, 64, 16, 16}, Shape{128, 64, 1, 1}, 1, 0},
        std::tuple{Shape{64, 64, 16, 16}, Shape{128, 64, 1, 1}, 2, 0}}) {
    CAPTURE(xs.str());
    CAPTURE(ws.str());
    CAPTURE(stride);
    std::pair<Tensor, Tensor> tma, tma2, plain;
    {
      TmaOn on;
      // Stride 2, an even height and a width a multiple of 4: the input gradient by classes (the
      // TMA kernel of 4 classes).
      const kernels::ConvGeometry g = kernels::conv_geometry(xs, ws, stride, pad);
      bool by_classes = false;
      for (const gpu::KernelSource& k :
           cuda::conv_kernel_sources(g, DType::bf16, cuda::ConvPass::grad_input))
        by_classes = by_classes || k.name.find("_c4_") != std::string::npos;
      CHECK(by_classes == (stride == 2 && xs[2] % 2 == 0 && xs[3] % 4 == 0));
      // The halo form (two teams, the default): 64 channels, at most 64 filters, stride 1 and
      // tiles of whole rows of 16 or 32 pixels (the shapes here), forward and input gradient.
      auto takes_halo = [&](cuda::ConvPass pass) {
        bool halo = false;
        for (const gpu::KernelSource& k : cuda::conv_kernel_sources(g, DType::bf16, pass))
          halo = halo || k.name.find("_halo_") != std::string::npos;
        return halo;
      };
      auto fits_halo = [&](std::int64_t c, std::int64_t m, std::int64_t h, std::int64_t w) {
        return stride == 1 && c == 64 && m <= 64 && (w == 16 || w == 32) && h * w >= 128;
      };
      CHECK(takes_halo(cuda::ConvPass::forward) == fits_halo(xs[1], ws[0], g.out_h, g.out_w));
      CHECK(takes_halo(cuda::ConvPass::grad_input) == fits_halo(ws[0], xs[1], xs[2], xs[3]));
      // grad_weight's halo form (asked for: off by default): stride 1, a 3x3 over 64 channels, K
      // steps of whole rows of 8, 16 or 32 pixels (any filters: 200 in tiles of 64, 48 in a part
      // tile); and without it.
      cuda::detail::set_conv_wgrad_halo_for_testing(true);
      bool wgrad_halo = false;
      for (const gpu::KernelSource& k :
           cuda::conv_kernel_sources(g, DType::bf16, cuda::ConvPass::grad_weight))
        wgrad_halo = wgrad_halo || k.name.rfind("kiln_conv_wgrad_tma_64x576_s4_a64_halo", 0) == 0;
      CHECK(wgrad_halo ==
            (stride == 1 && xs[1] == 64 && ws[2] == 3 && ws[3] == 3 &&
             (g.out_w == 8 || g.out_w == 16 || g.out_w == 32) && g.out_h * g.out_w % 64 == 0));
      if (wgrad_halo) {
        cuda::detail::set_conv_wgrad_halo_for_testing(false);
        check_conv(xs, ws, stride, pad, DType::bf16, seed += 3, 0, -1, 1.5e-2);
        cuda::detail::set_conv_wgrad_halo_for_testing(true);
      }

      for (bool wide : {true, false}) {  // and the forward's teams: 1, then 2 (persistent)
        CAPTURE(wide);
        cuda::detail::set_conv_tma_wide_for_testing(wide);
        cuda::detail::set_conv_tma_teams_for_testing(wide ? 1 : 2, 3);  // 3 blocks: many tiles each
        check_conv(xs, ws, stride, pad, DType::bf16, seed += 3, 0, -1, 1.5e-2);
      }
      if (takes_halo(cuda::ConvPass::forward) || takes_halo(cuda::ConvPass::grad_input)) {
        cuda::detail::set_conv_tma_teams_for_testing(2, 0);  // a block an SM: at most a tile each
        check_conv(xs, ws, stride, pad, DType::bf16, seed += 3, 0, -1, 1.5e-2);
        cuda::detail::set_conv_tma_teams_for_testing(2, 3);
      }
      // K split over a cluster of two blocks (the 128-filter tiles; others as before): the
      // CPU's result, whatever the tile count.
      cuda::detail::set_conv_tma_split_for_testing(cuda::detail::TmaSplit::always);
      check_conv(xs, ws, stride, pad, DType::bf16, seed += 3, 0, -1, 1.5e-2);
      cuda::detail::set_conv_tma_split_for_testing(cuda::detail::TmaSplit::never);
      tma2 = nhwc_outputs(cuda::kWgmmaCandidates[0], xs, ws, stride, seed);
      cuda::detail::set_conv_tma_teams_for_testing(1);
      tma = nhwc_outputs(cuda::kWgmmaCandidates[0], xs, ws, stride, seed);
    }
    cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::tensor_cores);
    plain = nhwc_outputs(cuda::kWgmmaCandidates[0], xs, ws, stride, seed);
    cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::automatic);
    check_identical(tma.first, plain.first);
    check_identical(tma.second, plain.second);
    check_identical(tma2.first, plain.first);
    check_identical(tma2.second, plain.second);
  }
}

// Sizing a pass times its candidates once (gpu/autotune.h); the fastest is kept and used, and
// the result is still the CPU's: the channels-last forward and grad_input, and grad_weight.
TEST_CASE("conv2d: each tensor-core pass is tuned once, keeps the fastest tile, matches the CPU") {
  SKIP_WITHOUT_GPU();
  if (!gpu::autotune_enabled()) return;  // KILN_AUTOTUNE=0
  cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::tensor_cores);
  const std::size_t before = gpu::tuning_decisions().size();
  check_conv({3, 24, 8, 12}, {40, 24, 3, 3}, 1, 1, DType::bf16, 950, 0, -1, 1.5e-2);
  const std::vector<gpu::TuningRecord> decisions = gpu::tuning_decisions();
  REQUIRE(decisions.size() == before + 3);  // forward, grad_input and grad_weight, once each
  for (std::size_t i = before; i < decisions.size(); ++i) {
    const gpu::TuningRecord& r = decisions[i];
    CAPTURE(r.problem);
    const bool wgrad = r.problem.rfind("conv_wgrad bf16 m40 ", 0) == 0;
    CHECK((wgrad || r.problem.rfind("conv_nhwc fwd bf16 m", 0) == 0));
    CHECK(r.problem.find(" code ") != std::string::npos);  // the candidates' sources digested
    REQUIRE(r.us.size() == (wgrad ? cuda::wgrad_candidates(DType::bf16).size()
                                  : cuda::nhwc_candidates(DType::bf16).size()));
    for (double us : r.us) CHECK(us > 0);
    CHECK(*std::min_element(r.us.begin(), r.us.end()) == r.us[static_cast<std::size_t>(r.chosen)]);
  }
  check_conv({3, 24, 8, 12}, {40, 24, 3, 3}, 1, 1, DType::bf16, 960, 0, -1, 1.5e-2);
  CHECK(gpu::tuning_decisions().size() == before + 3);  // nothing timed again
  cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::automatic);
}

namespace {

// dW of one convolution on the tensor cores (bf16, or f32 under TF32), gathering the patches
// as 16-byte runs or not (used_runs: whether the pass's kernel gathers runs; mma: whether it is
// a tensor-core kernel at all).
Tensor mma_grad_weight(bool runs, const Shape& xs, const Shape& ws, std::int64_t padding,
                       std::uint64_t seed, bool* used_runs = nullptr, DType dtype = DType::bf16,
                       bool* mma = nullptr) {
  cuda::detail::set_wgrad_runs_for_testing(runs);
  const kernels::ConvGeometry g = kernels::conv_geometry(xs, ws, 1, padding);
  const Shape ys{g.batch, g.out_channels, g.out_h, g.out_w};
  const Tensor x = random_tensor(xs, dtype, seed), dy = random_tensor(ys, dtype, seed + 2);
  const std::size_t bytes = cuda::conv_workspace_bytes(g, dtype, cuda::ConvPass::grad_weight);
  bool uses_runs = false, uses_mma = false;
  for (const gpu::KernelSource& k :
       cuda::conv_kernel_sources(g, dtype, cuda::ConvPass::grad_weight)) {
    uses_runs = uses_runs || k.name.find("_runs") != std::string::npos;
    uses_mma = uses_mma || k.name.rfind("kiln_conv_mma_wgrad_", 0) == 0;
  }
  if (used_runs) *used_runs = uses_runs;
  if (mma) *mma = uses_mma;
  DeviceBuffer dx(x), ddy(dy), work(bytes), dw(ws.numel() * dtype_size(dtype));
  cuda::conv2d_grad_weight(dtype, g, dx.get(), ddy.get(), dw.get(), {work.get(), bytes}, nullptr);
  cuda::detail::set_wgrad_runs_for_testing(true);
  return dw.download(ws, dtype);
}

}  // namespace

// grad_weight's patches as 16-byte runs (stride 1, widths multiples of 8): against the CPU (every
// pass, through check_conv) and bit for bit against the scalar gather, at paddings that shift
// runs across pieces (5x5 at 2, 1x17 at 8: a piece wholly left of the row), 3 channels (27 patch
// rows), 136 filters (a partial 128-row tile), 1x1, and a batch of 1.
TEST_CASE("conv2d: grad_weight's 16-byte patch runs equal the scalar gather and the CPU") {
  SKIP_WITHOUT_GPU();
  cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::tensor_cores);
  std::uint64_t seed = 1000;
  for (auto [xs, ws, padding] : {std::tuple{Shape{3, 16, 8, 16}, Shape{24, 16, 3, 3}, 1},
                                 std::tuple{Shape{2, 8, 16, 8}, Shape{136, 8, 5, 5}, 2},
                                 std::tuple{Shape{2, 3, 16, 16}, Shape{64, 3, 3, 3}, 1},
                                 std::tuple{Shape{1, 16, 8, 24}, Shape{16, 16, 1, 1}, 0},
                                 std::tuple{Shape{4, 8, 10, 16}, Shape{16, 8, 3, 3}, 1},
                                 std::tuple{Shape{1, 8, 8, 16}, Shape{8, 8, 1, 17}, 8}}) {
    CAPTURE(xs.str());
    CAPTURE(ws.str());
    check_conv(xs, ws, 1, padding, DType::bf16, seed += 3, 0, -1, 1.5e-2);
    for (DType dtype : {DType::bf16, DType::f32}) {  // f32: TF32's runs of 4 pixels
      CAPTURE(dtype_name(dtype));
      std::optional<AllowTf32> tf32;
      if (dtype == DType::f32) tf32.emplace();
      bool with_runs = false, without = true, mma = false;
      check_identical(mma_grad_weight(true, xs, ws, padding, seed, &with_runs, dtype, &mma),
                      mma_grad_weight(false, xs, ws, padding, seed, &without, dtype));
      CHECK(mma);
      CHECK(with_runs);  // else the comparison proves nothing
      CHECK_FALSE(without);
    }
  }
  cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::automatic);
}

// Every weight-gradient tile the tuner may choose, in bf16 and in f32 under TF32 (its steps half
// the pixels): against the CPU (every pass, check_conv), and the same bits as the default tile,
// split or not, scalar gather or runs.
TEST_CASE("conv2d: every grad_weight tuning candidate gives the same bits, and the CPU's values") {
  SKIP_WITHOUT_GPU();
  cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::tensor_cores);
  std::uint64_t seed = 1100;
  for (auto [xs, ws, padding] : {std::tuple{Shape{3, 16, 8, 16}, Shape{136, 16, 3, 3}, 1},
                                 std::tuple{Shape{2, 3, 9, 7}, Shape{40, 3, 3, 3}, 1},
                                 std::tuple{Shape{64, 8, 8, 8}, Shape{24, 8, 3, 3}, 1}}) {
    CAPTURE(xs.str());
    seed += 3;
    for (DType dtype : {DType::bf16, DType::f32}) {
      std::optional<AllowTf32> tf32;
      if (dtype == DType::f32) tf32.emplace();
      const double tolerance = dtype == DType::f32 ? 1e-2 : 1.5e-2;
      for (bool wgmma : {false, true}) {  // each family against its own default (wgmma: sm_90)
        if (wgmma && !cuda::conv_wgmma_enabled(dtype)) continue;
        cuda::detail::force_wgrad_tile_for_testing(wgmma
                                                       ? cuda::conv_wgmma_wgrad_default_tile(ws[0])
                                                       : cuda::conv_mma_wgrad_default_tile(ws[0]));
        bool mma = false;
        const Tensor first = mma_grad_weight(true, xs, ws, padding, seed, nullptr, dtype, &mma);
        CHECK(mma);
        const std::span<const cuda::WgradTile> family =
            wgmma ? std::span<const cuda::WgradTile>(cuda::kWgmmaWgradCandidates)
                  : std::span<const cuda::WgradTile>(cuda::kWgradCandidates);
        for (const cuda::WgradTile& tile : family) {
          CAPTURE(cuda::conv_mma_wgrad_name(dtype, tile, true, false));
          cuda::detail::force_wgrad_tile_for_testing(tile);
          check_identical(mma_grad_weight(true, xs, ws, padding, seed, nullptr, dtype), first);
          check_conv(xs, ws, 1, padding, dtype, seed + 1, 0, -1, tolerance);
        }
      }
    }
  }
  cuda::detail::force_wgrad_tile_for_testing(std::nullopt);
  cuda::detail::set_conv_algo_for_testing(cuda::detail::ConvAlgo::automatic);
}

namespace {

// One f32 pass on the CUDA cores in `tile` (forced, with `splits` for grad_weight), its output.
Tensor igemm_pass(cuda::ConvPass pass, cuda::IgemmTile tile, std::int64_t splits, const Shape& xs,
                  const Shape& ws, std::int64_t stride, std::uint64_t seed) {
  cuda::detail::set_conv_tiling_for_testing(
      pass, {tile.bm, tile.bn, tile.kg, splits, tile.ks, tile.tm, tile.tn});
  const kernels::ConvGeometry g = kernels::conv_geometry(xs, ws, stride, 1);
  const Shape ys{g.batch, g.out_channels, g.out_h, g.out_w};
  const Tensor x = random_tensor(xs, DType::f32, seed), w = random_tensor(ws, DType::f32, seed + 1),
               dy = random_tensor(ys, DType::f32, seed + 2);
  const std::size_t bytes = cuda::conv_workspace_bytes(g, DType::f32, pass);
  DeviceBuffer dx(x), dw(w), ddy(dy), work(bytes);
  const cuda::ConvWorkspace workspace{work.get(), bytes};
  Tensor out;
  if (pass == cuda::ConvPass::forward) {
    DeviceBuffer y(ys.numel() * 4);
    cuda::conv2d_forward(DType::f32, g, dx.get(), dw.get(), y.get(), workspace, nullptr);
    out = y.download(ys, DType::f32);
  } else if (pass == cuda::ConvPass::grad_input) {
    DeviceBuffer o(xs.numel() * 4);
    cuda::conv2d_grad_input(DType::f32, g, ddy.get(), dw.get(), o.get(), workspace, nullptr);
    out = o.download(xs, DType::f32);
  } else {
    DeviceBuffer o(ws.numel() * 4);
    cuda::conv2d_grad_weight(DType::f32, g, dx.get(), ddy.get(), o.get(), workspace, nullptr);
    out = o.download(ws, DType::f32);
  }
  cuda::detail::set_conv_tiling_for_testing(pass, {});
  return out;
}

}  // namespace

// Every CUDA-core tile the tuner may choose for a pass sums in the default tile's order (the
// same thread groups, K step and splits), so it gives the default's bits: f32, each pass, tiles
// that divide nothing (37 filters, 7-wide images), grad_weight split in 3.
TEST_CASE("conv2d: every implicit-GEMM tuning candidate gives the default tile's bits") {
  SKIP_WITHOUT_GPU();
  const Shape xs{3, 5, 9, 7}, ws{37, 5, 3, 3};
  const kernels::ConvGeometry g = kernels::conv_geometry(xs, ws, 1, 1);
  std::uint64_t seed = 1200;
  for (cuda::ConvPass pass :
       {cuda::ConvPass::forward, cuda::ConvPass::grad_input, cuda::ConvPass::grad_weight}) {
    const bool wgrad = pass == cuda::ConvPass::grad_weight;
    const cuda::IgemmMode mode = pass == cuda::ConvPass::forward ? cuda::IgemmMode::forward
                                 : pass == cuda::ConvPass::grad_input
                                     ? cuda::IgemmMode::grad_input
                                     : cuda::IgemmMode::grad_weight;
    const std::int64_t m = pass == cuda::ConvPass::grad_input ? g.in_channels : g.out_channels;
    const std::int64_t n = wgrad ? g.in_channels * 9
                                 : g.batch * (pass == cuda::ConvPass::forward ? g.out_h * g.out_w
                                                                              : g.height * g.width);
    const cuda::IgemmTile base = cuda::igemm_choose_tile(mode, DType::f32, m, n);
    const Tensor want = igemm_pass(pass, base, wgrad ? 3 : 0, xs, ws, 1, seed += 3);
    int compared = 0;
    for (const cuda::IgemmTile& t : cuda::kIgemmCandidates) {
      if (t.kg != base.kg || t.ks != base.ks || !cuda::igemm_tile_valid(t, DType::f32)) continue;
      CAPTURE(static_cast<int>(pass));
      CAPTURE(t.bm);
      CAPTURE(t.bn);
      CAPTURE(t.tm);
      CAPTURE(t.tn);
      check_identical(igemm_pass(pass, t, wgrad ? 3 : 0, xs, ws, 1, seed), want);
      ++compared;
    }
    CHECK(compared >= 3);  // the default and at least two others
  }
}

// The tuner's candidate lists, on any machine: every tile has a kernel, the default tiles are
// candidates, and every implicit-GEMM list starts with its default and keeps its thread groups
// and K step (the order of the sums), so a choice never changes a result's bits.
TEST_CASE("conv tuning: every candidate is a valid tile that sums in its default's order") {
  for (const cuda::NhwcTile& t : cuda::kNhwcCandidates) CHECK(cuda::nhwc_tile_valid(t));
  for (const cuda::NhwcTile& t : cuda::kNhwcTiles)
    CHECK(std::find(std::begin(cuda::kNhwcCandidates), std::end(cuda::kNhwcCandidates), t) !=
          std::end(cuda::kNhwcCandidates));
  for (const cuda::NhwcTile& t : cuda::kWgmmaCandidates)
    CHECK((t.wgmma && cuda::nhwc_tile_valid(t)));
  for (const cuda::NhwcTile& t : cuda::kWgmmaTiles)
    CHECK(std::find(std::begin(cuda::kWgmmaCandidates), std::end(cuda::kWgmmaCandidates), t) !=
          std::end(cuda::kWgmmaCandidates));
  CHECK_FALSE(cuda::nhwc_tile_valid({128, 128, 1, 1, 8, 4, true}));  // bm is 64 per warpgroup
  CHECK_FALSE(cuda::nhwc_tile_valid({64, 96, 1, 1, 8, 4, true}));    // no m64n96 instruction
  CHECK_FALSE(cuda::nhwc_tile_valid({64, 64, 1, 1, 4, 4, true}));    // 128-byte rows only
  for (const cuda::WgradTile& t : cuda::kWgradCandidates) CHECK(cuda::wgrad_tile_valid(t));
  for (const cuda::WgradTile& t : cuda::kWgmmaWgradCandidates)
    CHECK((t.wgmma && cuda::wgrad_tile_valid(t)));
  for (std::int64_t m : {64, 128})
    CHECK(std::find(std::begin(cuda::kWgmmaWgradCandidates), std::end(cuda::kWgmmaWgradCandidates),
                    cuda::conv_wgmma_wgrad_default_tile(m)) !=
          std::end(cuda::kWgmmaWgradCandidates));
  for (std::int64_t m : {64, 128})
    CHECK(std::find(std::begin(cuda::kWgradCandidates), std::end(cuda::kWgradCandidates),
                    cuda::conv_mma_wgrad_default_tile(m)) != std::end(cuda::kWgradCandidates));
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (cuda::IgemmMode mode :
         {cuda::IgemmMode::forward, cuda::IgemmMode::grad_input, cuda::IgemmMode::grad_weight})
      for (const cuda::IgemmTile& base : cuda::igemm_tiles(mode, dtype)) {
        const std::vector<cuda::IgemmTile> tiles = cuda::igemm_candidates(base, dtype);
        REQUIRE(!tiles.empty());
        CHECK(tiles.front() == base);
        for (const cuda::IgemmTile& t : tiles) {
          CHECK(cuda::igemm_tile_valid(t, dtype));
          CHECK(t.kg == base.kg);
          CHECK(t.ks == base.ks);
        }
      }
}

TEST_CASE("conv2d: a workspace smaller than the batch is processed in chunks") {
  SKIP_WITHOUT_GPU();
  check_conv({7, 3, 9, 8}, {4, 3, 3, 3}, 2, 1, DType::f32, 400, 1);
  check_conv({7, 3, 9, 8}, {4, 3, 3, 3}, 1, 1, DType::f32, 410, 3);
  check_conv({7, 3, 9, 8}, {4, 3, 3, 3}, 1, 1, DType::f64, 420, 2);
}

TEST_CASE("conv2d: a workspace too small for one image is a kiln::Error (im2col passes)") {
  SKIP_WITHOUT_GPU();
  const auto strided =
      kernels::conv_geometry({2, 3, 9, 8}, {4, 3, 3, 3}, 2, 1);  // dy: [2, 4, 5, 4]
  DeviceBuffer dy(2 * 4 * 5 * 4 * 4), w(4 * 3 * 9 * 4), dx(2 * 3 * 9 * 8 * 4), work(256);
  CHECK_THROWS_AS(cuda::conv2d_grad_input(DType::f32, strided, dy.get(), w.get(), dx.get(),
                                          {work.get(), 256}, nullptr),
                  Error);
  const auto g = kernels::conv_geometry({2, 3, 9, 8}, {4, 3, 3, 3}, 1, 1);
  DeviceBuffer x(2 * 3 * 9 * 8 * 4), y(2 * 4 * 9 * 8 * 4);
  ForceIm2col im2col;
  CHECK_THROWS_AS(
      cuda::conv2d_forward(DType::f32, g, x.get(), w.get(), y.get(), {work.get(), 256}, nullptr),
      Error);
}

TEST_CASE("conv2d: the im2col + cuBLAS fallback on LeNet's convolutions") {
  SKIP_WITHOUT_GPU();
  ForceIm2col im2col;
  check_conv({64, 1, 28, 28}, {32, 1, 3, 3}, 1, 1, DType::f32, 40);
  check_conv({64, 32, 14, 14}, {64, 32, 3, 3}, 1, 1, DType::f32, 45);
  check_conv({3, 2, 7, 5}, {4, 2, 3, 3}, 2, 1, DType::f64, 47);
}

TEST_CASE(
    "conv2d: every implicit-GEMM tile, K past one table chunk, forced and scratch-limited splits") {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 900;
  const auto tiles = tiles_to_test();
  preload_tiles(tiles);
  for (const auto& [tile, dtype] : tiles) {
    REQUIRE(cuda::igemm_tile_valid(tile, dtype));
    CAPTURE(tile.bm);
    CAPTURE(tile.bn);
    CAPTURE(tile.kg);
    CAPTURE(tile.ks);
    CAPTURE(tile.tm);
    CAPTURE(tile.tn);
    const cuda::detail::ConvTiling t{tile.bm, tile.bn, tile.kg, 0, tile.ks, tile.tm, tile.tn};
    ForceTiling force(t, t, t);
    check_conv({3, 16, 9, 7}, {20, 16, 3, 3}, 1, 1, dtype, seed += 3);
    check_conv({2, 17, 9, 6}, {70, 17, 3, 2}, 1, 2, dtype, seed += 3);  // grad_input's padding < 0
    check_conv({2, 16, 8, 9}, {18, 16, 3, 3}, 2, 0, dtype, seed += 3);
  }
  // K = Cin*9 = 1179 (forward) and Cout*9 = 1188 (grad_input): more than one table chunk.
  check_conv({2, 131, 5, 4}, {132, 131, 3, 3}, 1, 1, DType::f32, 950);
  check_conv({2, 61, 5, 4}, {62, 61, 3, 3}, 1, 1, DType::f64, 951);
  for (std::int64_t splits : {1, 2, 7, 1000}) {  // grad_weight's K = 3*20*20 = 1200, 38 steps of 32
    CAPTURE(splits);
    ForceTiling force({}, {}, {0, 0, 0, splits});
    check_conv({3, 16, 20, 20}, {16, 16, 3, 3}, 1, 1, DType::f32,
               960 + static_cast<std::uint64_t>(splits));
  }
  // Less scratch than the 38 wanted [16, 144] partials (9216 bytes each) need: 0 and 5000
  // bytes mean one split straight into dW; 40000 bytes hold 4 partials, 200000 bytes 21 (19
  // splits).
  for (std::int64_t bytes : {0, 5000, 40000, 200000}) {
    CAPTURE(bytes);
    check_conv({3, 16, 20, 20}, {16, 16, 3, 3}, 1, 1, DType::f32,
               970 + static_cast<std::uint64_t>(bytes), 0, bytes);
  }
}

TEST_CASE("conv2d: the implicit GEMM is bitwise repeatable") {
  SKIP_WITHOUT_GPU();
  const auto g = kernels::conv_geometry({16, 32, 14, 14}, {64, 32, 3, 3}, 1, 1);
  const Tensor x = random_tensor({16, 32, 14, 14}, DType::f32, 980),
               dy = random_tensor({16, 64, 14, 14}, DType::f32, 981);
  const std::size_t bytes = cuda::conv_workspace_bytes(g, DType::f32, cuda::ConvPass::grad_weight);
  DeviceBuffer dx(x), ddy(dy), work(bytes), dw1(64 * 288 * 4), dw2(64 * 288 * 4);
  cuda::conv2d_grad_weight(DType::f32, g, dx.get(), ddy.get(), dw1.get(), {work.get(), bytes},
                           nullptr);
  cuda::conv2d_grad_weight(DType::f32, g, dx.get(), ddy.get(), dw2.get(), {work.get(), bytes},
                           nullptr);
  check_identical(dw2.download({64, 288}, DType::f32), dw1.download({64, 288}, DType::f32));
}

namespace {

// Pooling x: integers in [0, 4) when `ties` (many equal maxima), some NaNs when `nans`.
Tensor pool_input(const Shape& shape, DType dtype, std::uint64_t seed, bool ties, bool nans) {
  Tensor x = random_tensor(shape, dtype, seed, 0, ties ? 4 : 1);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    double v = x.at(i);
    if (ties) v = std::floor(v);
    if (nans && i % 37 == 5) v = NAN;
    if (dtype == DType::f32)
      x.data<float>()[i] = static_cast<float>(v);
    else
      x.data<double>()[i] = v;
  }
  return x;
}

void check_pool(const Shape& xs, std::int64_t kernel, std::int64_t stride, DType dtype,
                std::uint64_t seed, bool ties, bool nans, std::int64_t padding = 0) {
  CAPTURE(xs.str());
  CAPTURE(kernel);
  CAPTURE(stride);
  CAPTURE(padding);
  CAPTURE(ties);
  CAPTURE(nans);
  const kernels::PoolGeometry g = kernels::pool_geometry(xs, kernel, stride, padding);
  const Shape ys{xs[0], xs[1], g.out_h, g.out_w};
  const Tensor x = pool_input(xs, dtype, seed, ties, nans);
  const Tensor dy = random_tensor(ys, dtype, seed + 1), gin = random_tensor(xs, dtype, seed + 2);
  Tensor y_ref = Tensor::empty(ys, dtype), dx_ref = Tensor::empty(xs, dtype),
         sel_ref = Tensor::empty(ys, dtype);
  kernels::max_pool2d_forward(x, y_ref, g);
  kernels::max_pool2d_backward(x, dy, dx_ref, g);
  kernels::max_pool2d_select(x, gin, sel_ref, g);
  DeviceBuffer dx(x), ddy(dy), dg(gin), y(y_ref.nbytes()), dxo(dx_ref.nbytes()),
      sel(sel_ref.nbytes());
  cuda::max_pool2d_forward(dtype, g, dx.get(), y.get(), nullptr);
  cuda::max_pool2d_grad(dtype, g, dx.get(), ddy.get(), dxo.get(), nullptr);
  cuda::max_pool2d_select(dtype, g, dx.get(), dg.get(), sel.get(), nullptr);
  check_identical(y.download(ys, dtype), y_ref);
  check_identical(dxo.download(xs, dtype), dx_ref);
  check_identical(sel.download(ys, dtype), sel_ref);
  // relu=1 over x - 1: maxima positive, zero, negative and NaN (no infinite dy: 0 times it is a
  // NaN whose bits differ between the GPU and the CPU)
  Tensor signed_x = x.clone();
  for (std::int64_t i = 0; i < x.numel(); ++i)
    if (dtype == DType::f32)
      signed_x.data<float>()[i] -= 1.0f;
    else
      signed_x.data<double>()[i] -= 1.0;
  Tensor relu_ref = Tensor::empty(xs, dtype);
  kernels::max_pool2d_backward(signed_x, dy, relu_ref, g, /*relu=*/true);
  DeviceBuffer dsx(signed_x), relu_dx(relu_ref.nbytes());
  cuda::max_pool2d_grad(dtype, g, dsx.get(), ddy.get(), relu_dx.get(), nullptr, true);
  check_identical(relu_dx.download(xs, dtype), relu_ref);
}

}  // namespace

TEST_CASE("max_pool2d: LeNet's pools, exactly as the CPU") {
  SKIP_WITHOUT_GPU();
  check_pool({64, 32, 28, 28}, 2, 2, DType::f32, 50, false, false);
  check_pool({64, 64, 14, 14}, 2, 2, DType::f32, 60, false, false);
}

TEST_CASE("max_pool2d: odd sizes, overlapping and gapped windows, ties, NaNs, f64") {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 500;
  for (DType dtype : {DType::f32, DType::f64})
    for (auto [kernel, stride] : {std::pair{2, 2}, {3, 2}, {3, 1}, {2, 3}, {1, 1}, {5, 5}})
      for (int variant = 0; variant < 3; ++variant)
        check_pool({3, 2, 7, 5}, kernel, stride, dtype, seed += 3, variant >= 1, variant == 2);
  check_pool({2, 3, 11, 13}, 3, 2, DType::f32, 600, true, false);
}

TEST_CASE("max_pool2d with padding (padded cells never win), exactly as the CPU") {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 700;
  for (DType dtype : {DType::f32, DType::f64})
    for (auto [kernel, stride, padding] :
         {std::tuple{3, 1, 1}, {3, 2, 1}, {2, 2, 1}, {5, 2, 2}, {4, 3, 2}, {2, 1, 1}})
      for (int variant = 0; variant < 3; ++variant)
        check_pool({3, 2, 7, 5}, kernel, stride, dtype, seed += 3, variant >= 1, variant == 2,
                   padding);
  check_pool({64, 32, 14, 14}, 3, 1, DType::f32, 800, false, false, 1);  // Inception's pool branch
  // The gradient over whole planes a block (as many as leave 512 blocks, at most as fit):
  // 1101 planes of 5x5, 2 a block, the last block partial, ties; 3x3 stride 2 over 28x28
  // (Inception's stem pool), 5 a block (as many as fit), the last partial, NaNs; f64 over
  // 3x4 planes, one a block; a plane over 4096 cells takes the gather from global memory.
  check_pool({1, 1101, 5, 5}, 3, 1, DType::f32, 810, true, false, 1);
  check_pool({1, 3001, 28, 28}, 3, 2, DType::f32, 815, true, true, 1);
  check_pool({3, 4, 28, 28}, 3, 2, DType::f64, 820, true, true, 1);
  check_pool({1, 2, 70, 65}, 3, 1, DType::f32, 830, true, false, 1);
}

namespace {

void check_avg_pool(const Shape& xs, std::int64_t kernel, std::int64_t stride, std::int64_t padding,
                    DType dtype, std::uint64_t seed) {
  CAPTURE(xs.str());
  CAPTURE(kernel);
  CAPTURE(stride);
  CAPTURE(padding);
  const kernels::PoolGeometry g = kernels::pool_geometry(xs, kernel, stride, padding);
  const Shape ys{xs[0], xs[1], g.out_h, g.out_w};
  const Tensor x = random_tensor(xs, dtype, seed), dy = random_tensor(ys, dtype, seed + 1);
  Tensor y_ref = Tensor::empty(ys, dtype), dx_ref = Tensor::empty(xs, dtype);
  kernels::avg_pool2d_forward(x, y_ref, g);
  kernels::avg_pool2d_backward(dy, dx_ref, g);
  DeviceBuffer dx(x), ddy(dy), y(y_ref.nbytes()), dxo(dx_ref.nbytes());
  cuda::avg_pool2d_forward(dtype, g, dx.get(), y.get(), nullptr);
  cuda::avg_pool2d_grad(dtype, g, ddy.get(), dxo.get(), nullptr);
  // The same sums in the same order as the CPU; a tolerance only for the compiler's freedom.
  const double rtol = dtype == DType::f32 ? 1e-6 : 1e-14;
  CHECK(gemm_closeness(y.download(ys, dtype), y_ref, rtol) <= 1.0);
  CHECK(gemm_closeness(dxo.download(xs, dtype), dx_ref, rtol) <= 1.0);
}

}  // namespace

TEST_CASE("avg_pool2d forward and gradient match the CPU (padding, overlap, gaps, f64)") {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 900;
  for (DType dtype : {DType::f32, DType::f64})
    for (auto [kernel, stride, padding] :
         {std::tuple{2, 2, 0}, {3, 1, 1}, {3, 2, 1}, {2, 3, 0}, {5, 2, 2}, {7, 1, 0}, {1, 1, 0}})
      check_avg_pool({3, 2, 7, 9}, kernel, stride, padding, dtype, seed += 2);
  check_avg_pool({64, 64, 14, 14}, 3, 1, 1, DType::f32, 990);
  check_avg_pool({64, 128, 7, 7}, 7, 1, 0, DType::f32, 995);
}

namespace {

void check_transpose(const Shape& xs, const std::vector<std::int64_t>& perm, DType dtype,
                     std::uint64_t seed) {
  CAPTURE(xs.str());
  CAPTURE(dtype_name(dtype));
  std::vector<std::int64_t> out;
  for (std::int64_t p : perm) out.push_back(xs[static_cast<std::size_t>(p)]);
  const Tensor x = random_tensor(xs, DType::f64, seed, 0, 100).to(dtype);  // integers via f64
  Attrs attrs;
  attrs.set("perm", perm);
  const Tensor ref = cpu_op("transpose", attrs, {x}, Shape(out), dtype);
  DeviceBuffer dx(x), dy(ref.nbytes());
  cuda::transpose(dtype, xs, perm, dx.get(), dy.get(), nullptr);
  check_identical(dy.download(ref.shape(), dtype), ref);
}

}  // namespace

TEST_CASE("transpose: permutations of rank 1 to 8, size-1 axes, every element size") {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 700;
  for (DType dtype : {DType::f32, DType::f64, DType::i64, DType::i32, DType::u8}) {
    check_transpose({17}, {0}, dtype, seed++);
    check_transpose({7, 5}, {1, 0}, dtype, seed++);
    check_transpose({64, 3136}, {1, 0}, dtype, seed++);
    check_transpose({3, 1, 5, 4}, {2, 0, 3, 1}, dtype, seed++);
    check_transpose({4, 6, 5}, {1, 0, 2}, dtype, seed++);
    check_transpose({2, 3, 4, 5, 6}, {4, 2, 0, 3, 1}, dtype, seed++);
    check_transpose({2, 3, 4, 5, 6}, {0, 1, 2, 3, 4}, dtype, seed++);
    check_transpose({2, 1, 3, 2, 2, 3, 1, 2}, {7, 5, 3, 1, 0, 2, 4, 6}, dtype, seed++);
  }
}

// The channels-last copy of 16-bit images in both forms (kernels/nhwc_copy.cuh): the wide one
// where channels and planes are multiples of 8 (multi-image warps for small planes, channel
// counts that leave lanes idle), the tiled one elsewhere and where a pointer is not 16-byte
// aligned; each against the CPU's transpose, bit for bit.
TEST_CASE("transpose: the channels-last copy of 16-bit images, wide and tiled, equals the CPU") {
  SKIP_WITHOUT_GPU();
  const std::vector<std::int64_t> last = {0, 2, 3, 1};
  std::uint64_t seed = 760;
  for (bool wide : {true, false}) {
    CAPTURE(wide);
    cuda::nhwc_wide_for_testing() = wide;
    for (DType dtype : {DType::bf16, DType::f16}) {
      for (const Shape& s : {Shape{2, 64, 32, 32}, Shape{3, 512, 4, 4}, Shape{5, 256, 8, 8},
                             Shape{2, 8, 2, 4}, Shape{3, 24, 5, 8}, Shape{1, 72, 7, 8},
                             Shape{2, 40, 3, 8}, Shape{2, 72, 3, 3}, Shape{2, 6, 4, 4}})
        check_transpose(s, last, dtype, seed++);
    }
    // 4-byte but not 16-byte aligned: the tiled form, whatever the switch says.
    const Shape s{2, 64, 8, 8};
    const Tensor x = random_tensor(s, DType::f64, seed++, 0, 100).to(DType::bf16);
    Attrs attrs;
    attrs.set("perm", last);
    const Tensor ref = cpu_op("transpose", attrs, {x}, Shape{2, 8, 8, 64}, DType::bf16);
    DeviceBuffer dx(x.nbytes() + 4), dy(ref.nbytes() + 4);
    auto* x_at = static_cast<char*>(dx.get()) + 4;
    auto* y_at = static_cast<char*>(dy.get()) + 4;
    KILN_CUDA_CHECK(cudaMemcpy(x_at, x.raw(), x.nbytes(), cudaMemcpyHostToDevice));
    cuda::nchw_to_nhwc(DType::bf16, x_at, y_at, 2, 64, 64, nullptr);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    Tensor got = Tensor::empty(ref.shape(), DType::bf16);
    KILN_CUDA_CHECK(cudaMemcpy(got.raw(), y_at, got.nbytes(), cudaMemcpyDeviceToHost));
    check_identical(got, ref);
    // Pairs that straddle 4 bytes are refused, not read misaligned.
    CHECK_THROWS_WITH_AS(cuda::nchw_to_nhwc(DType::bf16, x_at + 2, y_at, 2, 64, 64, nullptr),
                         doctest::Contains("aligned"), Error);
  }
  cuda::nhwc_wide_for_testing().reset();
}

TEST_CASE("one_hot: i32, i64 and u8 labels into f32 and f64 rows, exactly as the CPU") {
  SKIP_WITHOUT_GPU();
  DeviceBuffer status(cuda::kOneHotStatusBytes);
  for (DType label : {DType::i32, DType::i64, DType::u8})
    for (DType out : {DType::f32, DType::f64}) {
      CAPTURE(dtype_name(label));
      CAPTURE(dtype_name(out));
      const std::int64_t rows = 1000, classes = 10;
      const Tensor labels = random_tensor({rows}, DType::f64, 800, 0, classes).to(label);
      const Tensor ref =
          cpu_op("one_hot", {{"classes", classes}, {"dtype", std::string(dtype_name(out))}},
                 {labels}, {rows, classes}, out);
      DeviceBuffer dl(labels), dout(ref.nbytes());
      cuda::one_hot(label, out, rows, classes, dl.get(), dout.get(), status.get(), nullptr);
      const cuda::OneHotStatus s = cuda::read_one_hot_status(status.get(), nullptr);
      CHECK(s.bad_row == -1);
      CHECK_NOTHROW(cuda::check_one_hot_status(s, classes));
      check_identical(dout.download(ref.shape(), out), ref);
    }
}

TEST_CASE("one_hot: a label out of range is reported after sync, nothing written out of bounds") {
  SKIP_WITHOUT_GPU();
  const std::int64_t rows = 12, classes = 10, guard = 64;
  std::vector<std::int64_t> values(rows, 3);
  values[9] = -1;
  values[5] = 12;  // the first bad row
  const Tensor labels = Tensor::from_vector<std::int64_t>({rows}, values);
  DeviceBuffer dl(labels), dout((rows * classes + guard) * sizeof(float)),
      status(cuda::kOneHotStatusBytes);
  cuda::fill(DType::f32, 777.0, rows * classes + guard, dout.get(), nullptr);
  cuda::one_hot(DType::i64, DType::f32, rows, classes, dl.get(), dout.get(), status.get(), nullptr);
  const cuda::OneHotStatus s = cuda::read_one_hot_status(status.get(), nullptr);
  CHECK(s.bad_row == 5);
  CHECK(s.bad_label == 12);
  std::string gpu_message, cpu_message;
  try {
    cuda::check_one_hot_status(s, classes);
  } catch (const Error& e) {
    gpu_message = e.what();
  }
  try {
    cpu_op("one_hot", {{"classes", classes}, {"dtype", std::string("f32")}}, {labels},
           {rows, classes}, DType::f32);
  } catch (const Error& e) {
    cpu_message = e.what();
  }
  CHECK(gpu_message == "one_hot: label 12 at index 5 is outside [0, 10)");
  CHECK(gpu_message == cpu_message);
  const Tensor all = dout.download({rows * classes + guard}, DType::f32);
  for (std::int64_t i = 0; i < rows * classes + guard; ++i) {
    const std::int64_t row = i / classes;
    const float expected =
        row >= rows ? 777.0f : (values[static_cast<std::size_t>(row)] == i % classes ? 1.0f : 0.0f);
    if (all.data<float>()[i] != expected) {
      FAIL_CHECK("element " << i << " is " << all.data<float>()[i] << ", expected " << expected);
      break;
    }
  }
}

namespace {

// concat of `count` random pieces [outer, len_k, inner] along axis 1, GPU against the CPU kernel.
void check_concat(std::int64_t outer, std::int64_t inner, std::int64_t count, DType dtype,
                  std::uint64_t seed) {
  CAPTURE(outer);
  CAPTURE(inner);
  CAPTURE(count);
  CAPTURE(dtype_name(dtype));
  std::vector<Tensor> pieces;
  std::vector<std::unique_ptr<DeviceBuffer>> device;
  std::vector<const void*> pointers;
  std::vector<std::int64_t> widths;
  std::int64_t total = 0;
  for (std::int64_t k = 0; k < count; ++k) {
    const std::int64_t len = static_cast<std::int64_t>((seed + static_cast<std::uint64_t>(k) * 7) %
                                                       5);  // 0 to 4: empty pieces too
    pieces.push_back(
        random_tensor({outer, len, inner}, DType::f64, seed + static_cast<std::uint64_t>(k), 0, 100)
            .to(dtype));
    device.push_back(std::make_unique<DeviceBuffer>(pieces.back()));
    pointers.push_back(device.back()->get());
    widths.push_back(len * inner);
    total += len;
  }
  const Tensor ref =
      cpu_op("concat", {{"axis", std::int64_t{1}}}, pieces, {outer, total, inner}, dtype);
  DeviceBuffer out(ref.nbytes());
  cuda::concat(dtype_size(dtype), pointers, widths, outer, out.get(), nullptr);
  check_identical(out.download(ref.shape(), dtype), ref);
}

}  // namespace

TEST_CASE(
    "concat: up to 70 pieces (three launches), empty pieces, every element size, exactly as the "
    "CPU") {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 900;
  for (DType dtype : {DType::f32, DType::f64, DType::i64, DType::i32, DType::u8}) {
    check_concat(1, 1, 3, dtype, seed++);
    check_concat(7, 5, 4, dtype, seed++);
    check_concat(1, 1024, 64, dtype, seed++);  // an LSTM's per-step gradients along the rows
    check_concat(3, 2, 70, dtype, seed++);
  }
}

TEST_CASE("fill: every dtype, and all kernels load on the device") {
  SKIP_WITHOUT_GPU();
  cuda::preload_kernels(cuda::all_kernel_sources());
  for (DType dtype : {DType::f32, DType::f64, DType::i32, DType::i64, DType::u8}) {
    const std::int64_t n = 100003;
    DeviceBuffer buf(static_cast<std::size_t>(n) * dtype_size(dtype));
    cuda::fill(dtype, 7.0, n, buf.get(), nullptr);
    check_identical(buf.download({n}, dtype), Tensor::full({n}, 7.0, dtype));
  }
}

}  // namespace kiln
