// Element-wise CPU kernels: binary (tensor-tensor and tensor-scalar), unary, clip, axpy, fill, arange.
// Each row function has a unit-stride branch with a plain loop the compiler vectorises.
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/errors.h"
#include "cpu/isa.h"
#include "cpu/kernels.h"
#include "cpu/loop.h"
#include "cpu/vecmath.h"

namespace sl::cpu {
namespace {

// ---------------------------------------------------------------- binary op functors (on compute types)
// Integer +, - and * wrap around on overflow, as numpy's do. They are computed in the unsigned type, which
// gives the same bits: in the signed type an overflow is undefined behaviour (found by UBSan: INT_MIN // -1).
template <typename C>
constexpr bool kWrapping = std::is_integral_v<C> && !std::is_same_v<C, bool>;
template <typename C>
inline C wrap_add(C a, C b) { using U = std::make_unsigned_t<C>; return C(U(a) + U(b)); }
template <typename C>
inline C wrap_sub(C a, C b) { using U = std::make_unsigned_t<C>; return C(U(a) - U(b)); }
template <typename C>
inline C wrap_mul(C a, C b) { using U = std::make_unsigned_t<C>; return C(U(a) * U(b)); }

template <typename C>
C int_floor_div(C a, C b) {
  if (b == 0) return 0;                                       // numpy also gives 0 (with a warning)
  if (b == -1) return wrap_sub(C(0), a);                      // INT_MIN // -1 wraps to INT_MIN, as numpy
  C q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;              // floor, as numpy's //
  return q;
}

// Wraps on overflow like numpy (unsigned arithmetic: signed overflow would be undefined behaviour).
// Negative exponents are rejected by the front-end; 1 and -1 are still handled for direct kernel use.
template <typename C>
C int_pow(C base, C exp) {
  if (exp < 0) return base == 1 ? 1 : (base == -1 ? ((exp & 1) ? -1 : 1) : 0);
  using U = std::make_unsigned_t<C>;
  U result = 1, b = U(base);
  while (exp > 0) {
    if (exp & 1) result *= b;
    b *= b;
    exp >>= 1;
  }
  return C(result);
}

template <BinaryOp Op, typename C>
inline auto apply_binary(C a, C b) {
  if constexpr (Op == BinaryOp::kAdd) { if constexpr (kWrapping<C>) return wrap_add(a, b); else return C(a + b); }
  else if constexpr (Op == BinaryOp::kSub) { if constexpr (kWrapping<C>) return wrap_sub(a, b); else return C(a - b); }
  else if constexpr (Op == BinaryOp::kMul) { if constexpr (kWrapping<C>) return wrap_mul(a, b); else return C(a * b); }
  else if constexpr (Op == BinaryOp::kDiv) {
    if constexpr (std::is_integral_v<C>) return int_floor_div(a, b);
    else return C(a / b);
  } else if constexpr (Op == BinaryOp::kPow) {
    if constexpr (std::is_integral_v<C>) return int_pow(a, b);
    else return C(std::pow(a, b));
  }
  // maximum / minimum propagate nan like numpy: a nan in either operand wins.
  else if constexpr (Op == BinaryOp::kMaximum) return (a > b || a != a) ? a : b;
  else if constexpr (Op == BinaryOp::kMinimum) return (a < b || a != a) ? a : b;
  // sign(a) * b, sign as the unary op's (a nan gives nan).
  else if constexpr (Op == BinaryOp::kReluGrad)
    return apply_binary<BinaryOp::kMul, C>(C(C((C(0) < a) - (a < C(0))) + (a != a ? a : C(0))), b);
  else if constexpr (Op == BinaryOp::kEq) return a == b;
  else if constexpr (Op == BinaryOp::kNe) return a != b;
  else if constexpr (Op == BinaryOp::kLt) return a < b;
  else if constexpr (Op == BinaryOp::kLe) return a <= b;
  else if constexpr (Op == BinaryOp::kGt) return a > b;
  else return a >= b;
}

// float and double rows compile per instruction-set level (cpu/isa.h), except pow (a libm call per element);
// element-wise work gives the same bits on every level.
template <typename T>
constexpr bool kMultiIsa = std::is_same_v<T, float> || std::is_same_v<T, double>;

// The unit-stride forms of a binary row: both operands contiguous, or one of them a broadcast scalar.
enum class RowKind { kBoth, kScalarY, kScalarX };

template <BinaryOp Op, typename T>
struct BinaryRow {
  using C = compute_t<T>;
  using Out = std::conditional_t<Op >= BinaryOp::kEq, bool, T>;
  template <Isa Level>
  static SL_ISA_INLINE void run(Out* o, const T* x, const T* y, int64_t n, RowKind kind) {
    if (kind == RowKind::kBoth) {
      for (int64_t i = 0; i < n; ++i) o[i] = convert<Out>(apply_binary<Op, C>(C(x[i]), C(y[i])));
    } else if (kind == RowKind::kScalarY) {
      const C yv = C(y[0]);
      for (int64_t i = 0; i < n; ++i) o[i] = convert<Out>(apply_binary<Op, C>(C(x[i]), yv));
    } else {
      const C xv = C(x[0]);
      for (int64_t i = 0; i < n; ++i) o[i] = convert<Out>(apply_binary<Op, C>(xv, C(y[i])));
    }
  }
};

template <BinaryOp Op, typename T>
void binary_typed(const Tensor& out, const Tensor& a, const Tensor& b) {
  using C = compute_t<T>;
  using Out = std::conditional_t<Op >= BinaryOp::kEq, bool, T>;
  StridedLoop<3> L({&out, &a, &b});
  for_each_row(L, [](char* const* p, const int64_t* s, int64_t n) {
    Out* o = reinterpret_cast<Out*>(p[0]);
    const T* x = reinterpret_cast<const T*>(p[1]);
    const T* y = reinterpret_cast<const T*>(p[2]);
    const int64_t so = s[0] / int64_t(sizeof(Out)), sx = s[1] / int64_t(sizeof(T)), sy = s[2] / int64_t(sizeof(T));
    if (so == 1 && (sx == 1 || sx == 0) && (sy == 1 || sy == 0) && (sx | sy) != 0) {
      const RowKind kind = sx == 0 ? RowKind::kScalarX : sy == 0 ? RowKind::kScalarY : RowKind::kBoth;
      if constexpr (kMultiIsa<T> && Op != BinaryOp::kPow) run_isa<BinaryRow<Op, T>>(o, x, y, n, kind);
      else BinaryRow<Op, T>::template run<Isa::kBaseline>(o, x, y, n, kind);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * so] = convert<Out>(apply_binary<Op, C>(C(x[i * sx]), C(y[i * sy])));
    }
  });
}

template <BinaryOp Op, bool ScalarFirst, typename T>
void binary_scalar_typed(const Tensor& out, const Tensor& a, double s) {
  using C = compute_t<T>;
  using Out = std::conditional_t<Op >= BinaryOp::kEq, bool, T>;
  // The scalar takes a's dtype first (ops.h, and numpy): for float16 it is rounded to half, not kept as float.
  const C sv = C(convert<T>(s));
  StridedLoop<2> L({&out, &a});
  for_each_row(L, [sv](char* const* p, const int64_t* st, int64_t n) {
    Out* o = reinterpret_cast<Out*>(p[0]);
    const T* x = reinterpret_cast<const T*>(p[1]);
    const int64_t so = st[0] / int64_t(sizeof(Out)), sx = st[1] / int64_t(sizeof(T));
    auto f = [sv](C v) { return ScalarFirst ? apply_binary<Op, C>(sv, v) : apply_binary<Op, C>(v, sv); };
    if (so == 1 && sx == 1) {
      // As a row with a broadcast scalar operand, so that it shares BinaryRow's per-level copies.
      const T sv_t = convert<T>(sv);
      if constexpr (kMultiIsa<T> && Op != BinaryOp::kPow) {  // pow: a libm call per element
        if (ScalarFirst) run_isa<BinaryRow<Op, T>>(o, &sv_t, x, n, RowKind::kScalarX);
        else run_isa<BinaryRow<Op, T>>(o, x, &sv_t, n, RowKind::kScalarY);
      } else {
        for (int64_t i = 0; i < n; ++i) o[i] = convert<Out>(f(C(x[i])));
      }
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * so] = convert<Out>(f(C(x[i * sx])));
    }
  });
}


