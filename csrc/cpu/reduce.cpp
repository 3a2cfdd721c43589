// Reductions over any set of axes. The input is viewed as [kept..., reduced...]; then one of three
// layouts applies:
//   inner: each output reduces one contiguous run of R elements (the common case, e.g. sum(axis=-1));
//   outer: input contiguous with the reduced axes leading: [R, K] rows are accumulated column-wise
//          (e.g. sum(axis=0), the bias gradient), vectorised along K;
//   other: the permuted view is packed once, then handled as inner.
// Floating sums add 16 lanes within blocks of 4096 elements and blocks in double, always in block
// order: close to numpy's pairwise accuracy at streaming speed, and the same bits for any thread count.
#include <cmath>
#include <limits>
#include <vector>

#include "core/errors.h"
#include "cpu/isa.h"
#include "cpu/kernels.h"
#include "cpu/loop.h"

namespace sl::cpu {
namespace {

constexpr int kLanes = 16;
constexpr int64_t kBlock = 4096;

template <typename T>
using lane_t = std::conditional_t<std::is_integral_v<T>, int64_t, compute_t<T>>;
template <typename T>
using acc_t = std::conditional_t<std::is_integral_v<T>, int64_t, double>;

// Each kernel below is compiled per instruction-set level (cpu/isa.h) and gives the same bits on all of them.

// Sum of a run: 16 lanes, whatever the vector width (4 SSE vectors, 2 AVX2, 1 AVX-512), each lane adding its
// elements in order, the lanes combined by the same fixed tree.
template <typename T>
struct SumRun {
  template <Isa Level>
  static SL_ISA_INLINE acc_t<T> run(const T* p, int64_t n) {
    using L = lane_t<T>;
    acc_t<T> total = 0;
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t e = std::min(n, b + kBlock);
      L lanes[kLanes] = {};
      int64_t i = b;
      for (; i + kLanes <= e; i += kLanes)
        for (int j = 0; j < kLanes; ++j) lanes[j] += L(p[i + j]);
      L tail = 0;
      for (; i < e; ++i) tail += L(p[i]);
      for (int w = kLanes / 2; w > 0; w /= 2)
        for (int j = 0; j < w; ++j) lanes[j] += lanes[j + w];
      total += acc_t<T>(lanes[0] + tail);
    }
    return total;
  }
};

template <typename T>
acc_t<T> sum_run(const T* p, int64_t n) { return run_isa<SumRun<T>>(p, n); }

// max (IsMax) or min of a float / double run; nan propagates (as a canonical quiet nan). 16 lanes held in
// explicit vectors of the level's width: GCC does not vectorise a max that keeps IEEE semantics (nan, signed
// zeros) by itself, and a `#pragma omp simd reduction(max)` would combine lanes in a width-dependent order,
// so max(-0.0, 0.0) could change sign with the CPU. Here lane j always sees elements j, j + 16, ..., and the
// lanes are combined in order 0..15, then the tail.
template <bool IsMax, typename T>
struct ExtremeRun {
  template <Isa Level>
  static SL_ISA_INLINE T run(const T* p, int64_t n) {
    using V = Vec<T, Level>;
    using VT = typename V::type;
    constexpr int kVecs = kLanes / V::kLen;
    VT best[kVecs];
    decltype(best[0] != best[0]) bad[kVecs];
    for (int k = 0; k < kVecs; ++k) {
      best[k] = p[0] - VT{};  // p[0] in every lane (x - +0.0 is x, -0.0 included; x + 0.0 would not be)
      bad[k] = best[k] != best[k];
    }
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int k = 0; k < kVecs; ++k) {
        const VT v = SL_LOAD_VEC(V, p + i + k * V::kLen);
        bad[k] |= v != v;
        if constexpr (IsMax) best[k] = v > best[k] ? v : best[k];
        else best[k] = v < best[k] ? v : best[k];
      }
    T result = p[0];
    bool nan = false;
    for (int k = 0; k < kVecs; ++k)
      for (int j = 0; j < V::kLen; ++j) {
        const T v = best[k][j];
        nan |= bad[k][j] != 0;
        result = IsMax ? (v > result ? v : result) : (v < result ? v : result);
      }
    for (; i < n; ++i) {
      const T v = p[i];
      nan |= v != v;
      result = IsMax ? (v > result ? v : result) : (v < result ? v : result);
    }
    return nan ? std::numeric_limits<T>::quiet_NaN() : result;
  }
};

// max (IsMax) or min of a run; nan propagates. Integer and half types keep one baseline loop (OpenMP's simd
// vectorises it; the result is exact, with no signed zero to tell apart, for integers).
template <bool IsMax, typename T>
compute_t<T> extreme_run(const T* p, int64_t n) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return run_isa<ExtremeRun<IsMax, T>>(p, n);
  } else {
    using C = compute_t<T>;
    C best = C(p[0]);
    int nan = 0;
    if constexpr (IsMax) {
#pragma omp simd reduction(max : best) reduction(| : nan)
      for (int64_t i = 0; i < n; ++i) {
        const C v = C(p[i]);
        nan |= v != v;
        best = v > best ? v : best;
      }
    } else {
#pragma omp simd reduction(min : best) reduction(| : nan)
      for (int64_t i = 0; i < n; ++i) {
        const C v = C(p[i]);
        nan |= v != v;
        best = v < best ? v : best;
      }
    }
    if constexpr (!std::is_integral_v<C>)
      if (nan) return std::numeric_limits<C>::quiet_NaN();
    return best;
  }
}

