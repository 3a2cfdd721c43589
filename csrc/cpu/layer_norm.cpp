// Layer normalisation on the CPU, one row of x (R, C) at a time, where the composed element-wise ops (and the
// Python operator built on them) made about seven passes over memory forward and eleven backward:
//   forward:  the row's mean, then its biased variance around that mean, then y = (x - mean) * inv_std * g + b,
//             all while the row is in cache;
//   backward: per row sum(g) and sum(g * xhat) (g = dy * gamma), then dx = inv_std * (g - mean(g) - xhat *
//             mean(g * xhat)); dgamma = sum over rows of dy * xhat and dbeta = sum of dy, as partial sums per
//             block of kBlockRows rows added in block order.
// Sums use kLanes double lanes combined in a fixed order (as cpu/batch_norm.cpp), and row blocks do not depend on
// the thread count: the same bits for any thread count and on every instruction-set level (cpu/isa.h).
#include "cpu/layer_norm.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/errors.h"
#include "cpu/isa.h"
#include "cpu/loop.h"

namespace sl::cpu {
namespace {

constexpr int kLanes = 8;
constexpr int64_t kBlockRows = 32;

#define SL_ROW_SUM(result, expr)                                        \
  do {                                                                  \
    double lanes_[kLanes] = {}, tail_ = 0;                              \
    int64_t c = 0;                                                      \
    for (; c + kLanes <= C; c += kLanes)                                \
      for (int j = 0; j < kLanes; ++j) {                                \
        const int64_t i = c + j;                                        \
        lanes_[j] += (expr);                                            \
      }                                                                 \
    for (; c < C; ++c) {                                                \
      const int64_t i = c;                                              \
      tail_ += (expr);                                                  \
    }                                                                   \
    result = tail_;                                                     \
    for (int j = 0; j < kLanes; ++j) result += lanes_[j];               \
  } while (0)

template <typename T>
struct ForwardRows {
  template <Isa Level>
  static SL_ISA_INLINE void run(const T* x, const T* gamma, const T* beta, double eps, T* y, T* mean, T* inv_std,
                                int64_t C, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * C;
      T* yr = y + r * C;
      double mu, v;
      SL_ROW_SUM(mu, double(xr[i]));
      mu /= double(C);
      SL_ROW_SUM(v, (double(xr[i]) - mu) * (double(xr[i]) - mu));
      const double is = 1.0 / std::sqrt(v / double(C) + eps);
      const T m = T(mu), s = T(is);
      if (gamma && beta) {
        for (int64_t i = 0; i < C; ++i) yr[i] = (xr[i] - m) * s * gamma[i] + beta[i];
      } else if (gamma) {
        for (int64_t i = 0; i < C; ++i) yr[i] = (xr[i] - m) * s * gamma[i];
      } else {
        for (int64_t i = 0; i < C; ++i) yr[i] = (xr[i] - m) * s;
      }
      mean[r] = m, inv_std[r] = s;
    }
  }
};

// Rows [b * kBlockRows, ...) of blocks [b0, b1): dx, and the blocks' partial column sums of dy * xhat (into
// pg + b * C) and dy (pb + b * C).
template <typename T>
struct BackwardRows {
  template <Isa Level>
  static SL_ISA_INLINE void run(const T* x, const T* dy, const T* mean, const T* inv_std, const T* gamma, T* dx,
                                double* pg, double* pb, int64_t R, int64_t C, int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      double* g_acc = pg ? pg + b * C : nullptr;
      double* b_acc = pb ? pb + b * C : nullptr;
      if (g_acc)
        for (int64_t i = 0; i < C; ++i) g_acc[i] = 0;
      if (b_acc)
        for (int64_t i = 0; i < C; ++i) b_acc[i] = 0;
      const int64_t stop = std::min(R, (b + 1) * kBlockRows);
      for (int64_t r = b * kBlockRows; r < stop; ++r) {
        const T* xr = x + r * C;
        const T* dyr = dy + r * C;
        const T m = mean[r], s = inv_std[r];
        if (g_acc)
          for (int64_t i = 0; i < C; ++i) g_acc[i] += double(dyr[i]) * double((xr[i] - m) * s);
        if (b_acc)
          for (int64_t i = 0; i < C; ++i) b_acc[i] += double(dyr[i]);
        double sg, sgx;
        if (gamma) {
          SL_ROW_SUM(sg, double(dyr[i] * gamma[i]));
          SL_ROW_SUM(sgx, double(dyr[i] * gamma[i]) * double((xr[i] - m) * s));
        } else {
          SL_ROW_SUM(sg, double(dyr[i]));
          SL_ROW_SUM(sgx, double(dyr[i]) * double((xr[i] - m) * s));
        }
        const T a = T(sg / double(C)), bb = T(sgx / double(C));
        T* dxr = dx + r * C;
        if (gamma) {
          for (int64_t i = 0; i < C; ++i) dxr[i] = (dyr[i] * gamma[i] - a - (xr[i] - m) * s * bb) * s;
        } else {
          for (int64_t i = 0; i < C; ++i) dxr[i] = (dyr[i] - a - (xr[i] - m) * s * bb) * s;
        }
      }
    }
  }
};

#undef SL_ROW_SUM

