// Sparse-exchange kernels for DistOpt's sparsification: pick the significant entries of a flat vector,
// gather them, and add (index, value) pairs back into a dense vector.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/errors.h"
#include "cpu/kernels.h"
#include "cpu/loop.h"

namespace sl::cpu {
namespace {

// |v|, with NaN ordered above everything: a NaN gradient is always sent, so the step's finiteness vote
// sees it (and the selection stays a strict weak order).
template <typename C>
double magnitude(C v) {
  return std::isnan(double(v)) ? std::numeric_limits<double>::infinity() : std::fabs(double(v));
}

}  // namespace

Tensor select_significant(const Tensor& x, double spars, int64_t k) {
  std::vector<int64_t> chosen;
  SL_DISPATCH_FLOAT(x.dtype(), "select_significant", [&] {
    const scalar_t* p = x.data<scalar_t>();
    const int64_t n = x.numel();
    auto mag = [&](int64_t i) { return magnitude(compute_t<scalar_t>(p[i])); };
    if (k < 0) {  // threshold mode: every |v| >= spars
      for (int64_t i = 0; i < n; ++i)
        if (mag(i) >= spars) chosen.push_back(i);
      return;
    }
    chosen.resize(size_t(n));
    std::iota(chosen.begin(), chosen.end(), int64_t(0));
    if (k < n) {  // linear-time selection of the k largest, then back to ascending index order
      // Among equal magnitudes the lower index wins, so the choice at the cut is defined (the GPU's stable radix
      // sort makes the same one, cuda/sparse.cu): a gradient with more zeros than k leaves out the same zeros.
      std::nth_element(chosen.begin(), chosen.begin() + k, chosen.end(), [&](int64_t a, int64_t b) {
        const double ma = mag(a), mb = mag(b);
        return ma > mb || (ma == mb && a < b);
      });
      chosen.resize(size_t(k));
      std::sort(chosen.begin(), chosen.end());
    }
  });
  Tensor out = Tensor::empty({int64_t(chosen.size())}, DType::kInt64, x.device());
  std::copy(chosen.begin(), chosen.end(), out.data<int64_t>());
  return out;
}

void take(const Tensor& out, const Tensor& x, const Tensor& idx) {
  SL_DISPATCH_ALL(x.dtype(), "take", [&] {
    const scalar_t* src = x.data<scalar_t>();
    scalar_t* dst = out.data<scalar_t>();
    const int64_t* ix = idx.data<int64_t>();
    parallel_range(idx.numel(), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dst[i] = src[ix[i]];
    });
  });
}

void index_add(const Tensor& dense, const Tensor& idx, const Tensor& vals) {
  SL_DISPATCH_NUMERIC(dense.dtype(), "index_add", [&] {
    using C = compute_t<scalar_t>;
    scalar_t* d = dense.data<scalar_t>();
    const scalar_t* v = vals.data<scalar_t>();
    const int64_t* ix = idx.data<int64_t>();
    // Indices are distinct within one call (the front-end's contract), so threads never share an element.
    parallel_range(idx.numel(), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) d[ix[i]] = convert<scalar_t>(double(C(d[ix[i]]) + C(v[i])));
    });
  });
}

}  // namespace sl::cpu
