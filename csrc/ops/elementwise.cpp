// Front-ends of the element-wise ops, fill, arange and copy.
#include <cmath>

#include "ops/dispatch.h"
#include "ops/checks.h"
#include "ops/ops.h"
#ifdef SINGA_LITE_WITH_CUDA
#include "cuda/runtime.h"
#endif

namespace sl {

const char* op_name(BinaryOp op) {
#define SL_NAME(e, name, ...) name,
  static const char* names[] = {SL_BINARY_OPS(SL_NAME)};
  return names[int(op)];
}

const char* op_name(UnaryOp op) {
  static const char* names[] = {SL_UNARY_OPS(SL_NAME)};
#undef SL_NAME
  return names[int(op)];
}

bool is_comparison(BinaryOp op) { return op >= BinaryOp::kEq; }

namespace {

DType result_dtype(BinaryOp op, DType in) { return is_comparison(op) ? DType::kBool : in; }

void check_arith_dtype(BinaryOp op, const Tensor& a) {
  if (!is_comparison(op))
    SL_CHECK(a.dtype() != DType::kBool, TypeError, op_name(op), ": not defined for bool tensors; cast with ",
             "as_type(int32) first");
}

// A scalar used with an integer (or bool) tensor must be an integer, and for int32 / int64 one the dtype can
// hold: casting nan, inf or an out-of-range double to an integer type is undefined behaviour in C++ (seen as
// eq_scalar(int32 tensor, nan) being true for INT32_MIN, and int tensors silently using a truncated value).
void check_int_scalar(const char* op, const char* what, double s, DType dtype) {
  SL_CHECK(std::nearbyint(s) == s, TypeError, op, ": ", what, " ", s, " is not an integer but the tensor is ",
           dtype_name(dtype), "; cast the tensor to a float dtype with as_type() first");
  if (dtype == DType::kInt32)
    SL_CHECK(s >= -2147483648.0 && s <= 2147483647.0, TypeError, op, ": ", what, " ", s,
             " is out of range for int32");
  if (dtype == DType::kInt64)
    SL_CHECK(s >= -9223372036854775808.0 && s < 9223372036854775808.0, TypeError, op, ": ", what, " ", s,
             " is out of range for int64");
}

// Prepares `out`: allocates it, or checks a given one; a given out that partially overlaps an input is
// computed into a temporary and copied back (`result`), so in-place use never reads overwritten data.
struct OutPlan {
  Tensor out;     // what the kernel writes
  Tensor result;  // what the caller gets
};

OutPlan plan_out(const char* op, Tensor out, const Shape& shape, DType dtype, Device device,
                 std::initializer_list<const Tensor*> inputs) {
  if (!out.defined()) {
    Tensor t = Tensor::empty(shape, dtype, device);
    return {t, t};
  }
  check_out(op, out, shape, dtype, device);
  for (const Tensor* in : inputs)
    if (partial_overlap(out, *in)) return {Tensor::empty(shape, dtype, device), out};
  return {out, out};
}

Tensor finish(const OutPlan& p) {
  if (!p.out.shares_storage(p.result)) SL_KERNEL(p.out.device(), copy, p.result, p.out);
  return p.result;
}


// Integer powers with a negative exponent have no integer result; numpy raises too.
void check_int_pow_exponent(const Tensor& exponent) {
  if (is_floating(exponent.dtype()) || exponent.numel() == 0) return;
  Tensor lo = reduce(ReduceOp::kMin, exponent, std::nullopt, false).to(Device::cpu());  // read on the host
  int64_t mn = exponent.dtype() == DType::kInt32 ? *lo.data<int32_t>() : *lo.data<int64_t>();
  SL_CHECK(mn >= 0, ValueError, "pow: integers to negative integer powers are not allowed (smallest exponent ", mn,
           "); cast to a float dtype with as_type() first");
}

}  // namespace

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor out) {
  const char* name = op_name(op);
  check_defined(a, name, "lhs");
  check_defined(b, name, "rhs");
  check_same_dtype(name, a, b);
  check_same_device(name, a, b);
  check_arith_dtype(op, a);
  check_kernel_device(name, a);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  if (op == BinaryOp::kPow) check_int_pow_exponent(b);
  OutPlan p = plan_out(name, out, shape, result_dtype(op, a.dtype()), a.device(), {&a, &b});
  SL_KERNEL(p.out.device(), binary, op, p.out, a.broadcast_to(shape), b.broadcast_to(shape));
  return finish(p);
}

