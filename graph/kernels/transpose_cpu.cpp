#include "graph/kernels/transpose_cpu.h"

#include <cstring>

namespace kiln::kernels {

void transpose(const Tensor& x, const std::vector<std::int64_t>& perm, Tensor& y) {
  const std::vector<std::int64_t> in_strides = x.shape().strides();
  const std::size_t rank = perm.size();
  std::vector<std::int64_t> src_strides(rank);  // stride in x of each output axis
  for (std::size_t d = 0; d < rank; ++d)
    src_strides[d] = in_strides[static_cast<std::size_t>(perm[d])];
  const Shape& out_shape = y.shape();
  const std::size_t elem = dtype_size(x.dtype());
  const auto* src = static_cast<const char*>(x.raw());
  auto* dst = static_cast<char*>(y.raw());
  const std::int64_t n = y.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t offset = 0;
    for (std::int64_t d = static_cast<std::int64_t>(rank) - 1, rest = i; d >= 0; --d) {
      offset += (rest % out_shape[static_cast<std::size_t>(d)]) *
                src_strides[static_cast<std::size_t>(d)];
      rest /= out_shape[static_cast<std::size_t>(d)];
    }
    std::memcpy(dst + static_cast<std::size_t>(i) * elem,
                src + static_cast<std::size_t>(offset) * elem, elem);
  }
}

}  // namespace kiln::kernels