void check_x(const char* op, const Tensor& x, int64_t cols) {
  SL_CHECK(x.device().is_cpu(), ValueError, op, ": expected CPU tensors");
  SL_CHECK(x.dtype() == DType::kFloat32 || x.dtype() == DType::kFloat64, TypeError, op,
           ": expected float32 or float64, got ", dtype_name(x.dtype()));
  SL_CHECK(cols > 0 && x.numel() % cols == 0, ValueError, op, ": cannot normalise x of shape ", shape_str(x.shape()),
           " over rows of ", cols);
}

void check_vec(const char* op, const Tensor& x, const Tensor& t, int64_t n, const char* what) {
  if (!t.defined()) return;
  SL_CHECK(t.dtype() == x.dtype() && t.device().is_cpu() && t.numel() == n, ValueError, op, ": ", what,
           " must have ", n, " values of x's dtype on the CPU, got ", shape_str(t.shape()), " ", dtype_name(t.dtype()));
}

}  // namespace

LayerNormForward layer_norm_forward(const Tensor& x_in, int64_t cols, const Tensor& gamma_in, const Tensor& beta_in,
                                    double eps) {
  const char* op = "layer_norm_forward";
  check_x(op, x_in, cols);
  check_vec(op, x_in, gamma_in, cols, "gamma");
  check_vec(op, x_in, beta_in, cols, "beta");
  SL_CHECK(!beta_in.defined() || gamma_in.defined(), ValueError, op, ": beta needs gamma");
  const Tensor x = x_in.contiguous();
  const Tensor gamma = gamma_in.defined() ? gamma_in.contiguous() : Tensor();
  const Tensor beta = beta_in.defined() ? beta_in.contiguous() : Tensor();
  const int64_t R = x.numel() / cols;
  LayerNormForward out{Tensor::empty(x.shape(), x.dtype(), x.device()), Tensor::empty({R}, x.dtype(), x.device()),
                       Tensor::empty({R}, x.dtype(), x.device())};
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const T* g = gamma.defined() ? gamma.data<T>() : nullptr;
    const T* b = beta.defined() ? beta.data<T>() : nullptr;
    parallel_range(R, [&](int64_t r0, int64_t r1) {
      run_isa<ForwardRows<T>>(x.data<T>(), g, b, eps, out.y.data<T>(), out.mean.data<T>(), out.inv_std.data<T>(),
                              cols, r0, r1);
    }, 4 * cols);
  };
  if (x.dtype() == DType::kFloat32) run(float()); else run(double());
  return out;
}

LayerNormBackward layer_norm_backward(const Tensor& x_in, const Tensor& dy_in, const Tensor& mean_in,
                                      const Tensor& inv_std_in, const Tensor& gamma_in, bool need_beta) {
  const char* op = "layer_norm_backward";
  const int64_t cols = mean_in.numel() > 0 ? x_in.numel() / mean_in.numel() : 1;
  check_x(op, x_in, cols);
  SL_CHECK(dy_in.shape() == x_in.shape() && dy_in.dtype() == x_in.dtype() && dy_in.device().is_cpu(), ValueError,
           op, ": dy ", shape_str(dy_in.shape()), " must match x ", shape_str(x_in.shape()));
  const int64_t R = mean_in.numel();
  check_vec(op, x_in, inv_std_in, R, "inv_std");
  check_vec(op, x_in, gamma_in, cols, "gamma");
  const Tensor x = x_in.contiguous(), dy = dy_in.contiguous(), mean = mean_in.contiguous(),
               inv_std = inv_std_in.contiguous();
  const Tensor gamma = gamma_in.defined() ? gamma_in.contiguous() : Tensor();
  const int64_t blocks = (R + kBlockRows - 1) / kBlockRows;
  std::vector<double> pg(gamma.defined() ? size_t(blocks * cols) : 0), pb(need_beta ? size_t(blocks * cols) : 0);
  LayerNormBackward out{Tensor::empty(x.shape(), x.dtype(), x.device()), Tensor(), Tensor()};
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const T* g = gamma.defined() ? gamma.data<T>() : nullptr;
    parallel_range(blocks, [&](int64_t b0, int64_t b1) {
      run_isa<BackwardRows<T>>(x.data<T>(), dy.data<T>(), mean.data<T>(), inv_std.data<T>(), g, out.dx.data<T>(),
                               pg.empty() ? nullptr : pg.data(), pb.empty() ? nullptr : pb.data(), R, cols, b0, b1);
    }, 8 * kBlockRows * cols);
    // The blocks' partial sums, added in block order: the same result for any thread count.
    auto total = [&](const std::vector<double>& part) {
      Tensor t = Tensor::empty({cols}, x.dtype(), x.device());
      T* o = t.data<T>();
      for (int64_t i = 0; i < cols; ++i) {
        double s = 0;
        for (int64_t b = 0; b < blocks; ++b) s += part[size_t(b * cols + i)];
        o[i] = T(s);
      }
      return t;
    };
    if (!pg.empty()) out.dgamma = total(pg);
    if (!pb.empty()) out.dbeta = total(pb);
  };
  if (x.dtype() == DType::kFloat32) run(float()); else run(double());
  return out;
}

}  // namespace sl::cpu
