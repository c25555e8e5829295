// bf16/f16 nodes on the CPU through f32 (backends/cpu/low_precision.h).
#include "backends/cpu/low_precision.h"

#include <algorithm>
#include <vector>

#include "core/dispatch.h"

namespace kiln {

namespace {

// dst = src converted (rounded to nearest even where narrower), split over the threads for a
// large tensor: element by element, so the bits are the same for any thread count.
void convert(const Tensor& src, Tensor& dst) {
  visit_dtype(src.dtype(), [&](auto src_zero) {
    visit_dtype(dst.dtype(), [&](auto dst_zero) {
      using S = decltype(src_zero);
      using D = decltype(dst_zero);
      const S* in = src.data<S>();
      D* out = dst.data<D>();
      const std::int64_t n = src.numel();
#pragma omp parallel for schedule(static) if (n > 32768)
      for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<D>(in[i]);
    });
  });
}

}  // namespace

void run_cpu_kernel(const Node& node, std::span<const Tensor> inputs, std::span<Tensor> outputs,
                    std::uint32_t blocked) {
  auto low = [](const Tensor& t) { return is_low_precision(t.dtype()); };
  const bool widen =
      node.op->id != OpId::cast && (std::any_of(inputs.begin(), inputs.end(), low) ||
                                    std::any_of(outputs.begin(), outputs.end(), low));
  if (!widen) {
    node.op->cpu(KernelCall{node, inputs, outputs, blocked});
    return;
  }
  std::vector<Tensor> wide_in, wide_out;
  for (const Tensor& t : inputs) {
    if (!low(t)) {
      wide_in.push_back(t);
      continue;
    }
    wide_in.push_back(Tensor::empty(t.shape(), DType::f32));
    convert(t, wide_in.back());
  }
  for (const Tensor& t : outputs)
    wide_out.push_back(low(t) ? Tensor::empty(t.shape(), DType::f32) : t);
  node.op->cpu(KernelCall{node, wide_in, wide_out, blocked});  // blocked values are f32
  for (std::size_t i = 0; i < outputs.size(); ++i)
    if (low(outputs[i])) convert(wide_out[i], outputs[i]);
}

}  // namespace kiln
