// Shared by the backends/cuda kernel tests and benchmarks: device buffers, random inputs,
// GEMM closeness, bitwise comparison, and a table op run by its CPU kernel.
#pragma once

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "core/philox.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_runtime.h"
#include "graph/op.h"
#include "graph/op_table.h"

namespace kiln::cuda_test {

#define SKIP_WITHOUT_GPU()                                  \
  if (gpu::cuda_device_count() == 0) {                      \
    MESSAGE("skipped: " << gpu::cuda_unavailable_reason()); \
    return;                                                 \
  }

// Device memory for one test, freed at scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    KILN_CUDA_CHECK(cudaMalloc(&ptr_, std::max<std::size_t>(bytes, 1)));
  }
  explicit DeviceBuffer(const Tensor& t) : DeviceBuffer(t.nbytes()) {
    KILN_CUDA_CHECK(cudaMemcpy(ptr_, t.raw(), t.nbytes(), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { (void)cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }
  // Waits for the default stream, then copies the first numel(shape) elements back.
  Tensor download(const Shape& shape, DType dtype) const {
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    Tensor t = Tensor::empty(shape, dtype);
    KILN_CUDA_CHECK(cudaMemcpy(t.raw(), ptr_, t.nbytes(), cudaMemcpyDeviceToHost));
    return t;
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

inline Tensor random_tensor(const Shape& shape, DType dtype, std::uint64_t seed, double low = -1,
                            double high = 1) {
  Tensor t = Tensor::empty(shape, dtype);
  Philox rng(seed);
  rng.fill_uniform(t, low, high);
  return t;
}

// Largest |a - b| / (rtol * (|b| + max|b|)); <= 1 is a pass (GEMM error grows with the
// sums' magnitude, not with each result's, which may cancel to near zero).
inline double gemm_closeness(const Tensor& a, const Tensor& b, double rtol) {
  REQUIRE(a.shape() == b.shape());
  double scale = 0, worst = 0;
  for (std::int64_t i = 0; i < b.numel(); ++i) scale = std::max(scale, std::abs(b.at(i)));
  for (std::int64_t i = 0; i < b.numel(); ++i)
    worst = std::max(worst,
                     std::abs(a.at(i) - b.at(i)) / (rtol * (std::abs(b.at(i)) + scale) + 1e-300));
  return worst;
}

inline double rtol_of(DType dtype) { return dtype == DType::f32 ? 1e-4 : 1e-10; }

// Bit-identical tensors (so NaNs compare equal); reports the first difference.
inline void check_identical(const Tensor& gpu, const Tensor& cpu) {
  REQUIRE(gpu.shape() == cpu.shape());
  REQUIRE(gpu.dtype() == cpu.dtype());
  const std::size_t elem = dtype_size(gpu.dtype());
  const auto* a = static_cast<const char*>(gpu.raw());
  const auto* b = static_cast<const char*>(cpu.raw());
  for (std::int64_t i = 0; i < gpu.numel(); ++i)
    if (std::memcmp(a + i * elem, b + i * elem, elem) != 0) {
      FAIL_CHECK("element " << i << " of " << gpu.shape().str() << ": gpu " << gpu.at(i) << " cpu "
                            << cpu.at(i));
      return;
    }
}

// Runs op `name`'s CPU kernel with `attrs` on `inputs` into an output of `out_shape`.
inline Tensor cpu_op(const std::string& name, Attrs attrs, std::vector<Tensor> inputs,
                     const Shape& out_shape, DType out_dtype) {
  Node node;
  node.op = &op_def(name);
  node.attrs = std::move(attrs);
  std::vector<Tensor> outputs{Tensor::empty(out_shape, out_dtype)};
  node.op->cpu(KernelCall{node, inputs, outputs});
  return outputs[0];
}

// Every tile the passes choose from or the benchmark variants try (f32), the defaults in f64.
inline std::vector<std::pair<cuda::IgemmTile, DType>> tiles_to_test() {
  std::vector<std::pair<cuda::IgemmTile, DType>> tiles;
  for (cuda::IgemmTile t : std::vector<cuda::IgemmTile>{
           {64, 64, 1, 16},        {64, 64, 1, 32},       {32, 64, 1, 16},
           {32, 64, 1, 32},        {32, 32, 2, 16},       {32, 32, 1, 32},
           {64, 32, 1, 32},        {64, 32, 2, 16},       {32, 128, 1, 16},
           {32, 16, 4, 16},        {32, 16, 2, 32},       {32, 16, 2, 16},
           {16, 64, 1, 16},        {64, 64, 1, 16, 8, 8}, {64, 128, 1, 16, 8, 8},
           {64, 64, 2, 16, 8, 8},  {64, 32, 2, 16, 8, 4}, {32, 64, 1, 32, 4, 8},
           {128, 64, 1, 16, 8, 8}, {32, 32, 4, 16, 8, 8}})
    tiles.emplace_back(t, DType::f32);
  tiles.emplace_back(cuda::IgemmTile{32, 32, 2, 16}, DType::f64);
  tiles.emplace_back(cuda::IgemmTile{64, 64, 1, 16, 8, 8}, DType::f64);
  for (DType dtype : {DType::f32, DType::f64})
    for (auto mode :
         {cuda::IgemmMode::forward, cuda::IgemmMode::grad_input, cuda::IgemmMode::grad_weight})
      for (cuda::IgemmTile t : cuda::igemm_tiles(mode, dtype)) tiles.emplace_back(t, dtype);
  return tiles;
}

inline void preload_tiles(
    const std::vector<std::pair<cuda::IgemmTile, DType>>& tiles) {  // compiled in parallel
  std::vector<gpu::KernelSource> sources;
  std::set<std::string> names;
  for (const auto& [tile, dtype] : tiles)
    for (auto mode :
         {cuda::IgemmMode::forward, cuda::IgemmMode::grad_input, cuda::IgemmMode::grad_weight})
      if (cuda::igemm_tile_valid(tile, dtype) &&
          names.insert(cuda::conv_igemm_name(mode, tile, dtype)).second)
        sources.push_back(cuda::conv_igemm_source(mode, tile, dtype));
  cuda::preload_kernels(sources);
}

}  // namespace kiln::cuda_test
