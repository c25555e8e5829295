// A strided read of a fused group's iteration space, with adjacent axes merged where the
// strides allow: a bias [1, C, 1, 1] read over [B, C, H, W] walks as [B, C, H*W] with
// strides [0, 1, 0]. The CPU evaluator walks it in runs; codegen turns it into index math.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/shape.h"

namespace kiln {

struct StridedWalk {
  std::vector<std::int64_t> dims, strides;

  StridedWalk(const Shape& shape, const std::vector<std::int64_t>& full_strides) {
    for (std::size_t d = 0; d < shape.rank(); ++d) {
      if (shape[d] == 1) continue;
      if (!dims.empty() && strides.back() == full_strides[d] * shape[d]) {
        dims.back() *= shape[d];
        strides.back() = full_strides[d];
        continue;
      }
      dims.push_back(shape[d]);
      strides.push_back(full_strides[d]);
    }
    if (dims.empty()) {
      dims.push_back(1);
      strides.push_back(0);
    }
  }

  // Calls visit(position, length, offset, step) for the runs of elements [start, start +
  // count): element position + k of the range lives at offset + k * step.
  template <class Visit>
  void runs(std::int64_t start, std::int64_t count, Visit visit) const {
    const std::size_t rank = dims.size();
    const std::int64_t inner = dims.back();
    std::int64_t row = start / inner, col = start % inner, done = 0;
    while (done < count) {
      std::int64_t offset = col * strides.back();
      for (std::size_t d = rank - 1, rest = static_cast<std::size_t>(row); d-- > 0;) {
        offset += static_cast<std::int64_t>(rest % static_cast<std::size_t>(dims[d])) * strides[d];
        rest /= static_cast<std::size_t>(dims[d]);
      }
      const std::int64_t length = std::min(inner - col, count - done);
      visit(done, length, offset, strides.back());
      done += length;
      col = 0;
      ++row;
    }
  }
};

}  // namespace kiln
