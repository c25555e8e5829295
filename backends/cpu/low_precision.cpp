// bf16/f16 nodes on the CPU through f32 (backends/cpu/low_precision.h).
#include "backends/cpu/low_precision.h"

#include <algorithm>
#include <vector>

namespace kiln {

void run_cpu_kernel(const Node& node, std::span<const Tensor> inputs, std::span<Tensor> outputs) {
  auto low = [](const Tensor& t) { return is_low_precision(t.dtype()); };
  const bool widen =
      node.op->id != OpId::cast && (std::any_of(inputs.begin(), inputs.end(), low) ||
                                    std::any_of(outputs.begin(), outputs.end(), low));
  if (!widen) {
    node.op->cpu(KernelCall{node, inputs, outputs});
    return;
  }
  std::vector<Tensor> wide_in, wide_out;
  for (const Tensor& t : inputs) wide_in.push_back(low(t) ? t.to(DType::f32) : t);
  for (const Tensor& t : outputs)
    wide_out.push_back(low(t) ? Tensor::empty(t.shape(), DType::f32) : t);
  node.op->cpu(KernelCall{node, wide_in, wide_out});
  for (std::size_t i = 0; i < outputs.size(); ++i)
    if (low(outputs[i])) outputs[i].copy_from(wide_out[i].to(outputs[i].dtype()));
}

}  // namespace kiln
