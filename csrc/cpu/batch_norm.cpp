// Batch normalisation in training mode on the CPU, per channel of x (N, C, L) (L = H*W, or 1 for (N, C)), in
// two passes over memory each way where the composed element-wise ops took about a dozen:
//   forward:  the channel's mean, then its biased variance around that mean (two reads), then y = a*x + b;
//   backward: sum(dy) and sum(dy * (x - mean)) in one read, then dx = p*dy + q*x + r.
// One channel is one task, its sums taken in a fixed order (8 double lanes over the channel's elements, then
// the lanes in order), so the results do not depend on the thread count; the lanes let the compiler vectorise
// without reassociating anything.
#include "cpu/batch_norm.h"

#include <cmath>
#include <cstdint>

#include "core/errors.h"
#include "cpu/loop.h"

namespace sl::cpu {
namespace {

constexpr int kLanes = 8;

// sum over the channel's N rows of L elements of f(element index within the row, row pointer offset).
template <typename F>
double channel_sum(int64_t N, int64_t row_stride, int64_t L, F&& f) {
  double lanes[kLanes] = {};
  double tail = 0;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t base = n * row_stride;
    int64_t l = 0;
    for (; l + kLanes <= L; l += kLanes)
      for (int j = 0; j < kLanes; ++j) lanes[j] += f(base + l + j);
    for (; l < L; ++l) tail += f(base + l);
  }
  double s = tail;
  for (int j = 0; j < kLanes; ++j) s += lanes[j];
  return s;
}

template <typename T>
void forward_channels(const T* x, const T* scale, const T* bias, double eps, T* y, T* mean, T* var, T* inv_std,
                      int64_t N, int64_t C, int64_t L, int64_t c0, int64_t c1) {
  const double M = double(N * L);
  for (int64_t c = c0; c < c1; ++c) {
    const T* xc = x + c * L;
    const double mu = channel_sum(N, C * L, L, [&](int64_t i) { return double(xc[i]); }) / M;
    const double v = channel_sum(N, C * L, L, [&](int64_t i) {
      const double d = double(xc[i]) - mu;
      return d * d;
    }) / M;
    const double is = 1.0 / std::sqrt(v + eps);
    const T a = T(double(scale[c]) * is), b = T(double(bias[c]) - mu * double(scale[c]) * is);
    T* yc = y + c * L;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t l = 0; l < L; ++l) yc[n * C * L + l] = xc[n * C * L + l] * a + b;
    mean[c] = T(mu), var[c] = T(v), inv_std[c] = T(is);
  }
}

template <typename T>
void backward_channels(const T* x, const T* dy, const T* mean, const T* inv_std, const T* scale, T* dx, T* dscale,
                       T* dbias, int64_t N, int64_t C, int64_t L, int64_t c0, int64_t c1) {
  const double M = double(N * L);
  for (int64_t c = c0; c < c1; ++c) {
    const T* xc = x + c * L;
    const T* dyc = dy + c * L;
    const double mu = double(mean[c]), is = double(inv_std[c]);
    const double sdy = channel_sum(N, C * L, L, [&](int64_t i) { return double(dyc[i]); });
    const double sdyx = channel_sum(N, C * L, L, [&](int64_t i) { return double(dyc[i]) * (double(xc[i]) - mu); });
    const double ds = sdyx * is;  // d scale = sum(dy * xhat)
    dscale[c] = T(ds), dbias[c] = T(sdy);
    if (!dx) continue;
    // dx = scale * inv_std / M * (M * dy - sum(dy) - xhat * dscale), xhat = (x - mean) * inv_std
    const double a = double(scale[c]) * is;
    const T p = T(a), q = T(-a * is * ds / M), r = T(a * (-sdy / M + mu * is * ds / M));
    T* dxc = dx + c * L;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t l = 0; l < L; ++l) {
        const int64_t i = n * C * L + l;
        dxc[i] = dyc[i] * p + xc[i] * q + r;
      }
  }
}

