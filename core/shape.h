// Tensor shapes (row-major), broadcasting rules and axis helpers.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace kiln {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims);
  explicit Shape(std::vector<std::int64_t> dims);

  std::size_t rank() const { return dims_.size(); }
  std::int64_t operator[](std::size_t axis) const { return dims_[axis]; }
  std::int64_t& operator[](std::size_t axis) { return dims_[axis]; }
  // Dimension with Python-style negative indexing; throws on an out-of-range axis.
  std::int64_t dim(std::int64_t axis) const;
  std::int64_t numel() const;
  const std::vector<std::int64_t>& dims() const { return dims_; }
  // Row-major strides in elements.
  std::vector<std::int64_t> strides() const;
  std::string str() const;  // "[64, 1, 28, 28]"

  bool operator==(const Shape& other) const = default;

 private:
  std::vector<std::int64_t> dims_;
};

// NumPy broadcasting of two shapes; throws kiln::Error naming `op` when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Strides (in elements) for reading `in` as if it had shape `out` (0 on broadcast axes).
// `in` must broadcast to `out`.
std::vector<std::int64_t> broadcast_strides(const Shape& in, const Shape& out);
// Normalises a possibly negative axis for a tensor of `rank`; throws naming `op` if out of range.
std::int64_t normalize_axis(std::int64_t axis, std::size_t rank, const char* op);

}  // namespace kiln
