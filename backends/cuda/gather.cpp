// The CUDA entries of gather_rows and scatter_add_rows (graph/ops/gather_ops.cpp; kernels in
// kernels/gather.cuh). An index outside [0, rows) is reported through the node's status memory,
// as one_hot's labels are, and raised after the step with the CPU kernel's message.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>

#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "backends/cuda/op_entry.h"
#include "core/error.h"
#include "gpu/cuda_check.h"
#include "kiln_kernel_files.h"

namespace kiln::cuda {
namespace {

struct IndexStatus {  // kernels/gather.cuh's report
  std::int64_t bad_position = -1;
  std::int64_t bad_index = -1;
  std::int64_t rows = 0;
};

constexpr DType kIndexTypes[] = {DType::i32, DType::i64, DType::u8};
constexpr DType kValueTypes[] = {DType::f32, DType::f64};

std::string kernel_name(const char* op, DType index, DType value) {
  return fmt::format("kiln_{}_{}_{}", op, dtype_name(index), dtype_name(value));
}

gpu::KernelSource gather_source(DType index, DType value) {
  return embedded_kernel(kernel_name("gather_rows", index, value), kernel_files::gather_cuh,
                         "KILN_GATHER_ROWS",
                         {{"KILN_I", cuda_type_name(index)}, {"KILN_T", cuda_type_name(value)}});
}
gpu::KernelSource scatter_source(DType index, DType value) {
  return embedded_kernel(kernel_name("scatter_add_rows", index, value), kernel_files::gather_cuh,
                         "KILN_SCATTER_ADD_ROWS",
                         {{"KILN_I", cuda_type_name(index)}, {"KILN_T", cuda_type_name(value)}});
}
gpu::KernelSource sort_source(DType index) {
  return embedded_kernel(fmt::format("kiln_scatter_sort_{}", dtype_name(index)),
                         kernel_files::gather_cuh, "KILN_SCATTER_SORT",
                         {{"KILN_I", cuda_type_name(index)}});
}
gpu::KernelSource segments_source(DType value) {
  return embedded_kernel(fmt::format("kiln_scatter_segments_{}", dtype_name(value)),
                         kernel_files::gather_cuh, "KILN_SCATTER_SEGMENTS",
                         {{"KILN_T", cuda_type_name(value)}});
}
gpu::KernelSource finish_source(DType index) {
  return embedded_kernel(fmt::format("kiln_index_finish_{}", dtype_name(index)),
                         kernel_files::gather_cuh, "KILN_INDEX_FINISH",
                         {{"KILN_I", cuda_type_name(index)}});
}

// kernels/gather.cuh: the sorted scatter's limit on output rows (kSortedRows) and its block.
constexpr std::int64_t kSortedRows = 8192;
constexpr unsigned kSortThreads = 1024;

// The sorted scatter's scratch: the positions in index order, then each index's first place.
std::size_t sort_bytes(std::int64_t count, std::int64_t rows) {
  return rows <= kSortedRows ? static_cast<std::size_t>(count + rows + 1) * sizeof(int) : 0;
}

void check_types(const char* op, DType index, DType value) {
  KILN_CHECK(index == DType::i32 || index == DType::i64 || index == DType::u8,
             "{}: indices must be i32, i64 or u8 on the GPU but are {}", op, dtype_name(index));
  KILN_CHECK(value == DType::f32 || value == DType::f64,
             "{}: values must be f32 or f64 on the GPU but are {}", op, dtype_name(value));
}

// Prepares gather_rows (`scatter` false: inputs table, indices) or scatter_add_rows (inputs
// x, indices): the status reset, the kernel, then the report's finisher.
Launch prepare(const LaunchSetup& s, bool scatter) {
  const char* op = scatter ? "scatter_add_rows" : "gather_rows";
  const DType value = s.input_types[0].dtype, index = s.input_types[1].dtype;
  check_types(op, index, value);
  const long long count = s.input_types[1].shape[0], width = s.input_types[0].shape[1];
  const long long rows = scatter ? s.node.outputs[0].shape[0] : s.input_types[0].shape[0];
  const void *values = s.inputs[0], *indices = s.inputs[1];
  void *out = s.outputs[0], *status = s.status, *workspace = s.workspace;
  KILN_CHECK(!scatter || s.workspace_bytes >= sort_bytes(count, rows),
             "scatter_add_rows: {} bytes of workspace for {} bytes", s.workspace_bytes,
             sort_bytes(count, rows));
  KILN_CHECK(count < (std::int64_t{1} << 31), "{}: {} indices (at most 2^31 - 1)", op, count);
  return [=](gpu::Stream st) {
    auto kernel = [&]() -> const DeviceKernel& {
      return device_kernel(kernel_name(op, index, value), [=] {
        return scatter ? scatter_source(index, value) : gather_source(index, value);
      });
    };
    const DeviceKernel& finish =
        device_kernel(fmt::format("kiln_index_finish_{}", dtype_name(index)),
                      [=] { return finish_source(index); });
    KILN_CUDA_CHECK(cudaMemsetAsync(status, 0xff, sizeof(IndexStatus), st));
    const void *v = values, *i = indices;
    void *o = out, *report = status;
    long long n = count, w = width, r = rows;
    void* args[] = {&v, &i, &o, &n, &w, &r, &report};
    constexpr unsigned kThreads = 128;
    const gpu::Dim3 grid{static_cast<unsigned>((width + kThreads - 1) / kThreads),
                         static_cast<unsigned>(std::min<long long>(rows, 65535)), 1};
    if (scatter && rows <= kSortedRows) {  // sort the positions by index, then add segments
      const DeviceKernel& sort =
          device_kernel(fmt::format("kiln_scatter_sort_{}", dtype_name(index)),
                        [=] { return sort_source(index); });
      const DeviceKernel& segments =
          device_kernel(fmt::format("kiln_scatter_segments_{}", dtype_name(value)),
                        [=] { return segments_source(value); });
      int* order = static_cast<int*>(workspace);
      int* starts = order + count;
      int rows32 = static_cast<int>(rows);
      void* sort_args[] = {&i, &n, &rows32, &order, &starts, &report};
      sort.kernel.launch({1, 1, 1}, {kSortThreads, 1, 1}, 0, st, sort_args);
      void* segment_args[] = {&v, &order, &starts, &o, &w, &rows32};
      if (width > 0) segments.kernel.launch(grid, {kThreads, 1, 1}, 0, st, segment_args);
    } else if (scatter) {
      if (width > 0) kernel().kernel.launch(grid, {kThreads, 1, 1}, 0, st, args);
    } else {
      const unsigned threads = width >= 256 ? 256 : 128;  // a block a row at a time
      const auto blocks = static_cast<unsigned>(std::min<long long>(count, 8192));
      if (count > 0 && width > 0)
        kernel().kernel.launch({blocks, 1, 1}, {threads, 1, 1}, 0, st, args);
    }
    void* finish_args[] = {&i, &r, &report};
    finish.kernel.launch({1, 1, 1}, {32, 1, 1}, 0, st, finish_args);
  };
}

CudaOpEntry entry(bool scatter) {
  CudaOpEntry e{.prepare = [scatter](const LaunchSetup& s) { return prepare(s, scatter); }};
  e.sources = [scatter](const Node&, const InputTypes& in) {
    const DType value = in[0].dtype, index = in[1].dtype;
    check_types(scatter ? "scatter_add_rows" : "gather_rows", index, value);
    std::vector<gpu::KernelSource> sources{
        scatter ? scatter_source(index, value) : gather_source(index, value), finish_source(index)};
    if (scatter) {
      sources.push_back(sort_source(index));
      sources.push_back(segments_source(value));
    }
    return sources;
  };
  if (scatter)
    e.workspace_bytes = [](const Node& n, const InputTypes& in) {
      return sort_bytes(in[1].shape[0], n.outputs[0].shape[0]);
    };
  e.status_bytes = [](const Node&, const InputTypes&) { return sizeof(IndexStatus); };
  e.every_source = [scatter] {
    std::vector<gpu::KernelSource> all;
    for (DType index : kIndexTypes) {
      for (DType value : kValueTypes)
        all.push_back(scatter ? scatter_source(index, value) : gather_source(index, value));
      all.push_back(finish_source(index));
      if (scatter) all.push_back(sort_source(index));
    }
    if (scatter)
      for (DType value : kValueTypes) all.push_back(segments_source(value));
    return all;
  };
  e.check_status = [scatter](const Node&, const void* device_status, gpu::Stream st) {
    IndexStatus status;
    KILN_CUDA_CHECK(
        cudaMemcpyAsync(&status, device_status, sizeof status, cudaMemcpyDeviceToHost, st));
    KILN_CUDA_CHECK(cudaStreamSynchronize(st));
    KILN_CHECK(status.bad_position < 0, "{}: index {} at position {} is outside [0, {})",
               scatter ? "scatter_add_rows" : "gather_rows", status.bad_index, status.bad_position,
               status.rows);
  };
  return e;
}

}  // namespace

void add_gather_ops(CudaOpTable& table) {
  table[OpId::gather_rows] = entry(false);
  table[OpId::scatter_add_rows] = entry(true);
}

}  // namespace kiln::cuda