Tensor binary_scalar(BinaryOp op, const Tensor& a, double s, bool scalar_first, Tensor out) {
  const char* name = op_name(op);
  check_defined(a, name, "tensor");
  check_arith_dtype(op, a);
  check_kernel_device(name, a);
  if (!is_floating(a.dtype())) check_int_scalar(name, "the scalar", s, a.dtype());
  if (op == BinaryOp::kPow && !is_floating(a.dtype())) {
    if (scalar_first) check_int_pow_exponent(a);
    else SL_CHECK(s >= 0, ValueError, "pow: integers to negative integer powers are not allowed (exponent ", s,
                  "); cast to a float dtype with as_type() first");
  }
  OutPlan p = plan_out(name, out, a.shape(), result_dtype(op, a.dtype()), a.device(), {&a});
  SL_KERNEL(p.out.device(), binary_scalar, op, p.out, a, s, scalar_first);
  return finish(p);
}

Tensor unary(UnaryOp op, const Tensor& x, Tensor out) {
  const char* name = op_name(op);
  check_defined(x, name, "input");
  check_kernel_device(name, x);
  SL_CHECK(x.dtype() != DType::kBool, TypeError, name, ": not defined for bool tensors; cast with as_type() first");
  if (unary_domain(op) == UnaryDomain::Floating) check_floating(name, x);
  OutPlan p = plan_out(name, out, x.shape(), x.dtype(), x.device(), {&x});
  SL_KERNEL(p.out.device(), unary, op, p.out, x);
  return finish(p);
}

Tensor clip(const Tensor& x, std::optional<double> lo, std::optional<double> hi, Tensor out) {
  check_defined(x, "clip", "input");
  check_kernel_device("clip", x);
  SL_CHECK(x.dtype() != DType::kBool, TypeError, "clip: not defined for bool tensors");
  double l = lo.value_or(-INFINITY), h = hi.value_or(INFINITY);
  SL_CHECK(!(l > h), ValueError, "clip: min ", l, " is greater than max ", h);
  // Integer tensors: finite bounds must be integers (a bound of 1.5 truncated to 1 would let 1 < 1.5 through);
  // out-of-range bounds and the open infinities saturate in the kernel rather than being clamped to a finite
  // value first, which would clip int64 values beyond that value when no bound was given.
  if (!is_floating(x.dtype()))
    for (double b : {l, h})
      SL_CHECK(std::isinf(b) || std::nearbyint(b) == b, TypeError, "clip: the bound ", b,
               " is not an integer but the tensor is ", dtype_name(x.dtype()));
  OutPlan p = plan_out("clip", out, x.shape(), x.dtype(), x.device(), {&x});
  SL_KERNEL(p.out.device(), clip, p.out, x, l, h);
  return finish(p);
}

void axpy_(double alpha, const Tensor& x, const Tensor& y) {
  check_defined(x, "axpy", "x");
  check_defined(y, "axpy", "y");
  check_same_dtype("axpy", x, y);
  check_same_device("axpy", x, y);
  check_kernel_device("axpy", y);
  SL_CHECK(y.dtype() != DType::kBool, TypeError, "axpy: not defined for bool tensors");
  if (!is_floating(y.dtype())) check_int_scalar("axpy", "alpha", alpha, y.dtype());  // else 0.5 would become 0
  Shape shape = broadcast_shapes(x.shape(), y.shape(), "axpy");
  SL_CHECK(shape == y.shape(), ValueError, "axpy: x of shape ", shape_str(x.shape()),
           " does not broadcast to y's shape ", shape_str(y.shape()));
  if (partial_overlap(y, x)) {
    SL_KERNEL(y.device(), axpy, alpha, x.clone(), y);
    return;
  }
  SL_KERNEL(y.device(), axpy, alpha, x.broadcast_to(shape), y);
}

