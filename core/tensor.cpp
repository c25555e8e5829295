// Host-side tensor construction, conversion and printing.
#include "core/tensor.h"

#include <fmt/format.h>

#include <cstring>

#include "core/dispatch.h"

namespace kiln {

Tensor::Tensor(std::shared_ptr<Storage> storage, std::size_t byte_offset, Shape shape, DType dtype)
    : storage_(std::move(storage)),
      byte_offset_(byte_offset),
      shape_(std::move(shape)),
      dtype_(dtype) {
  KILN_ASSERT(storage_ != nullptr, "tensor without storage");
  KILN_ASSERT(byte_offset_ + nbytes() <= storage_->bytes(),
              "tensor {} {} at offset {} overruns {} bytes", shape_.str(), dtype_name(dtype_),
              byte_offset_, storage_->bytes());
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  const std::size_t bytes = static_cast<std::size_t>(shape.numel()) * dtype_size(dtype);
  return Tensor(Storage::allocate_cpu(bytes), 0, shape, dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    std::fill_n(static_cast<T*>(t.raw()), t.numel(), static_cast<T>(value));
  });
  return t;
}

Tensor Tensor::from_values(const Shape& shape, std::span<const double> values, DType dtype) {
  KILN_CHECK(static_cast<std::int64_t>(values.size()) == shape.numel(),
             "{} values given for shape {}", values.size(), shape.str());
  Tensor t = empty(shape, dtype);
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* out = static_cast<T*>(t.raw());
    for (std::size_t i = 0; i < values.size(); ++i) out[i] = static_cast<T>(values[i]);
  });
  return t;
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

void* Tensor::raw() const {
  KILN_ASSERT(storage_ != nullptr, "access to an undefined tensor");
  return static_cast<char*>(storage_->data()) + byte_offset_;
}

void Tensor::check_host(const char* what) const {
  KILN_CHECK(device().is_cpu(), "{}: the tensor is on {}; copy it to the host first", what,
             device().str());
}

double Tensor::at(std::int64_t i) const {
  check_host("Tensor::at");
  KILN_CHECK(i >= 0 && i < numel(), "index {} out of range for shape {}", i, shape_.str());
  return visit_dtype(dtype_, [&](auto zero) {
    using T = decltype(zero);
    return static_cast<double>(static_cast<const T*>(raw())[i]);
  });
}

double Tensor::item() const {
  KILN_CHECK(numel() == 1, "item() needs one element but the tensor has shape {}", shape_.str());
  return at(0);
}

std::vector<double> Tensor::to_doubles() const {
  std::vector<double> out(static_cast<std::size_t>(numel()));
  for (std::int64_t i = 0; i < numel(); ++i) out[static_cast<std::size_t>(i)] = at(i);
  return out;
}

Tensor Tensor::reshape(const Shape& shape) const {
  KILN_CHECK(shape.numel() == numel(), "cannot reshape {} ({} elements) to {} ({} elements)",
             shape_.str(), numel(), shape.str(), shape.numel());
  return Tensor(storage_, byte_offset_, shape, dtype_);
}

Tensor Tensor::narrow_rows(std::int64_t begin, std::int64_t count) const {
  KILN_CHECK(shape_.rank() >= 1 && begin >= 0 && count >= 0 && begin + count <= shape_[0],
             "narrow_rows: rows [{}, {}) of a tensor of shape {}", begin, begin + count,
             shape_.str());
  std::vector<std::int64_t> dims = shape_.dims();
  dims[0] = count;
  const std::size_t row_bytes = shape_[0] == 0 ? 0 : nbytes() / static_cast<std::size_t>(shape_[0]);
  return Tensor(storage_, byte_offset_ + static_cast<std::size_t>(begin) * row_bytes, Shape(dims),
                dtype_);
}

Tensor Tensor::clone() const { return to(dtype_); }

Tensor Tensor::to(DType dtype) const {
  check_host("Tensor::to");
  Tensor out = empty(shape_, dtype);
  if (dtype == dtype_) {
    std::memcpy(out.raw(), raw(), nbytes());
    return out;
  }
  visit_dtype(dtype_, [&](auto src_zero) {
    using S = decltype(src_zero);
    visit_dtype(dtype, [&](auto dst_zero) {
      using D = decltype(dst_zero);
      const S* src = static_cast<const S*>(raw());
      D* dst = static_cast<D*>(out.raw());
      const std::int64_t n = numel();  // hoisted: dst may alias anything to the compiler
      for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<D>(src[i]);
    });
  });
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  KILN_CHECK(src.shape() == shape_ && src.dtype() == dtype_, "copy_from: {} {} into {} {}",
             src.shape().str(), dtype_name(src.dtype()), shape_.str(), dtype_name(dtype_));
  check_host("copy_from");
  src.check_host("copy_from");
  std::memcpy(raw(), src.raw(), nbytes());
}

std::string Tensor::str(std::size_t max_values) const {
  std::string values;
  const auto n = static_cast<std::size_t>(numel());
  for (std::size_t i = 0; i < std::min(n, max_values); ++i)
    values += fmt::format("{}{:.6g}", i ? ", " : "", at(static_cast<std::int64_t>(i)));
  if (n > max_values) values += ", ...";
  return fmt::format("Tensor({} {}: {})", shape_.str(), dtype_name(dtype_), values);
}

}  // namespace kiln