// Few long runs (e.g. a full reduction) are split: the kBlock-element blocks of one run are reduced in parallel
// into `blocks` (sized by the caller), which the caller combines in block order, so the result does not depend
// on the thread count.
template <typename V, typename T, typename F>
void reduce_blocks(const T* run, int64_t R, std::vector<V>& blocks, F&& reduce_block) {
  parallel_range(int64_t(blocks.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) blocks[i] = reduce_block(run + i * kBlock, std::min(kBlock, R - i * kBlock));
  }, kBlock);
}

template <typename T>
void reduce_inner(ReduceOp op, T* out, const T* x, int64_t K, int64_t R) {
  using C = compute_t<T>;
  const bool split = K < max_threads() && R * K >= 2 * kParallelGrain;
  const int64_t nblocks = (R + kBlock - 1) / kBlock;
  if (op == ReduceOp::kSum || op == ReduceOp::kMean) {
    auto finish_sum = [&](acc_t<T> s) -> T {
      if (op == ReduceOp::kMean) return convert<T>(C(double(s) / double(R)));
      return convert<T>(C(s));
    };
    if (!split) {
      parallel_range(K, [&](int64_t b, int64_t e) {
        for (int64_t k = b; k < e; ++k) out[k] = finish_sum(sum_run(x + k * R, R));
      }, R);
      return;
    }
    // Blocks added in block order, exactly as sum_run does serially.
    std::vector<acc_t<T>> blocks(size_t(nblocks), 0);
    for (int64_t k = 0; k < K; ++k) {
      reduce_blocks(x + k * R, R, blocks, [](const T* p, int64_t n) { return sum_run(p, n); });
      acc_t<T> s = 0;
      for (auto v : blocks) s += v;
      out[k] = finish_sum(s);
    }
    return;
  }
  const bool is_max = op == ReduceOp::kMax;
  auto extreme = [is_max](const T* p, int64_t n) { return is_max ? extreme_run<true>(p, n) : extreme_run<false>(p, n); };
  if (!split) {
    parallel_range(K, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) out[k] = convert<T>(extreme(x + k * R, R));
    }, R);
    return;
  }
  // A full max / min (e.g. of a gradient, of logits) is split across threads as sum is: on one core it loses
  // to numpy's vectorised one.
  std::vector<C> blocks(size_t(nblocks), C(0));
  for (int64_t k = 0; k < K; ++k) {
    reduce_blocks(x + k * R, R, blocks, extreme);
    C best = blocks[0];
    for (C v : blocks) {
      if (v != v) {  // a block's nan propagates
        best = v;
        break;
      }
      best = is_max ? (v > best ? v : best) : (v < best ? v : best);
    }
    out[k] = convert<T>(best);
  }
}

// Column sums of rows [0, R) of x ([R, K], contiguous) for columns [b, e), added into acc[b..e). Column-wise,
// so every column's additions keep their order at any vector width.
template <typename T>
struct OuterSum {
  template <Isa Level>
  static SL_ISA_INLINE void run(const T* x, int64_t K, int64_t R, int64_t b, int64_t e, lane_t<T>* a) {
    using L = lane_t<T>;
    int64_t r0 = 0;
    for (; r0 + 4 <= R; r0 += 4) {  // four rows per pass: one accumulator load/store per four inputs
      const T *p0 = x + r0 * K, *p1 = p0 + K, *p2 = p1 + K, *p3 = p2 + K;
      for (int64_t k = b; k < e; ++k) a[k] += (L(p0[k]) + L(p1[k])) + (L(p2[k]) + L(p3[k]));
    }
    for (int64_t r = r0; r < R; ++r) {
      const T* row = x + r * K;
      for (int64_t k = b; k < e; ++k) a[k] += L(row[k]);
    }
  }
};

// Column max (IsMax) / min, as OuterSum; nan[k] records a nan seen in column k.
template <bool IsMax, typename T>
struct OuterExtreme {
  template <Isa Level>
  static SL_ISA_INLINE void run(const T* x, int64_t K, int64_t R, int64_t b, int64_t e, lane_t<T>* a, char* nan) {
    using L = lane_t<T>;
    for (int64_t r = 0; r < R; ++r) {
      const T* row = x + r * K;
      for (int64_t k = b; k < e; ++k) {
        const L v = L(compute_t<T>(row[k]));
        nan[k] |= v != v;
        a[k] = IsMax ? (v > a[k] ? v : a[k]) : (v < a[k] ? v : a[k]);
      }
    }
  }
};

