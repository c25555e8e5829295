// Row gathers: gather_rows(table [V, N], indices [R]) -> [R, N], row r = table[indices[r]];
// scatter_add_rows(x [R, N], indices [R]) {rows = V} -> [V, N], row v = the sum of the rows of
// x whose index is v. They are matmul(one_hot(indices), table) and its transposed product
// without the one-hot matrix: the one-hot products pass (graph/passes/one_hot_products.h)
// makes them; each is the other's gradient (CUDA: backends/cuda/gather.cpp, the same sums in
// the same order). An index outside [0, V) is an error that names it.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "core/dispatch.h"
#include "graph/ops.h"
#include "graph/ops/register.h"

namespace kiln {
namespace {

// Checks every index before any row moves (no exception may leave a parallel region).
template <class I>
void check_indices(const char* op, const I* indices, std::int64_t count, std::int64_t rows) {
  for (std::int64_t r = 0; r < count; ++r) {
    const auto v = static_cast<std::int64_t>(indices[r]);
    KILN_CHECK(v >= 0 && v < rows, "{}: index {} at position {} is outside [0, {})", op, v, r,
               rows);
  }
}

void check_types(const char* op, std::span<const TensorType> in) {
  KILN_CHECK(is_floating(in[0].dtype), "{}: values must be floating but are {}", op, in[0].str());
  KILN_CHECK(!is_floating(in[1].dtype), "{}: indices must be integers but are {}", op, in[1].str());
  ops::check_rank(op, "values", in[0], 2);
  ops::check_rank(op, "indices", in[1], 1);
}

// Rows are copied by the team where there are enough of them to pay for waking it.
constexpr std::int64_t kParallelElements = 1 << 16;

void gather_rows_kernel(const KernelCall& call) {
  const Tensor &table = call.inputs[0], &indices = call.inputs[1];
  Tensor& out = call.outputs[0];
  const std::int64_t vocabulary = table.shape()[0], width = table.shape()[1];
  const std::int64_t count = indices.numel();
  visit_dtype(indices.dtype(), [&](auto index_zero) {
    using I = decltype(index_zero);
    const I* idx = indices.data<I>();
    check_indices("gather_rows", idx, count, vocabulary);
    const auto row_bytes = static_cast<std::size_t>(width) * dtype_size(table.dtype());
    const auto* from = static_cast<const char*>(table.raw());
    auto* to = static_cast<char*>(out.raw());
#pragma omp parallel for schedule(static) if (count * width >= kParallelElements)
    for (std::int64_t r = 0; r < count; ++r)
      std::memcpy(to + r * row_bytes, from + static_cast<std::int64_t>(idx[r]) * row_bytes,
                  row_bytes);
  });
}

// Columns in blocks of 64, a block a task; each task adds the rows in order, so every sum is
// the same bits for any thread count.
constexpr std::int64_t kColumns = 64;

void scatter_add_rows_kernel(const KernelCall& call) {
  const Tensor &x = call.inputs[0], &indices = call.inputs[1];
  Tensor& out = call.outputs[0];
  const std::int64_t rows = out.shape()[0], width = x.shape()[1], count = indices.numel();
  visit_dtype(indices.dtype(), [&](auto index_zero) {
    using I = decltype(index_zero);
    const I* idx = indices.data<I>();
    check_indices("scatter_add_rows", idx, count, rows);
    visit_floating(x.dtype(), "scatter_add_rows", [&](auto zero) {
      using T = decltype(zero);
      const T* in = x.data<T>();
      T* o = out.data<T>();
      std::fill_n(o, out.numel(), T(0));
      const std::int64_t blocks = (width + kColumns - 1) / kColumns;
#pragma omp parallel for schedule(static) if (count * width >= kParallelElements && blocks > 1)
      for (std::int64_t b = 0; b < blocks; ++b) {
        const std::int64_t c0 = b * kColumns, w = std::min(kColumns, width - c0);
        for (std::int64_t r = 0; r < count; ++r) {
          T* dst = o + static_cast<std::int64_t>(idx[r]) * width + c0;
          const T* src = in + r * width + c0;
          for (std::int64_t j = 0; j < w; ++j) dst[j] += src[j];
        }
      }
    });
  });
}

}  // namespace

void ops::register_gather_ops(std::vector<OpDef>& table) {
  OpDef gather{.id = OpId::gather_rows, .kind = OpKind::other, .arity = 2};
  gather.infer = [](std::span<const TensorType> in, const Attrs&) {
    check_types("gather_rows", in);
    return std::vector<TensorType>{{Shape{in[1].shape[0], in[0].shape[1]}, in[0].dtype}};
  };
  gather.grad = [](const GradContext& c) {
    return std::vector<Value>{
        scatter_add_rows(c.output_grads[0], c.inputs[1], c.inputs[0].shape()[0]), Value{}};
  };
  gather.cpu = gather_rows_kernel;
  table.push_back(std::move(gather));

  OpDef scatter{.id = OpId::scatter_add_rows, .kind = OpKind::other, .arity = 2, .attrs = {"rows"}};
  scatter.infer = [](std::span<const TensorType> in, const Attrs& attrs) {
    check_types("scatter_add_rows", in);
    KILN_CHECK(in[0].shape[0] == in[1].shape[0],
               "scatter_add_rows: {} rows of values but {} indices", in[0].shape[0],
               in[1].shape[0]);
    const std::int64_t rows = attrs.integer("rows");
    KILN_CHECK(rows > 0, "scatter_add_rows: {} rows", rows);
    return std::vector<TensorType>{{Shape{rows, in[0].shape[1]}, in[0].dtype}};
  };
  scatter.grad = [](const GradContext& c) {
    return std::vector<Value>{gather_rows(c.output_grads[0], c.inputs[1]), Value{}};
  };
  scatter.cpu = scatter_add_rows_kernel;
  table.push_back(std::move(scatter));
}

Value gather_rows(Value table, Value indices) {
  return table.graph().apply1(OpId::gather_rows, {table, indices});
}

Value scatter_add_rows(Value x, Value indices, std::int64_t rows) {
  return x.graph().apply1(OpId::scatter_add_rows, {x, indices}, {{"rows", rows}});
}

}  // namespace kiln
