// Fused optimizer updates: one pass over parameter, gradient and state instead of one op per term.
#include "core/errors.h"
#include "cpu/kernels.h"
#include "cpu/loop.h"

namespace sl::cpu {

// With d = g + wd * p:  buf = d (first step) or mom * buf + (1 - damp) * d;
// p -= lr * (nesterov ? d + mom * buf : buf).  Without a buffer (momentum 0): p -= lr * d.
void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& buf, const SgdStep& s) {
  SL_DISPATCH_FLOAT(param.dtype(), "sgd_update", [&] {
    using C = compute_t<scalar_t>;
    const C lr = C(s.lr), mom = C(s.momentum), keep = C(1.0 - s.dampening), wd = C(s.weight_decay);
    if (!buf.defined()) {
      StridedLoop<2> L({&param, &grad});
      for_each_row(L, [=](char* const* ptr, const int64_t* st, int64_t n) {
        scalar_t* p = reinterpret_cast<scalar_t*>(ptr[0]);
        const scalar_t* g = reinterpret_cast<const scalar_t*>(ptr[1]);
        const int64_t sp = st[0] / int64_t(sizeof(scalar_t)), sg = st[1] / int64_t(sizeof(scalar_t));
        for (int64_t i = 0; i < n; ++i) {
          const C pv = C(p[i * sp]);
          p[i * sp] = convert<scalar_t>(pv - lr * (C(g[i * sg]) + wd * pv));
        }
      });
      return;
    }
    const bool first = s.first, nesterov = s.nesterov;
    StridedLoop<3> L({&param, &grad, &buf});
    for_each_row(L, [=](char* const* ptr, const int64_t* st, int64_t n) {
      scalar_t* p = reinterpret_cast<scalar_t*>(ptr[0]);
      const scalar_t* g = reinterpret_cast<const scalar_t*>(ptr[1]);
      scalar_t* b = reinterpret_cast<scalar_t*>(ptr[2]);
      const int64_t sp = st[0] / int64_t(sizeof(scalar_t)), sg = st[1] / int64_t(sizeof(scalar_t)),
                    sb = st[2] / int64_t(sizeof(scalar_t));
      for (int64_t i = 0; i < n; ++i) {
        const C pv = C(p[i * sp]);
        const C d = C(g[i * sg]) + wd * pv;
        const C bv = first ? d : mom * C(b[i * sb]) + keep * d;
        b[i * sb] = convert<scalar_t>(bv);
        p[i * sp] = convert<scalar_t>(pv - lr * (nesterov ? d + mom * bv : bv));
      }
    });
  });
}

}  // namespace sl::cpu
