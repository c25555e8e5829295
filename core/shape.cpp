// Shape arithmetic: element counts, strides and NumPy broadcasting.
#include "core/shape.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <limits>

#include "core/error.h"

namespace kiln {

Shape::Shape(std::initializer_list<std::int64_t> dims) : Shape(std::vector<std::int64_t>(dims)) {}

Shape::Shape(std::vector<std::int64_t> dims) : dims_(std::move(dims)) {
  for (std::int64_t d : dims_)
    KILN_CHECK(d >= 0, "shape {} has a negative dimension", fmt::join(dims_, ", "));
}

std::int64_t Shape::dim(std::int64_t axis) const {
  return dims_[normalize_axis(axis, rank(), "Shape::dim")];
}

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : dims_) {
    KILN_CHECK(d == 0 || n <= std::numeric_limits<std::int64_t>::max() / d,
               "shape {} has too many elements", str());
    n *= d;
  }
  return n;
}

std::vector<std::int64_t> Shape::strides() const {
  std::vector<std::int64_t> s(dims_.size());
  std::int64_t step = 1;
  for (std::size_t i = dims_.size(); i-- > 0;) {
    s[i] = step;
    step *= dims_[i];
  }
  return s;
}

std::string Shape::str() const { return fmt::format("[{}]", fmt::join(dims_, ", ")); }

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const std::size_t rank = std::max(a.rank(), b.rank());
  std::vector<std::int64_t> out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const std::int64_t da = i < rank - a.rank() ? 1 : a[i - (rank - a.rank())];
    const std::int64_t db = i < rank - b.rank() ? 1 : b[i - (rank - b.rank())];
    KILN_CHECK(da == db || da == 1 || db == 1,
               "{}: shapes {} and {} do not broadcast (axis {}: {} vs {})", op, a.str(), b.str(), i,
               da, db);
    out[i] = da == 1 ? db : da;
  }
  return Shape(std::move(out));
}

std::vector<std::int64_t> broadcast_strides(const Shape& in, const Shape& out) {
  KILN_ASSERT(in.rank() <= out.rank(), "{} does not broadcast to {}", in.str(), out.str());
  std::vector<std::int64_t> strides(out.rank(), 0);
  const std::vector<std::int64_t> in_strides = in.strides();
  const std::size_t lead = out.rank() - in.rank();
  for (std::size_t i = 0; i < in.rank(); ++i) {
    KILN_ASSERT(in[i] == out[lead + i] || in[i] == 1, "{} does not broadcast to {}", in.str(),
                out.str());
    strides[lead + i] = in[i] == 1 ? 0 : in_strides[i];
  }
  return strides;
}

std::int64_t normalize_axis(std::int64_t axis, std::size_t rank, const char* op) {
  const auto r = static_cast<std::int64_t>(rank);
  KILN_CHECK(axis >= -r && axis < r, "{}: axis {} is out of range for a tensor of rank {}", op,
             axis, rank);
  return axis < 0 ? axis + r : axis;
}

}  // namespace kiln