void fill_(const Tensor& t, double value) {
  check_defined(t, "fill", "tensor");
  if (!is_floating(t.dtype()) && t.dtype() != DType::kBool) check_int_scalar("fill", "the value", value, t.dtype());
#ifdef SINGA_LITE_WITH_CUDA
  if (t.device().is_cuda()) {
    cuda::fill(t, value);
    return;
  }
#endif
  check_kernel_device("fill", t);
  cpu::fill(t, value);
}

Tensor arange(double start, double stop, double step, DType dtype, Device device) {
  SL_CHECK(step != 0, ValueError, "arange: step cannot be zero");
  SL_CHECK(std::isfinite(start) && std::isfinite(stop) && std::isfinite(step), ValueError,
           "arange: start, stop and step must be finite, got ", start, ", ", stop, ", ", step);
  double n = std::ceil((stop - start) / step);
  int64_t len = n > 0 ? int64_t(n) : 0;
  SL_CHECK(dtype != DType::kBool, TypeError, "arange: bool is not a valid dtype");
  Tensor t = Tensor::empty({len}, dtype, Device::cpu());
  cpu::arange(t, start, step);
  return t.to(device);
}

void copy_(const Tensor& dst, const Tensor& src) {
  check_defined(dst, "copy", "destination");
  check_defined(src, "copy", "source");
  Shape shape = broadcast_shapes(src.shape(), dst.shape(), "copy");
  SL_CHECK(shape == dst.shape(), ValueError, "copy: source of shape ", shape_str(src.shape()),
           " does not broadcast to the destination's shape ", shape_str(dst.shape()));
  if (dst.device() == src.device()) {
    check_kernel_device("copy", dst);
    Tensor s = partial_overlap(dst, src) ? src.clone() : src;
    SL_KERNEL(dst.device(), copy, dst, s.broadcast_to(shape));
    return;
  }
#ifdef SINGA_LITE_WITH_CUDA
  // Across devices only packed bytes of one dtype move; broadcasting, casting and strides are handled on
  // one side by that device's copy kernel (on the GPU when it is involved: it is the faster side).
  if (src.device().is_cuda() && dst.device().is_cuda()) {  // two GPUs: through the host (peer copies later)
    copy_(dst, src.to(Device::cpu()));
    return;
  }
  if (src.device().is_cuda()) {  // GPU -> host: pack (and cast to dst's dtype) on the GPU, then move bytes
    Tensor packed = src.dtype() == dst.dtype() ? src.contiguous() : src.cast(dst.dtype());
    Tensor host = dst.is_contiguous() && shape == src.shape() ? dst : Tensor::empty(src.shape(), dst.dtype(), Device::cpu());
    cuda::copy_bytes(host.data_ptr(), packed.data_ptr(), packed.nbytes(), cuda::CopyKind::kDeviceToHost,
                     src.device().index);
    if (!host.shares_storage(dst)) cpu::copy(dst, host.broadcast_to(shape));
    return;
  }
  // host -> GPU: pack on the host in src's dtype, move the bytes, then broadcast / cast / scatter on the GPU
  Tensor packed = src.is_contiguous() ? src : src.contiguous();
  const bool direct = dst.is_contiguous() && dst.dtype() == src.dtype() && shape == src.shape() &&
                      !dst.shares_storage(src);
  Tensor staged = direct ? dst : Tensor::empty(src.shape(), src.dtype(), dst.device());
  cuda::copy_bytes(staged.data_ptr(), packed.data_ptr(), packed.nbytes(), cuda::CopyKind::kHostToDevice,
                   dst.device().index);
  if (!direct) cuda::copy(dst, staged.broadcast_to(shape));
#else
  throw ValueError(str("copy: ", (dst.device().is_cpu() ? src : dst).device().str(), " is not available: ",
                       cuda_unavailable_reason()));
#endif
}

}  // namespace sl
