#include "core/tensor.h"

#include <algorithm>

#include "core/errors.h"
#include "ops/ops.h"

namespace sl {

int64_t numel_of(const Shape& shape) {
  // Every tensor's shape passes through here when it is built (Tensor's constructor), so an element count
  // beyond int64 (e.g. a broadcast to [2**62, 2**62]) is refused instead of wrapping to a small number that
  // later kernels would trust. A zero dimension makes the product 0 whatever the others are, as numpy has it.
  for (int64_t d : shape)
    if (d == 0) return 0;
  int64_t n = 1;
  for (int64_t d : shape)
    SL_CHECK(d < 0 || !__builtin_mul_overflow(n, d, &n), ValueError, "shape ", shape_str(shape),
             " has more elements than a tensor can hold (2**63 - 1)");
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  // A size-0 axis counts as 1, as in numpy. Only a tensor with no elements can have sizes whose product
  // overflows int64 (numel_of refuses any other shape), e.g. (0, 2**62, 4); its strides address nothing, so
  // from the overflow outwards they are 0 rather than the result of a signed overflow (found by UBSan).
  Shape s(shape.size());
  int64_t acc = 1;
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    s[i] = acc;
    if (__builtin_mul_overflow(acc, std::max<int64_t>(shape[i], 1), &acc)) acc = 0;
  }
  return s;
}

std::string shape_str(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    s += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) s += shape.size() == 1 ? "," : ", ";
  }
  return s + ")";
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    SL_CHECK(da == db || da == 1 || db == 1, ValueError, op, ": shapes ", shape_str(a), " and ", shape_str(b),
             " do not broadcast (dimension ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int normalize_axis(int64_t axis, int ndim, const char* op) {
  int64_t a = axis < 0 ? axis + ndim : axis;
  if (a < 0 || a >= std::max(ndim, 0))
    throw IndexError(str(op, ": axis ", axis, " is out of range for a tensor with ", ndim, " dimensions"));
  return int(a);
}

void check_defined(const Tensor& t, const char* op, const char* what) {
  SL_CHECK(t.defined(), ValueError, op, ": ", what, " is an undefined tensor");
}

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype)
    : storage_(std::move(storage)), shape_(std::move(shape)), strides_(std::move(strides)), offset_(offset),
      dtype_(dtype) {
  SL_CHECK(shape_.size() <= size_t(kMaxDims), ValueError, "Tensor: at most ", kMaxDims, " dimensions, got ",
           shape_.size());
  SL_ASSERT(shape_.size() == strides_.size());
  for (int64_t d : shape_) SL_CHECK(d >= 0, ValueError, "Tensor: negative dimension in shape ", shape_str(shape_));
  numel_ = numel_of(shape_);  // every tensor and view is built here: a count beyond int64 is refused once
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) SL_CHECK(d >= 0, ValueError, "Tensor: negative dimension in shape ", shape_str(shape));
  SL_CHECK(shape.size() <= size_t(kMaxDims), ValueError, "Tensor: at most ", kMaxDims, " dimensions, got ",
           shape.size());
  int64_t n = numel_of(shape);
  size_t nbytes = 0;
  SL_CHECK(!__builtin_mul_overflow(size_t(n), sl::itemsize(dtype), &nbytes), OutOfMemory, "cannot allocate a ",
           dtype_name(dtype), " tensor of shape ", shape_str(shape), ": its size in bytes overflows");
  auto storage = Storage::allocate(nbytes, device);
  return Tensor(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

bool Tensor::is_contiguous() const {
  if (numel_ == 0) return true;  // and below, the product of the sizes fits in int64
  int64_t expected = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

static Shape infer_shape(const Shape& requested, int64_t numel, const Shape& from) {
  Shape out = requested;
  int infer = -1;
  int64_t known = 1;
  bool known_overflows = false;  // then no -1 can make the count match (e.g. (2**62, 4, -1), found by UBSan)
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      SL_CHECK(infer < 0, ValueError, "reshape: only one dimension can be -1, got ", shape_str(requested));
      infer = int(i);
    } else {
      SL_CHECK(out[i] >= 0, ValueError, "reshape: invalid dimension ", out[i], " in ", shape_str(requested));
      known_overflows = known_overflows || __builtin_mul_overflow(known, out[i], &known);
    }
  }
  if (infer >= 0) {
    SL_CHECK(!known_overflows && known != 0 && numel % known == 0, ValueError, "reshape: cannot reshape ", shape_str(from), " (",
             numel, " elements) into ", shape_str(requested));
    out[infer] = numel / known;
  }
  SL_CHECK(numel_of(out) == numel, ValueError, "reshape: cannot reshape ", shape_str(from), " (", numel,
           " elements) into ", shape_str(requested), " (", numel_of(out), " elements)");
  return out;
}

Tensor Tensor::view(const Shape& shape) const {
  check_defined(*this, "view", "input");
  Shape out = infer_shape(shape, numel(), shape_);
  SL_CHECK(is_contiguous(), ValueError, "view: the tensor is not contiguous (strides ", shape_str(strides_),
           "); call contiguous() first or use reshape()");
  return Tensor(storage_, out, contiguous_strides(out), offset_, dtype_);
}

Tensor Tensor::reshape(const Shape& shape) const {
  check_defined(*this, "reshape", "input");
  return is_contiguous() ? view(shape) : contiguous().view(shape);
}

