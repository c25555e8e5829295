// Broadcasting elementwise evaluation: adjacent axes that every input walks contiguously
// (or broadcasts entirely) are merged, the innermost run is handed to the op's loop,
// and runs are split into chunks that OpenMP threads share.
#include "graph/kernels/elementwise_cpu.h"

#include <algorithm>

#include "core/dispatch.h"

namespace kiln::kernels {
namespace {

constexpr std::int64_t kChunk = 16384;
constexpr std::size_t kMaxInputs = 8;

struct Layout {
  std::vector<std::int64_t> dims;                  // collapsed output dims
  std::vector<std::vector<std::int64_t>> strides;  // per input, per collapsed dim
};

Layout collapse(std::span<const Tensor> inputs, const Shape& out) {
  Layout layout;
  std::vector<std::vector<std::int64_t>> strides;
  for (const Tensor& t : inputs) strides.push_back(broadcast_strides(t.shape(), out));
  layout.strides.resize(inputs.size());
  for (std::size_t d = 0; d < out.rank(); ++d) {
    if (out[d] == 1) continue;  // size-1 axes contribute nothing
    bool merge = !layout.dims.empty();
    for (std::size_t k = 0; merge && k < inputs.size(); ++k)
      merge = layout.strides[k].back() == strides[k][d] * out[d];
    if (merge) {
      layout.dims.back() *= out[d];
      for (std::size_t k = 0; k < inputs.size(); ++k) layout.strides[k].back() = strides[k][d];
      continue;
    }
    layout.dims.push_back(out[d]);
    for (std::size_t k = 0; k < inputs.size(); ++k) layout.strides[k].push_back(strides[k][d]);
  }
  if (layout.dims.empty()) {
    layout.dims.push_back(1);
    for (auto& s : layout.strides) s.push_back(0);
  }
  return layout;
}

template <class T>
void run_typed(ElementwiseLoop<T> loop, std::span<const Tensor> inputs, Tensor& out) {
  const Layout layout = collapse(inputs, out.shape());
  const std::size_t rank = layout.dims.size();
  const std::int64_t run = layout.dims.back();
  const std::int64_t rows = out.numel() / std::max<std::int64_t>(run, 1);
  const std::int64_t chunks_per_row = (run + kChunk - 1) / kChunk;
  const std::int64_t tasks = rows * chunks_per_row;
  const std::size_t n_in = inputs.size();
  T* out_data = out.data<T>();
  std::int64_t steps[kMaxInputs];
  for (std::size_t k = 0; k < n_in; ++k) steps[k] = layout.strides[k].back();

#pragma omp parallel for schedule(static) if (out.numel() > 4 * kChunk)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const std::int64_t row = task / chunks_per_row;
    const std::int64_t begin = (task % chunks_per_row) * kChunk;
    const std::int64_t count = std::min(kChunk, run - begin);
    const T* in_ptrs[kMaxInputs];
    for (std::size_t k = 0; k < n_in; ++k) {
      std::int64_t offset = 0;
      std::int64_t rest = row;
      for (std::size_t d = rank - 1; d-- > 0;) {
        offset += (rest % layout.dims[d]) * layout.strides[k][d];
        rest /= layout.dims[d];
      }
      in_ptrs[k] = inputs[k].data<T>() + offset + begin * steps[k];
    }
    loop(in_ptrs, steps, out_data + row * run + begin, count);
  }
}

}  // namespace

void run_elementwise(const ElementwiseLoops& loops, std::span<const Tensor> inputs, Tensor& out) {
  KILN_ASSERT(inputs.size() <= kMaxInputs, "elementwise op with {} inputs", inputs.size());
  if (out.numel() == 0) return;
  visit_floating(out.dtype(), "elementwise", [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_same_v<T, float>)
      run_typed<float>(loops.f32, inputs, out);
    else
      run_typed<double>(loops.f64, inputs, out);
  });
}

}  // namespace kiln::kernels