void check_args(const char* op, const Tensor& x, std::initializer_list<const Tensor*> per_channel) {
  SL_CHECK(x.device().is_cpu(), ValueError, op, ": expected CPU tensors");
  SL_CHECK(x.dtype() == DType::kFloat32 || x.dtype() == DType::kFloat64, TypeError, op,
           ": expected float32 or float64, got ", dtype_name(x.dtype()));
  SL_CHECK(x.ndim() == 2 || x.ndim() == 4, ValueError, op, ": expected x of shape (N, C, H, W) or (N, C), got ",
           shape_str(x.shape()));
  for (const Tensor* t : per_channel)
    SL_CHECK(t->dtype() == x.dtype() && t->device().is_cpu() && t->shape() == Shape{x.shape()[1]}, ValueError, op,
             ": per-channel tensors must be (", x.shape()[1], ",) of x's dtype on the CPU, got ",
             shape_str(t->shape()), " ", dtype_name(t->dtype()));
}

}  // namespace

BatchNormForward batch_norm_train_forward(const Tensor& x_in, const Tensor& scale_in, const Tensor& bias_in,
                                          double eps) {
  check_args("batch_norm_train_forward", x_in, {&scale_in, &bias_in});
  const Tensor x = x_in.contiguous(), scale = scale_in.contiguous(), bias = bias_in.contiguous();
  const int64_t N = x.shape()[0], C = x.shape()[1], L = x.ndim() == 4 ? x.shape()[2] * x.shape()[3] : 1;
  SL_CHECK(N * L > 1, ValueError, "batch_norm_train_forward: training needs more than one value per channel, x has ",
           "shape ", shape_str(x.shape()));
  BatchNormForward out{Tensor::empty(x.shape(), x.dtype(), x.device()), Tensor::empty({C}, x.dtype(), x.device()),
                       Tensor::empty({C}, x.dtype(), x.device()), Tensor::empty({C}, x.dtype(), x.device())};
  auto run = [&](auto zero) {
    using T = decltype(zero);
    parallel_range(C, [&](int64_t c0, int64_t c1) {
      forward_channels<T>(x.data<T>(), scale.data<T>(), bias.data<T>(), eps, out.y.data<T>(), out.mean.data<T>(),
                          out.var.data<T>(), out.inv_std.data<T>(), N, C, L, c0, c1);
    }, 4 * N * L);
  };
  if (x.dtype() == DType::kFloat32) run(float()); else run(double());
  return out;
}

BatchNormBackward batch_norm_train_backward(const Tensor& x_in, const Tensor& dy_in, const Tensor& mean,
                                            const Tensor& inv_std, const Tensor& scale_in, bool need_dx) {
  check_args("batch_norm_train_backward", x_in, {&mean, &inv_std, &scale_in});
  SL_CHECK(dy_in.shape() == x_in.shape() && dy_in.dtype() == x_in.dtype() && dy_in.device().is_cpu(), ValueError,
           "batch_norm_train_backward: dy ", shape_str(dy_in.shape()), " must match x ", shape_str(x_in.shape()));
  const Tensor x = x_in.contiguous(), dy = dy_in.contiguous(), m = mean.contiguous(), is = inv_std.contiguous(),
               scale = scale_in.contiguous();
  const int64_t N = x.shape()[0], C = x.shape()[1], L = x.ndim() == 4 ? x.shape()[2] * x.shape()[3] : 1;
  BatchNormBackward out{need_dx ? Tensor::empty(x.shape(), x.dtype(), x.device()) : Tensor(),
                        Tensor::empty({C}, x.dtype(), x.device()), Tensor::empty({C}, x.dtype(), x.device())};
  auto run = [&](auto zero) {
    using T = decltype(zero);
    parallel_range(C, [&](int64_t c0, int64_t c1) {
      backward_channels<T>(x.data<T>(), dy.data<T>(), m.data<T>(), is.data<T>(), scale.data<T>(),
                           need_dx ? out.dx.data<T>() : nullptr, out.dscale.data<T>(), out.dbias.data<T>(), N, C, L,
                           c0, c1);
    }, 5 * N * L);
  };
  if (x.dtype() == DType::kFloat32) run(float()); else run(double());
  return out;
}

}  // namespace sl::cpu