Tensor Tensor::transpose(const std::vector<int64_t>& perm) const {
  check_defined(*this, "transpose", "input");
  int n = ndim();
  std::vector<int64_t> p = perm;
  if (p.empty())
    for (int i = n - 1; i >= 0; --i) p.push_back(i);
  SL_CHECK(int(p.size()) == n, ValueError, "transpose: axes ", shape_str(p), " do not match a tensor with ", n,
           " dimensions");
  std::vector<bool> seen(n, false);
  Shape shape(n), strides(n);
  for (int i = 0; i < n; ++i) {
    int a = normalize_axis(p[i], n, "transpose");
    SL_CHECK(!seen[a], ValueError, "transpose: axis ", p[i], " repeated in ", shape_str(p));
    seen[a] = true;
    shape[i] = shape_[a];
    strides[i] = strides_[a];
  }
  return Tensor(storage_, shape, strides, offset_, dtype_);
}

Tensor Tensor::slice(int64_t axis, int64_t start, int64_t stop, int64_t step) const {
  check_defined(*this, "slice", "input");
  int a = normalize_axis(axis, ndim(), "slice");
  SL_CHECK(step != 0, ValueError, "slice: step cannot be zero");
  int64_t n = shape_[a];
  // Python's slice.indices() clamping.
  auto clamp = [&](int64_t v) {
    if (v < 0) v += n;
    if (step > 0) return std::min(std::max<int64_t>(v, 0), n);
    return std::min(std::max<int64_t>(v, -1), n - 1);
  };
  int64_t b = clamp(start), e = clamp(stop);
  int64_t len = step > 0 ? (e > b ? (e - b + step - 1) / step : 0) : (b > e ? (b - e + (-step) - 1) / (-step) : 0);
  Shape shape = shape_, strides = strides_;
  shape[a] = len;
  strides[a] = strides_[a] * step;
  int64_t off = len > 0 ? offset_ + b * strides_[a] : offset_;
  return Tensor(storage_, shape, strides, off, dtype_);
}

Tensor Tensor::select(int64_t axis, int64_t index) const {
  check_defined(*this, "select", "input");
  int a = normalize_axis(axis, ndim(), "select");
  int64_t n = shape_[a];
  int64_t i = index < 0 ? index + n : index;
  // The message starts with the op's name, as every other check's does.
  SL_CHECK(i >= 0 && i < n, IndexError, "select: index ", index, " is out of bounds for axis ", a, " with size ", n);
  Shape shape = shape_, strides = strides_;
  shape.erase(shape.begin() + a);
  strides.erase(strides.begin() + a);
  return Tensor(storage_, shape, strides, offset_ + i * strides_[a], dtype_);
}

Tensor Tensor::broadcast_to(const Shape& shape) const {
  check_defined(*this, "broadcast_to", "input");
  SL_CHECK(shape.size() >= shape_.size(), ValueError, "broadcast_to: cannot broadcast ", shape_str(shape_), " to ",
           shape_str(shape), " (fewer dimensions)");
  size_t lead = shape.size() - shape_.size();
  Shape strides(shape.size(), 0);
  for (size_t i = 0; i < shape_.size(); ++i) {
    int64_t want = shape[lead + i];
    if (shape_[i] == want) strides[lead + i] = strides_[i];
    else SL_CHECK(shape_[i] == 1, ValueError, "broadcast_to: cannot broadcast ", shape_str(shape_), " to ",
                  shape_str(shape));
  }
  return Tensor(storage_, shape, strides, offset_, dtype_);
}

Tensor Tensor::unsqueeze(int64_t axis) const {
  check_defined(*this, "unsqueeze", "input");
  int a = normalize_axis(axis, ndim() + 1, "unsqueeze");
  Shape shape = shape_, strides = strides_;
  int64_t st = a < ndim() ? strides_[a] * shape_[a] : 1;
  shape.insert(shape.begin() + a, 1);
  strides.insert(strides.begin() + a, st);
  return Tensor(storage_, shape, strides, offset_, dtype_);
}

Tensor Tensor::squeeze(const std::vector<int64_t>& axes) const {
  check_defined(*this, "squeeze", "input");
  std::vector<bool> drop(ndim(), false);
  if (axes.empty()) {
    for (int i = 0; i < ndim(); ++i) drop[i] = shape_[i] == 1;
  } else {
    for (int64_t ax : axes) {
      int a = normalize_axis(ax, ndim(), "squeeze");
      SL_CHECK(shape_[a] == 1, ValueError, "squeeze: axis ", ax, " has size ", shape_[a], ", not 1");
      drop[a] = true;
    }
  }
  Shape shape, strides;
  for (int i = 0; i < ndim(); ++i)
    if (!drop[i]) {
      shape.push_back(shape_[i]);
      strides.push_back(strides_[i]);
    }
  return Tensor(storage_, shape, strides, offset_, dtype_);
}

Tensor Tensor::contiguous() const {
  check_defined(*this, "contiguous", "input");
  return is_contiguous() ? *this : clone();
}

Tensor Tensor::clone() const {
  check_defined(*this, "clone", "input");
  Tensor out = empty(shape_, dtype_, device());
  copy_(out, *this);
  return out;
}

Tensor Tensor::to(Device device) const {
  check_defined(*this, "to", "input");
  if (device == this->device()) return *this;
  Tensor out = empty(shape_, dtype_, device);
  copy_(out, *this);
  return out;
}

Tensor Tensor::cast(DType dtype) const {
  check_defined(*this, "cast", "input");
  if (dtype == dtype_) return *this;
  Tensor out = empty(shape_, dtype, device());
  copy_(out, *this);
  return out;
}

}  // namespace sl