// ---------------------------------------------------------------- unary
// Always inlined into the row loops: as a call per element the loop cannot be vectorised, and GCC's heuristics
// decline to inline the polynomial ops at some call sites (the cost: docs/benchmarks/cpu_core.md, "Measurements
// behind the kernels' design").
template <UnaryOp Op, typename C>
inline __attribute__((always_inline)) C apply_unary(C v) {
  // -v, not 0 - v, and fabs: IEEE negation gives neg(+0) = -0 and abs(-0) = +0, as numpy.
  // Integers negate in unsigned arithmetic: -INT_MIN wraps to INT_MIN (as numpy) instead of being undefined.
  if constexpr (Op == UnaryOp::kNeg) {
    if constexpr (std::is_integral_v<C>) return C(std::make_unsigned_t<C>(0) - std::make_unsigned_t<C>(v));
    else return C(-v);
  } else if constexpr (Op == UnaryOp::kAbs) {
    if constexpr (std::is_integral_v<C>)
      return v < C(0) ? C(std::make_unsigned_t<C>(0) - std::make_unsigned_t<C>(v)) : v;
    else return std::fabs(v);
  }
  else if constexpr (Op == UnaryOp::kSign) return C((C(0) < v) - (v < C(0))) + (v != v ? v : C(0));
  else if constexpr (Op == UnaryOp::kSquare) { if constexpr (kWrapping<C>) return wrap_mul(v, v); else return v * v; }
  else if constexpr (Op == UnaryOp::kRelu) return v > C(0) ? v : (v != v ? v : C(0));
  else if constexpr (std::is_integral_v<C>) return v;  // unreachable: the front-end rejects the rest for ints
  // float32 (and float16, computed in float32): the SIMD-friendly forms of cpu/vecmath.h.
  else if constexpr (std::is_same_v<C, float> && Op == UnaryOp::kExp) return vecmath::exp_f32(v);
  else if constexpr (std::is_same_v<C, float> && Op == UnaryOp::kTanh) return vecmath::tanh_f32(v);
  else if constexpr (std::is_same_v<C, float> && Op == UnaryOp::kSigmoid) return vecmath::sigmoid_f32(v);
  else if constexpr (Op == UnaryOp::kExp) return std::exp(v);
  else if constexpr (Op == UnaryOp::kLog) return std::log(v);
  else if constexpr (Op == UnaryOp::kSqrt) return std::sqrt(v);
  else if constexpr (Op == UnaryOp::kTanh) return std::tanh(v);
  else if constexpr (Op == UnaryOp::kSigmoid) {
    // Stable on both tails: never exponentiates a large positive number.
    if (v >= C(0)) return C(1) / (C(1) + std::exp(-v));
    C e = std::exp(v);
    return e / (C(1) + e);
  } else if constexpr (Op == UnaryOp::kReciprocal) return C(1) / v;
  else if constexpr (Op == UnaryOp::kSin) return std::sin(v);
  else if constexpr (Op == UnaryOp::kCos) return std::cos(v);
  else if constexpr (Op == UnaryOp::kFloor) return std::floor(v);
  else if constexpr (Op == UnaryOp::kCeil) return std::ceil(v);
  else if constexpr (Op == UnaryOp::kRound) return std::nearbyint(v);  // half to even, as numpy
  else if constexpr (Op == UnaryOp::kLog1p) return std::log1p(v);
  else if constexpr (Op == UnaryOp::kExpm1) return std::expm1(v);
  else if constexpr (Op == UnaryOp::kErf) return std::erf(v);
  else return v > C(20) ? v : std::log1p(std::exp(v));  // softplus; exact to rounding above 20
}

