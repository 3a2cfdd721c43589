#include "ops/checks.h"

#ifdef SINGA_LITE_WITH_CUDA
#include "cuda/index_faults.h"
#endif

namespace sl {

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  SL_CHECK(a.dtype() == b.dtype(), TypeError, op, ": dtypes differ (", dtype_name(a.dtype()), " and ",
           dtype_name(b.dtype()), "); cast one with as_type() so both match");
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  SL_CHECK(a.device() == b.device(), ValueError, op, ": tensors are on different devices (", a.device().str(),
           " and ", b.device().str(), "); move one with to_device()");
}

void check_floating(const char* op, const Tensor& t) {
  SL_CHECK(is_floating(t.dtype()), TypeError, op, ": expected a floating dtype (float16, float32, float64), got ",
           dtype_name(t.dtype()), "; cast with as_type() first");
}

void check_kernel_device(const char* op, const Tensor& t) {
#ifdef SINGA_LITE_WITH_CUDA
  (void)op;  // a CUDA tensor exists only where its device could be used (allocation checks that)
#else
  SL_CHECK(t.device().is_cpu(), ValueError, op, ": ", t.device().str(), " is not available: ",
           cuda_unavailable_reason());
#endif
}

void check_out(const char* op, const Tensor& out, const Shape& shape, DType dtype, Device device) {
  SL_CHECK(out.shape() == shape, ValueError, op, ": out has shape ", shape_str(out.shape()), ", expected ",
           shape_str(shape));
  SL_CHECK(out.dtype() == dtype, TypeError, op, ": out has dtype ", dtype_name(out.dtype()), ", expected ",
           dtype_name(dtype));
  SL_CHECK(out.device() == device, ValueError, op, ": out is on ", out.device().str(), ", expected ", device.str());
}

bool partial_overlap(const Tensor& out, const Tensor& in) {
  if (!out.shares_storage(in)) return false;
  if (out.offset() == in.offset() && out.strides() == in.strides() && out.shape() == in.shape()) return false;
  // Conservative: compare the byte ranges the two views can touch.
  auto span = [](const Tensor& t) {
    int64_t lo = t.offset(), hi = t.offset();
    for (int i = 0; i < t.ndim(); ++i) {
      if (t.shape()[i] == 0) return std::pair<int64_t, int64_t>(0, -1);
      int64_t ext = (t.shape()[i] - 1) * t.strides()[i];
      if (ext < 0) lo += ext;
      else hi += ext;
    }
    return std::pair<int64_t, int64_t>(lo, hi);
  };
  auto a = span(out), b = span(in);
  return a.first <= b.second && b.first <= a.second;
}

int64_t checked_mul(const char* op, int64_t a, int64_t b) {
  int64_t r = 0;
  SL_CHECK(!__builtin_mul_overflow(a, b, &r), ValueError, op, ": sizes too large: ", a, " * ", b,
           " exceeds 2**63 - 1");
  return r;
}

int64_t checked_add(const char* op, int64_t a, int64_t b) {
  int64_t r = 0;
  SL_CHECK(!__builtin_add_overflow(a, b, &r), ValueError, op, ": sizes too large: ", a, " + ", b,
           " exceeds 2**63 - 1");
  return r;
}

bool index_check_deferred(const Tensor& indices) {
#ifdef SINGA_LITE_WITH_CUDA
  return indices.device().is_cuda() && cuda::defers_index_checks(indices.device().index);
#else
  (void)indices;
  return false;
#endif
}

}  // namespace sl
