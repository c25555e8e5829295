// Internals shared by the CPU evaluators of fused groups (cpu_fused.cpp, cpu_staged.cpp): the
// tile size, tile registers and the ops' elementwise loops (rounding to 16-bit dtypes is
// core/dtype.h's round_to).
#pragma once

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "fusion/fused_group.h"

namespace kiln::cpu_tiles {

constexpr std::int64_t kTile = 1024;

template <class T>
ElementwiseLoop<T> loop_of(const OpDef& op) {
  if constexpr (std::is_same_v<T, float>)
    return op.loops.f32;
  else
    return op.loops.f64;
}

// Tile registers at 64-byte alignment: Eigen's SIMD loops split an array into a scalar head
// and vector body by address, so equal alignment everywhere keeps results bitwise equal
// from run to run (and program to program).
template <class T>
class AlignedBuffer {
 public:
  explicit AlignedBuffer(std::size_t n)
      : data_(static_cast<T*>(
            std::aligned_alloc(64, std::max<std::size_t>(64, (n * sizeof(T) + 63) / 64 * 64)))) {
    KILN_CHECK(data_ != nullptr, "out of host memory for fused tiles ({} values)", n);
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    return *this;
  }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

 private:
  T* data_;
};

}  // namespace kiln::cpu_tiles