// Unary ops computed inline (no libm call), whose contiguous float / double rows compile per instruction-set
// level (cpu/isa.h): the float32 polynomials of cpu/vecmath.h (compute-bound, so each wider vector level runs
// them faster), and the plain arithmetic ones. The rest call libm per element, where wider vectors do not help.
template <UnaryOp Op, typename T>
constexpr bool unary_multi_isa() {
  if constexpr (!kMultiIsa<T>) return false;
  else if (Op == UnaryOp::kNeg || Op == UnaryOp::kAbs || Op == UnaryOp::kSign || Op == UnaryOp::kSquare ||
           Op == UnaryOp::kRelu || Op == UnaryOp::kReciprocal)
    return true;
  else return std::is_same_v<T, float> && (Op == UnaryOp::kExp || Op == UnaryOp::kTanh || Op == UnaryOp::kSigmoid);
}

template <UnaryOp Op, typename T>
struct UnaryRow {
  template <Isa Level>
  static SL_ISA_INLINE void run(T* o, const T* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) o[i] = apply_unary<Op, T>(x[i]);
  }
};

template <UnaryOp Op, typename T>
void unary_typed(const Tensor& out, const Tensor& x) {
  using C = compute_t<T>;
  StridedLoop<2> L({&out, &x});
  for_each_row(L, [](char* const* p, const int64_t* s, int64_t n) {
    T* o = reinterpret_cast<T*>(p[0]);
    const T* xs = reinterpret_cast<const T*>(p[1]);
    const int64_t so = s[0] / int64_t(sizeof(T)), sx = s[1] / int64_t(sizeof(T));
    if constexpr (unary_multi_isa<Op, T>()) {
      if (so == 1 && sx == 1) return run_isa<UnaryRow<Op, T>>(o, xs, n);
    }
    if (so == 1 && sx == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = convert<T>(apply_unary<Op, C>(C(xs[i])));
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * so] = convert<T>(apply_unary<Op, C>(C(xs[i * sx])));
    }
  });
}


}  // namespace

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  with_binary_op(op, [&](auto op_c) {
    constexpr BinaryOp O = decltype(op_c)::value;
    if constexpr (O >= BinaryOp::kEq) {
      SL_DISPATCH_ALL(a.dtype(), op_name(op), [&] { binary_typed<O, scalar_t>(out, a, b); });
    } else {
      SL_DISPATCH_NUMERIC(a.dtype(), op_name(op), [&] { binary_typed<O, scalar_t>(out, a, b); });
    }
  });
}

