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

  // Where a walk stands: the multi-index of element `position` and its offset. A walk that
  // goes on where the last one ended (a thread's next tile) steps from here, without the
  // divisions that finding an element's multi-index takes.
  struct Cursor {
    std::int64_t position = -1;
    std::vector<std::int64_t> index;
    std::int64_t offset = 0;
  };

  // Calls visit(position, length, offset, step) for the runs of elements [start, start +
  // count): element position + k of the range lives at offset + k * step.
  template <class Visit>
  void runs(std::int64_t start, std::int64_t count, Visit visit) const {
    Cursor cursor;
    runs(start, count, cursor, visit);
  }

  // The same, starting from `cursor` where it stands at `start` and leaving it at the end.
  template <class Visit>
  void runs(std::int64_t start, std::int64_t count, Cursor& cursor, Visit visit) const {
    if (cursor.position != start) seek(start, cursor);
    const std::int64_t inner = dims.back();
    std::int64_t done = 0;
    while (done < count) {
      const std::int64_t length = std::min(inner - cursor.index.back(), count - done);
      visit(done, length, cursor.offset, strides.back());
      done += length;
      step(length, cursor);
    }
    cursor.position = start + count;
  }

 private:
  void seek(std::int64_t start, Cursor& cursor) const {
    cursor.index.assign(dims.size(), 0);
    cursor.offset = 0;
    for (std::size_t d = dims.size(); d-- > 0;) {
      cursor.index[d] = start % dims[d];
      start /= dims[d];
      cursor.offset += cursor.index[d] * strides[d];
    }
  }

  // Moves the cursor `length` elements on along the innermost axis (at most to its end),
  // carrying into the outer axes when it reaches the end.
  void step(std::int64_t length, Cursor& cursor) const {
    std::size_t d = dims.size() - 1;
    cursor.index[d] += length;
    cursor.offset += length * strides[d];
    while (cursor.index[d] == dims[d] && d > 0) {
      cursor.offset -= dims[d] * strides[d];
      cursor.index[d] = 0;
      --d;
      ++cursor.index[d];
      cursor.offset += strides[d];
    }
  }
};

}  // namespace kiln
