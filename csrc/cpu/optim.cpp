// Fused optimizer updates: one pass over parameter, gradient and state instead of one op per term.
#include "core/errors.h"
#include "cpu/kernels.h"
#include "cpu/loop.h"

namespace sl::cpu {
namespace {

// One element of an SGD step with a momentum buffer. The flags are template parameters so that each
// variant's loop is branch-free and vectorises (with a run-time flag in the loop it does not, and loses to
// the three separate ops it replaces).
template <bool kFirst, bool kNesterov, typename C>
inline void sgd_momentum_element(C& p, C& b, C g, C lr, C mom, C keep, C wd) {
  const C d = g + wd * p;
  const C bv = kFirst ? d : mom * b + keep * d;
  b = bv;
  p = p - lr * (kNesterov ? d + mom * bv : bv);
}

template <bool kFirst, bool kNesterov, typename T>
void sgd_momentum(const Tensor& param, const Tensor& grad, const Tensor& buf, const SgdStep& s) {
  using C = compute_t<T>;
  const C lr = C(s.lr), mom = C(s.momentum), keep = C(1.0 - s.dampening), wd = C(s.weight_decay);
  StridedLoop<3> L({&param, &grad, &buf});
  for_each_row(L, [=](char* const* ptr, const int64_t* st, int64_t n) {
    T* p = reinterpret_cast<T*>(ptr[0]);
    const T* g = reinterpret_cast<const T*>(ptr[1]);
    T* b = reinterpret_cast<T*>(ptr[2]);
    const int64_t sp = st[0] / int64_t(sizeof(T)), sg = st[1] / int64_t(sizeof(T)), sb = st[2] / int64_t(sizeof(T));
    auto one = [&](int64_t ip, int64_t ig, int64_t ib) {
      C pv = C(p[ip]), bv = C(b[ib]);
      sgd_momentum_element<kFirst, kNesterov>(pv, bv, C(g[ig]), lr, mom, keep, wd);
      p[ip] = convert<T>(pv);
      b[ib] = convert<T>(bv);
    };
    if (sp == 1 && sg == 1 && sb == 1) {
      for (int64_t i = 0; i < n; ++i) one(i, i, i);
    } else {
      for (int64_t i = 0; i < n; ++i) one(i * sp, i * sg, i * sb);
    }
  });
}

template <typename T>
void sgd_plain(const Tensor& param, const Tensor& grad, const SgdStep& s) {
  using C = compute_t<T>;
  const C lr = C(s.lr), wd = C(s.weight_decay);
  StridedLoop<2> L({&param, &grad});
  for_each_row(L, [=](char* const* ptr, const int64_t* st, int64_t n) {
    T* p = reinterpret_cast<T*>(ptr[0]);
    const T* g = reinterpret_cast<const T*>(ptr[1]);
    const int64_t sp = st[0] / int64_t(sizeof(T)), sg = st[1] / int64_t(sizeof(T));
    auto one = [&](int64_t ip, int64_t ig) {
      const C pv = C(p[ip]);
      p[ip] = convert<T>(pv - lr * (C(g[ig]) + wd * pv));
    };
    if (sp == 1 && sg == 1) {
      for (int64_t i = 0; i < n; ++i) one(i, i);
    } else {
      for (int64_t i = 0; i < n; ++i) one(i * sp, i * sg);
    }
  });
}

}  // namespace

// With d = g + wd * p:  buf = d (first step) or mom * buf + (1 - damp) * d;
// p -= lr * (nesterov ? d + mom * buf : buf).  Without a buffer (momentum 0): p -= lr * d.
void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& buf, const SgdStep& s) {
  SL_DISPATCH_FLOAT(param.dtype(), "sgd_update", [&] {
    if (!buf.defined()) return sgd_plain<scalar_t>(param, grad, s);
    if (s.first)
      return s.nesterov ? sgd_momentum<true, true, scalar_t>(param, grad, buf, s)
                        : sgd_momentum<true, false, scalar_t>(param, grad, buf, s);
    return s.nesterov ? sgd_momentum<false, true, scalar_t>(param, grad, buf, s)
                      : sgd_momentum<false, false, scalar_t>(param, grad, buf, s);
  });
}

}  // namespace sl::cpu
