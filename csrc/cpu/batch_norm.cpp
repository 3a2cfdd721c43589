// Batch normalisation in training mode on the CPU, per channel of x (N, C, L) (L = H*W, or 1 for (N, C)), in
// two passes over memory each way where the composed element-wise ops took about a dozen:
//   forward:  the channel's mean, then its biased variance around that mean (two reads), then y = a*x + b;
//   backward: sum(dy) and sum(dy * (x - mean)) in one read, then dx = p*dy + q*x + r.
// One channel is one task, its sums taken in a fixed order (8 double lanes over the channel's elements, then
// the lanes in order), so the results depend neither on the thread count nor on the instruction-set level the
// loops were compiled for (cpu/isa.h); the lanes let the compiler vectorise without reassociating anything.
#include "cpu/batch_norm.h"

#include <cmath>
#include <cstdint>

#include "core/errors.h"
#include "cpu/isa.h"
#include "cpu/loop.h"

namespace sl::cpu {
namespace {

constexpr int kLanes = 8;

// The per-channel loops, compiled per instruction-set level (cpu/isa.h) and written without calls, which would
// be compiled for baseline only. Each sum keeps kLanes double accumulators combined in a fixed order, so every
// level (and any thread count) performs the same operations.
#define SL_CHANNEL_SUM(result, expr)                                    \
  do {                                                                  \
    double lanes_[kLanes] = {}, tail_ = 0;                              \
    for (int64_t n = 0; n < N; ++n) {                                   \
      const int64_t base = n * C * L;                                   \
      int64_t l = 0;                                                    \
      for (; l + kLanes <= L; l += kLanes)                              \
        for (int j = 0; j < kLanes; ++j) {                              \
          const int64_t i = base + l + j;                               \
          lanes_[j] += (expr);                                          \
        }                                                               \
      for (; l < L; ++l) {                                              \
        const int64_t i = base + l;                                     \
        tail_ += (expr);                                                \
      }                                                                 \
    }                                                                   \
    result = tail_;                                                     \
    for (int j = 0; j < kLanes; ++j) result += lanes_[j];               \
  } while (0)

template <typename T>
struct ForwardChannels {
  template <Isa Level>
  static SL_ISA_INLINE void run(const T* x, const T* scale, const T* bias, double eps, T* y, T* mean, T* var,
                                T* inv_std, int64_t N, int64_t C, int64_t L, int64_t c0, int64_t c1) {
    const double M = double(N * L);
    for (int64_t c = c0; c < c1; ++c) {
      const T* xc = x + c * L;
      double mu, v;
      SL_CHANNEL_SUM(mu, double(xc[i]));
      mu /= M;
      SL_CHANNEL_SUM(v, (double(xc[i]) - mu) * (double(xc[i]) - mu));
      v /= M;
      const double is = 1.0 / std::sqrt(v + eps);
      const T a = T(double(scale[c]) * is), b = T(double(bias[c]) - mu * double(scale[c]) * is);
      T* yc = y + c * L;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t l = 0; l < L; ++l) yc[n * C * L + l] = xc[n * C * L + l] * a + b;
      mean[c] = T(mu), var[c] = T(v), inv_std[c] = T(is);
    }
  }
};

template <typename T>
struct BackwardChannels {
  template <Isa Level>
  static SL_ISA_INLINE void run(const T* x, const T* dy, const T* mean, const T* inv_std, const T* scale, T* dx,
                                T* dscale, T* dbias, int64_t N, int64_t C, int64_t L, int64_t c0, int64_t c1) {
    const double M = double(N * L);
    for (int64_t c = c0; c < c1; ++c) {
      const T* xc = x + c * L;
      const T* dyc = dy + c * L;
      const double mu = double(mean[c]), is = double(inv_std[c]);
      double sdy, sdyx;
      SL_CHANNEL_SUM(sdy, double(dyc[i]));
      SL_CHANNEL_SUM(sdyx, double(dyc[i]) * (double(xc[i]) - mu));
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
};

#undef SL_CHANNEL_SUM

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
      run_isa<ForwardChannels<T>>(x.data<T>(), scale.data<T>(), bias.data<T>(), eps, out.y.data<T>(),
                                  out.mean.data<T>(), out.var.data<T>(), out.inv_std.data<T>(), N, C, L, c0, c1);
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
      run_isa<BackwardChannels<T>>(x.data<T>(), dy.data<T>(), m.data<T>(), is.data<T>(), scale.data<T>(),
                                   need_dx ? out.dx.data<T>() : nullptr, out.dscale.data<T>(), out.dbias.data<T>(),
                                   N, C, L, c0, c1);
    }, 5 * N * L);
  };
  if (x.dtype() == DType::kFloat32) run(float()); else run(double());
  return out;
}

}  // namespace sl::cpu
