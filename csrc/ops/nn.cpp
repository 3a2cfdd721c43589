// Front-ends of im2col / col2im and 2-D pooling: shape and geometry checks (PyTorch's rules), then the
// kernel on a contiguous input.
#include "ops/dispatch.h"
#include "ops/checks.h"
#include "ops/ops.h"

namespace sl {
namespace {

void check_nchw(const char* op, const Tensor& x) {
  check_defined(x, op, "input");
  check_kernel_device(op, x);
  check_floating(op, x);
  SL_CHECK(x.ndim() == 4, ValueError, op, ": expected a 4-D NCHW tensor, got shape ", shape_str(x.shape()));
}

void check_positive(const char* op, const char* what, Pair v, int64_t min) {
  SL_CHECK(v[0] >= min && v[1] >= min, ValueError, op, ": ", what, " must be >= ", min, ", got (", v[0], ", ",
           v[1], ")");
}

// Checked arithmetic: huge kernels, paddings or dilations could wrap around, and a wrapped output size would
// size a buffer that the kernel then overruns (UBSan's finding, docs/reliability.md "Sanitizers"). With these sums and products in range, the
// kernels' index arithmetic (oh * stride - pad + kh * dilation, ...) stays in range too.
int64_t out_size(const char* op, int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, const char* axis) {
  const int64_t span = checked_add(op, checked_mul(op, d, k - 1), 1);
  const int64_t padded = checked_add(op, in, checked_mul(op, 2, p));
  SL_CHECK(padded >= span, ValueError, op, ": the ", axis, " of the padded input (", in, " + 2*", p,
           ") is smaller than the kernel's extent ", span);
  return (padded - span) / s + 1;
}

// (C * kh * kw, N * out_h * out_w): the shape of im2col's columns.
Shape cols_shape(const char* op, const Shape& x, const Conv2dGeometry& g) {
  return {checked_mul(op, checked_mul(op, x[1], g.kernel_h), g.kernel_w),
          checked_mul(op, checked_mul(op, x[0], g.out_h), g.out_w)};
}

Conv2dGeometry conv_geometry(const char* op, const Shape& x, Pair k, Pair s, Pair p, Pair d) {
  check_positive(op, "kernel", k, 1);
  check_positive(op, "stride", s, 1);
  check_positive(op, "padding", p, 0);
  check_positive(op, "dilation", d, 1);
  return {k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1], out_size(op, x[2], k[0], s[0], p[0], d[0], "height"),
          out_size(op, x[3], k[1], s[1], p[1], d[1], "width")};
}

Pool2dGeometry pool_geometry(const char* op, const Shape& x, Pair k, Pair s, Pair p) {
  check_positive(op, "kernel", k, 1);
  check_positive(op, "stride", s, 1);
  check_positive(op, "padding", p, 0);
  SL_CHECK(p[0] <= k[0] / 2 && p[1] <= k[1] / 2, ValueError, op, ": padding (", p[0], ", ", p[1],
           ") must be at most half the kernel (", k[0], ", ", k[1], ")");
  return {k[0], k[1], s[0], s[1], p[0], p[1], out_size(op, x[2], k[0], s[0], p[0], 1, "height"),
          out_size(op, x[3], k[1], s[1], p[1], 1, "width")};
}

}  // namespace

Tensor im2col(const Tensor& x, Pair kernel, Pair stride, Pair padding, Pair dilation) {
  check_nchw("im2col", x);
  Conv2dGeometry g = conv_geometry("im2col", x.shape(), kernel, stride, padding, dilation);
  Tensor cols = Tensor::empty(cols_shape("im2col", x.shape(), g), x.dtype(), x.device());
  SL_KERNEL(cols.device(), im2col, cols, x.contiguous(), g);
  return cols;
}

Tensor col2im(const Tensor& cols, const Shape& x_shape, Pair kernel, Pair stride, Pair padding, Pair dilation) {
  check_defined(cols, "col2im", "cols");
  check_kernel_device("col2im", cols);
  check_floating("col2im", cols);
  SL_CHECK(x_shape.size() == 4, ValueError, "col2im: expected a 4-D NCHW image shape, got ", shape_str(x_shape));
  Conv2dGeometry g = conv_geometry("col2im", x_shape, kernel, stride, padding, dilation);
  Shape want = cols_shape("col2im", x_shape, g);
  SL_CHECK(cols.shape() == want, ValueError, "col2im: cols has shape ", shape_str(cols.shape()), ", expected ",
           shape_str(want), " for images of shape ", shape_str(x_shape));
  Tensor x = Tensor::empty(x_shape, cols.dtype(), cols.device());
  SL_KERNEL(x.device(), col2im, x, cols.contiguous(), g);
  return x;
}