void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& a, double s, bool scalar_first) {
  with_binary_op(op, [&](auto op_c) {
    constexpr BinaryOp O = decltype(op_c)::value;
    auto run = [&](auto type_tag) {
      using T = decltype(type_tag);
      if (scalar_first) binary_scalar_typed<O, true, T>(out, a, s);
      else binary_scalar_typed<O, false, T>(out, a, s);
    };
    if constexpr (O >= BinaryOp::kEq) {
      SL_DISPATCH_ALL(a.dtype(), op_name(op), [&] { run(scalar_t()); });
    } else {
      SL_DISPATCH_NUMERIC(a.dtype(), op_name(op), [&] { run(scalar_t()); });
    }
  });
}

void unary(UnaryOp op, const Tensor& out, const Tensor& x) {
  with_unary_op(op, [&](auto op_c) {
    SL_DISPATCH_NUMERIC(x.dtype(), op_name(op), [&] { unary_typed<decltype(op_c)::value, scalar_t>(out, x); });
  });
}

// A clip bound in the compute type; for integers, bounds beyond the type's range (the infinities of an open
// bound included) saturate to its ends instead of an undefined cast.
template <typename C>
C clip_bound(double v) {
  if constexpr (std::is_integral_v<C>) {
    if (v <= double(std::numeric_limits<C>::min())) return std::numeric_limits<C>::min();
    if (v >= double(std::numeric_limits<C>::max())) return std::numeric_limits<C>::max();
  }
  return static_cast<C>(v);
}

void clip(const Tensor& out, const Tensor& x, double lo, double hi) {
  SL_DISPATCH_NUMERIC(x.dtype(), "clip", [&] {
    using C = compute_t<scalar_t>;
    const C l = clip_bound<C>(lo), h = clip_bound<C>(hi);
    StridedLoop<2> L({&out, &x});
    for_each_row(L, [l, h](char* const* p, const int64_t* s, int64_t n) {
      scalar_t* o = reinterpret_cast<scalar_t*>(p[0]);
      const scalar_t* xs = reinterpret_cast<const scalar_t*>(p[1]);
      const int64_t so = s[0] / int64_t(sizeof(scalar_t)), sx = s[1] / int64_t(sizeof(scalar_t));
      for (int64_t i = 0; i < n; ++i) {
        C v = C(xs[i * sx]);
        v = v < l ? l : (v > h ? h : v);  // nan passes through, as numpy
        o[i * so] = convert<scalar_t>(v);
      }
    });
  });
}

void axpy(double alpha, const Tensor& x, const Tensor& y) {
  SL_DISPATCH_NUMERIC(y.dtype(), "axpy", [&] {
    using C = compute_t<scalar_t>;
    const C al = static_cast<C>(alpha);
    StridedLoop<2> L({&y, &x});
    for_each_row(L, [al](char* const* p, const int64_t* s, int64_t n) {
      scalar_t* ys = reinterpret_cast<scalar_t*>(p[0]);
      const scalar_t* xs = reinterpret_cast<const scalar_t*>(p[1]);
      const int64_t sy = s[0] / int64_t(sizeof(scalar_t)), sx = s[1] / int64_t(sizeof(scalar_t));
      auto f = [al](C y, C x) {
        if constexpr (kWrapping<C>) return wrap_add(y, wrap_mul(al, x));
        else return C(y + al * x);
      };
      if (sy == 1 && sx == 1) {
        for (int64_t i = 0; i < n; ++i) ys[i] = convert<scalar_t>(f(C(ys[i]), C(xs[i])));
      } else {
        for (int64_t i = 0; i < n; ++i) ys[i * sy] = convert<scalar_t>(f(C(ys[i * sy]), C(xs[i * sx])));
      }
    });
  });
}

void fill(const Tensor& t, double value) {
  SL_DISPATCH_ALL(t.dtype(), "fill", [&] {
    const scalar_t v = convert<scalar_t>(value);
    StridedLoop<1> L({&t});
    for_each_row(L, [v](char* const* p, const int64_t* s, int64_t n) {
      scalar_t* o = reinterpret_cast<scalar_t*>(p[0]);
      const int64_t so = s[0] / int64_t(sizeof(scalar_t));
      for (int64_t i = 0; i < n; ++i) o[i * so] = v;
    });
  });
}

void arange(const Tensor& t, double start, double step) {
  SL_DISPATCH_NUMERIC(t.dtype(), "arange", [&] {
    scalar_t* o = t.data<scalar_t>();  // freshly allocated, contiguous
    parallel_range(t.numel(), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = convert<scalar_t>(start + double(i) * step);
    });
  });
}

}  // namespace sl::cpu
