// Tensor: a shape and dtype over shared storage (row-major, contiguous).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"
#include "core/storage.h"

namespace kiln {

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Storage> storage, std::size_t byte_offset, Shape shape, DType dtype);

  // Uninitialised host tensor.
  static Tensor empty(const Shape& shape, DType dtype);
  static Tensor zeros(const Shape& shape, DType dtype);
  static Tensor full(const Shape& shape, double value, DType dtype);
  // Host tensor holding `values` (converted to `dtype`); numel must match.
  static Tensor from_values(const Shape& shape, std::span<const double> values, DType dtype);
  template <class T>
  static Tensor from_vector(const Shape& shape, const std::vector<T>& values);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const;
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  std::size_t byte_offset() const { return byte_offset_; }

  void* raw() const;
  template <class T>
  T* data() const {
    KILN_CHECK(dtype_of<T>() == dtype_, "tensor of dtype {} read as {}", dtype_name(dtype_),
               dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw());
  }
  // Element i converted to double (host tensors only); for tests and printing.
  double at(std::int64_t i) const;
  double item() const;
  std::vector<double> to_doubles() const;

  // Rows [begin, begin + count) of axis 0, sharing storage.
  Tensor narrow_rows(std::int64_t begin, std::int64_t count) const;
  // Same storage, new shape with the same element count.
  Tensor reshape(const Shape& shape) const;
  // Deep copy into fresh host storage, optionally converting the dtype.
  Tensor clone() const;
  Tensor to(DType dtype) const;
  // Copies `src` (same shape and dtype) into this tensor's storage.
  void copy_from(const Tensor& src);
  std::string str(std::size_t max_values = 8) const;
  // Throws kiln::Error naming `what` unless the tensor is in host memory.
  void check_host(const char* what) const;

 private:
  std::shared_ptr<Storage> storage_;
  std::size_t byte_offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::f32;
};

template <class T>
Tensor Tensor::from_vector(const Shape& shape, const std::vector<T>& values) {
  KILN_CHECK(static_cast<std::int64_t>(values.size()) == shape.numel(),
             "{} values given for shape {}", values.size(), shape.str());
  Tensor t = empty(shape, dtype_of<T>());
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

}  // namespace kiln