template <typename T>
void reduce_outer(ReduceOp op, T* out, const T* x, int64_t R, int64_t K) {
  using C = compute_t<T>;
  using L = lane_t<T>;
  const bool is_sum = op == ReduceOp::kSum || op == ReduceOp::kMean;
  const bool is_max = op == ReduceOp::kMax;
  // Columns are split across threads; each thread accumulates its columns over all R rows. One wide slice per
  // thread, not parallel_range's four narrow chunks: a thread walks its slice row by row, and narrow slices (1 KB
  // of each 8 KB row) stream so badly that 2 threads take longer than one. The per-column order of additions is
  // the same either way.
  const int nt = threads_for(R * K);
  const int64_t slice = ((K + nt - 1) / nt + 15) / 16 * 16;
  const int64_t nslices = (K + slice - 1) / slice;
  auto columns = [&](int64_t b, int64_t e) {
    std::vector<L> acc(e - b);
    std::vector<char> nan(is_sum ? 0 : e - b, 0);
    for (int64_t k = b; k < e; ++k) acc[k - b] = is_sum ? L(0) : L(C(x[k]));
    if (is_sum) run_isa<OuterSum<T>>(x, K, R, b, e, acc.data() - b);
    else if (is_max) run_isa<OuterExtreme<true, T>>(x, K, R, b, e, acc.data() - b, nan.data() - b);
    else run_isa<OuterExtreme<false, T>>(x, K, R, b, e, acc.data() - b, nan.data() - b);
    for (int64_t k = b; k < e; ++k) {
      L v = acc[k - b];
      if constexpr (!std::is_integral_v<L>)
        if (!is_sum && nan[k - b]) v = std::numeric_limits<L>::quiet_NaN();
      if (op == ReduceOp::kMean) out[k] = convert<T>(C(double(v) / double(R)));
      else out[k] = convert<T>(C(v));
    }
  };
  auto run_slice = [&](int64_t i) { columns(i * slice, std::min(K, (i + 1) * slice)); };
  run_chunks(nt, nslices, [](void* f, int64_t i) { (*static_cast<decltype(run_slice)*>(f))(i); }, &run_slice);
}

}  // namespace

void reduce(ReduceOp op, const Tensor& out, const Tensor& x, const std::vector<bool>& reduced) {
  std::vector<int64_t> perm;
  int64_t K = 1, R = 1;
  for (int i = 0; i < x.ndim(); ++i)
    if (!reduced[i]) {
      perm.push_back(i);
      K *= x.shape()[i];
    }
  for (int i = 0; i < x.ndim(); ++i)
    if (reduced[i]) {
      perm.push_back(i);
      R *= x.shape()[i];
    }
  // Do all reduced axes come before all kept ones (size-1 axes aside)? Then contiguous x is [R, K].
  bool reduced_leading = true, seen_kept = false;
  for (int i = 0; i < x.ndim(); ++i) {
    if (x.shape()[i] == 1) continue;
    if (!reduced[i]) seen_kept = true;
    else if (seen_kept) reduced_leading = false;
  }
  if (K == 0) return;
  SL_DISPATCH_NUMERIC(x.dtype(), op_name(op), [&] {
    scalar_t* o = out.data<scalar_t>();
    if (R == 0) {  // empty reduction: sum 0, mean nan (max/min rejected by the front-end)
      double v = op == ReduceOp::kSum ? 0.0 : std::numeric_limits<double>::quiet_NaN();
      for (int64_t k = 0; k < K; ++k) o[k] = convert<scalar_t>(v);
      return;
    }
    Tensor xp = x.transpose(perm);
    if (xp.is_contiguous()) {
      reduce_inner(op, o, xp.data<scalar_t>(), K, R);
    } else if (x.is_contiguous() && reduced_leading) {
      reduce_outer(op, o, x.data<scalar_t>(), R, K);
    } else {
      Tensor packed = xp.contiguous();
      reduce_inner(op, o, packed.data<scalar_t>(), K, R);
    }
  });
}

void arg_reduce(bool is_max, const Tensor& out, const Tensor& x) {
  const int64_t rows = x.shape()[0], n = x.shape()[1];
  int64_t* o = out.data<int64_t>();
  SL_DISPATCH_NUMERIC(x.dtype(), is_max ? "argmax" : "argmin", [&] {
    using C = compute_t<scalar_t>;
    const scalar_t* base = x.data<scalar_t>();
    parallel_range(rows, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const scalar_t* p = base + r * n;
        int64_t best_i = 0;
        C best = C(p[0]);
        if (best == best) {
          for (int64_t i = 1; i < n; ++i) {
            C v = C(p[i]);
            if (v != v) {  // first nan wins, as numpy
              best_i = i;
              break;
            }
            if (is_max ? v > best : v < best) {
              best = v;
              best_i = i;
            }
          }
        }
        o[r] = best_i;
      }
    }, n);
  });
}

}  // namespace sl::cpu
