// The fused-chain kernel on the GPU, timed launch by launch with CUDA events.
#include "tools/bench_cuda.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "backends/cuda/conv.h"
#include "backends/cuda/device_allocator.h"
#include "core/philox.h"
#include "fusion/cuda_fused.h"
#include "fusion/fuse.h"
#include "gpu/cuda_check.h"
#include "graph/ops.h"
#include "graph/passes/dead_code.h"

namespace kiln::tools {

nlohmann::json bench_fused_chain_cuda(std::int64_t n, int warmup, int steps, DType dtype) {
  Graph g;
  const Value a = g.input("a", {n}, dtype);
  const Value b = g.input("b", {n}, dtype);
  g.output("y", tanh(relu(a * b + 1.0)) * 0.5);
  const Graph fused = eliminate_dead_code(fuse(eliminate_dead_code(g)));
  std::vector<const FusedGroup*> groups;
  for (const Node& node : fused.nodes())
    if (node.body) groups.push_back(dynamic_cast<const FusedGroup*>(node.body.get()));
  KILN_CHECK(groups.size() == 1, "the chain fused into {} groups, not one", groups.size());
  const auto kernels = compile_fused_kernels(groups);
  const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(dtype);
  auto da = cuda::device_allocator().allocate(bytes), db = cuda::device_allocator().allocate(bytes),
       dy = cuda::device_allocator().allocate(bytes);
  Tensor host = Tensor::empty({n}, DType::f32);
  Philox(1).fill_uniform(host, -1, 1);  // random data, never zeros
  KILN_CUDA_CHECK(cudaMemcpy(da->data(), host.to(dtype).raw(), bytes, cudaMemcpyHostToDevice));
  Philox(2).fill_uniform(host, -1, 1);
  KILN_CUDA_CHECK(cudaMemcpy(db->data(), host.to(dtype).raw(), bytes, cudaMemcpyHostToDevice));
  cudaEvent_t start, stop;
  KILN_CUDA_CHECK(cudaEventCreate(&start));
  KILN_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < warmup + steps; ++i) {
    KILN_CUDA_CHECK(cudaEventRecord(start, nullptr));
    kernels[0]->launch({da->data(), db->data()}, {dy->data()}, nullptr);
    KILN_CUDA_CHECK(cudaEventRecord(stop, nullptr));
    KILN_CUDA_CHECK(cudaEventSynchronize(stop));
    float elapsed = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
    if (i >= warmup) ms.push_back(elapsed);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) {
    return ms[static_cast<std::size_t>(q * static_cast<double>(ms.size() - 1))];
  };
  const double median = at(0.5);
  const LaunchShape& shape = kernels[0]->launch_shape();
  return {{"name", fmt::format("tanh(relu(a*b+1))*0.5, {} {} values, one fused kernel", n,
                               dtype_name(dtype))},
          {"dtype", dtype_name(dtype)},
          {"device", "cuda:0"},
          {"median_ms", median},
          {"p10_ms", at(0.1)},
          {"p90_ms", at(0.9)},
          {"items_per_second", static_cast<double>(n) * 1000.0 / median},
          {"tb_per_second", 3.0 * static_cast<double>(bytes) / (median * 1e9)},
          {"vector_width", kernels[0]->source().vector_width},
          {"block", shape.block.x},
          {"grid", shape.grid.x},
          {"occupancy", shape.occupancy}};
}

void force_conv_algo(const std::string& name) {
  using cuda::detail::ConvAlgo;
  const ConvAlgo algo = name == "auto"                 ? ConvAlgo::automatic
                        : name == "im2col"             ? ConvAlgo::im2col_gemm
                        : name == "im2col-grad-weight" ? ConvAlgo::im2col_grad_weight
                        : name == "mma-nchw"           ? ConvAlgo::mma_nchw
                        : name == "tensor-cores"       ? ConvAlgo::tensor_cores
                        : name == "cuda-cores"
                            ? ConvAlgo::cuda_cores
                            : throw Error(fmt::format("unknown convolution algorithm '{}'", name));
  cuda::detail::set_conv_algo_for_testing(algo);
}

double cuda_context_ms() {
  const auto start = std::chrono::steady_clock::now();
  KILN_CUDA_CHECK(cudaFree(nullptr));
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

void reset_device_peak() { cuda::device_allocator().reset_peak(); }

std::size_t device_peak_bytes() { return cuda::device_allocator().stats().peak_in_use; }

}  // namespace kiln::tools
