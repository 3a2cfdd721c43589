// Tensor: a strided view (shape, strides in elements, offset in elements) of a shared Storage.
// Views (reshape of contiguous data, transpose, slice, broadcast_to) share the storage; nothing is copied
// until contiguous() or an op that needs packed memory asks for it.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/storage.h"

namespace sl {

using Shape = std::vector<int64_t>;
constexpr int kMaxDims = 16;

int64_t numel_of(const Shape& shape);
Shape contiguous_strides(const Shape& shape);
std::string shape_str(const Shape& shape);
// numpy broadcasting of two shapes; throws ValueError naming `op` when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Maps a possibly negative axis into [0, ndim); throws IndexError naming `op`.
int normalize_axis(int64_t axis, int ndim, const char* op);

class Tensor {
 public:
  Tensor() = default;  // undefined: no storage
  Tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype);

  static Tensor empty(const Shape& shape, DType dtype, Device device);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  DType dtype() const { return dtype_; }
  Device device() const;
  int ndim() const { return int(shape_.size()); }
  int64_t numel() const { return numel_; }
  size_t itemsize() const { return sl::itemsize(dtype_); }
  size_t nbytes() const { return size_t(numel()) * itemsize(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* data_ptr() const { return static_cast<char*>(storage_->data()) + offset_ * int64_t(itemsize()); }
  template <typename T>
  T* data() const { return static_cast<T*>(data_ptr()); }

  // ----- views (no copy)
  Tensor view(const Shape& shape) const;  // needs contiguous memory; one dim may be -1
  Tensor reshape(const Shape& shape) const;  // a view when possible, otherwise a contiguous copy
  Tensor transpose(const std::vector<int64_t>& perm) const;  // empty perm reverses the axes
  Tensor slice(int64_t axis, int64_t start, int64_t stop, int64_t step) const;  // python slice semantics
  Tensor select(int64_t axis, int64_t index) const;  // drops the axis
  Tensor broadcast_to(const Shape& shape) const;
  Tensor unsqueeze(int64_t axis) const;
  Tensor squeeze(const std::vector<int64_t>& axes) const;  // empty: all size-1 axes
  // ----- copies
  Tensor contiguous() const;  // self when already contiguous
  Tensor clone() const;       // always a new contiguous tensor
  Tensor to(Device device) const;
  Tensor cast(DType dtype) const;

  bool shares_storage(const Tensor& o) const { return storage_ && storage_ == o.storage_; }

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;
  DType dtype_ = DType::kFloat32;
  int64_t numel_ = 1;  // of shape_, counted (and checked against int64 overflow) once, at construction
};

// Raises ValueError unless `t` is defined; used by ops taking optional outputs.
void check_defined(const Tensor& t, const char* op, const char* what);

}  // namespace sl