std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding) {
  check_nchw("max_pool2d", x);
  Pool2dGeometry g = pool_geometry("max_pool2d", x.shape(), kernel, stride, padding);
  Shape shape = {x.shape()[0], x.shape()[1], g.out_h, g.out_w};
  Tensor y = Tensor::empty(shape, x.dtype(), x.device());
  Tensor argmax = Tensor::empty(shape, DType::kInt64, x.device());
  SL_KERNEL(y.device(), max_pool2d, y, argmax, x.contiguous(), g);
  return {y, argmax};
}

Tensor max_pool2d_backward(const Tensor& dy, const Tensor& argmax, const Shape& x_shape) {
  check_nchw("max_pool2d_backward", dy);
  check_defined(argmax, "max_pool2d_backward", "argmax");
  SL_CHECK(argmax.dtype() == DType::kInt64 && argmax.shape() == dy.shape(), ValueError,
           "max_pool2d_backward: argmax must be the int64 tensor max_pool2d returned with dy's shape ",
           shape_str(dy.shape()), ", got ", dtype_name(argmax.dtype()), " ", shape_str(argmax.shape()));
  SL_CHECK(x_shape.size() == 4 && x_shape[0] == dy.shape()[0] && x_shape[1] == dy.shape()[1], ValueError,
           "max_pool2d_backward: input shape ", shape_str(x_shape), " does not match dy ", shape_str(dy.shape()));
  Tensor dx = Tensor::empty(x_shape, dy.dtype(), dy.device());
  // The kernel adds dy at dx[argmax] within each image: an index beyond the image would write past it.
  // max_pool2d gives -1 for a window that lies wholly in the padding. The CPU kernel checks the positions in
  // its own pass; the others are checked here first, with two reductions.
  if (dx.numel() == 0) return dx;  // (its H * W alone may not fit in int64)
  const int64_t hw = x_shape[2] * x_shape[3];  // dx holds N * C * H * W > 0 elements, so this fits
  if (argmax.numel() > 0 && !dx.device().is_cpu()) {
    Tensor lo = reduce(ReduceOp::kMin, argmax, std::nullopt, false).to(Device::cpu());
    Tensor hi = reduce(ReduceOp::kMax, argmax, std::nullopt, false).to(Device::cpu());
    SL_CHECK(*lo.data<int64_t>() >= -1 && *hi.data<int64_t>() < hw, IndexError,
             "max_pool2d_backward: argmax must hold positions in [-1, ", hw, ") of an input image of shape ",
             shape_str(x_shape), ", got values in [", *lo.data<int64_t>(), ", ", *hi.data<int64_t>(),
             "]; pass the argmax that max_pool2d returned for this input");
  }
  SL_KERNEL(dx.device(), max_pool2d_backward, dx, dy.contiguous(), argmax.contiguous());
  return dx;
}

Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding, bool count_include_pad) {
  check_nchw("avg_pool2d", x);
  Pool2dGeometry g = pool_geometry("avg_pool2d", x.shape(), kernel, stride, padding);
  Tensor y = Tensor::empty({x.shape()[0], x.shape()[1], g.out_h, g.out_w}, x.dtype(), x.device());
  SL_KERNEL(y.device(), avg_pool2d, y, x.contiguous(), g, count_include_pad);
  return y;
}

Tensor avg_pool2d_backward(const Tensor& dy, const Shape& x_shape, Pair kernel, Pair stride, Pair padding,
                           bool count_include_pad) {
  check_nchw("avg_pool2d_backward", dy);
  SL_CHECK(x_shape.size() == 4, ValueError, "avg_pool2d_backward: expected a 4-D input shape, got ",
           shape_str(x_shape));
  Pool2dGeometry g = pool_geometry("avg_pool2d_backward", x_shape, kernel, stride, padding);
  Shape want = {x_shape[0], x_shape[1], g.out_h, g.out_w};
  SL_CHECK(dy.shape() == want, ValueError, "avg_pool2d_backward: dy has shape ", shape_str(dy.shape()),
           ", expected ", shape_str(want));
  Tensor dx = Tensor::empty(x_shape, dy.dtype(), dy.device());
  SL_KERNEL(dx.device(), avg_pool2d_backward, dx, dy.contiguous(), g, count_include_pad);
  return dx;
}

}  // namespace sl
