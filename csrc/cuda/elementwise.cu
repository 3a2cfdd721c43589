// Element-wise CUDA kernels: binary (tensor-tensor and tensor-scalar), unary, clip, axpy, the fused SGD step
// and copy with casts. Results must equal cpu/elementwise.cpp, cpu/optim.cpp and cpu/copy.cpp (the GPU tests
// compare the two), so the per-element functions below mirror the CPU's expressions one for one. The
// transcendental ops call CUDA's libm, which agrees with the CPU's to a few ulp rather than bit for bit (float32
// exp / tanh / sigmoid are cpu/vecmath.h polynomials there).
//
// Every op is a functor handed to one of two launchers: a pure map (out = f(a) or f(a, b)) gets 16-byte
// loads and stores when all operands are contiguous and aligned; anything else (strided views, broadcast
// stride-0 inputs, misaligned slices, the SGD step with two outputs) goes through a per-element offset
// kernel. Axes are first collapsed as in cpu/loop.h, so most views index through one or two axes.
//
// Floating-point arithmetic that combines a product with a sum (axpy, sgd) uses the __*_rn intrinsics:
// nvcc would otherwise contract it into an FMA, which rounds once where the CPU (no FMA in the x86-64
// baseline) rounds twice. Divisions and square roots use them too, so that a build with --use_fast_math
// cannot swap in the approximate forms.
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace sl::cuda {
namespace {

// ---------------------------------------------------------------- arithmetic helpers (compute types)
template <typename C>
__device__ __forceinline__ C add_rn(C a, C b) {
  // Integers wrap like the CPU in practice does; unsigned arithmetic makes that defined here.
  if constexpr (std::is_integral_v<C>) return C(std::make_unsigned_t<C>(a) + std::make_unsigned_t<C>(b));
  else if constexpr (std::is_same_v<C, float>) return __fadd_rn(a, b);
  else return __dadd_rn(a, b);
}
template <typename C>
__device__ __forceinline__ C sub_rn(C a, C b) {
  if constexpr (std::is_integral_v<C>) return C(std::make_unsigned_t<C>(a) - std::make_unsigned_t<C>(b));
  else if constexpr (std::is_same_v<C, float>) return __fsub_rn(a, b);
  else return __dsub_rn(a, b);
}
template <typename C>
__device__ __forceinline__ C mul_rn(C a, C b) {
  if constexpr (std::is_integral_v<C>) return C(std::make_unsigned_t<C>(a) * std::make_unsigned_t<C>(b));
  else if constexpr (std::is_same_v<C, float>) return __fmul_rn(a, b);
  else return __dmul_rn(a, b);
}
template <typename C>
__device__ __forceinline__ C div_rn(C a, C b) {
  if constexpr (std::is_same_v<C, float>) return __fdiv_rn(a, b);
  else return __ddiv_rn(a, b);
}

// float or double libm call by compute type (float16 computes in float, as on the CPU).
#define SL_MATH1(name, fname, dname)                                \
  template <typename C>                                             \
  __device__ __forceinline__ C name(C v) {                          \
    if constexpr (std::is_same_v<C, float>) return ::fname(v);      \
    else return ::dname(v);                                         \
  }
SL_MATH1(m_exp, expf, exp)
SL_MATH1(m_log, logf, log)
SL_MATH1(m_tanh, tanhf, tanh)
SL_MATH1(m_sin, sinf, sin)
SL_MATH1(m_cos, cosf, cos)
SL_MATH1(m_floor, floorf, floor)
SL_MATH1(m_ceil, ceilf, ceil)
SL_MATH1(m_rint, rintf, rint)  // half to even, as the CPU's nearbyint
SL_MATH1(m_log1p, log1pf, log1p)
SL_MATH1(m_expm1, expm1f, expm1)
SL_MATH1(m_erf, erff, erf)
SL_MATH1(m_fabs, fabsf, fabs)
SL_MATH1(m_sqrt, __fsqrt_rn, __dsqrt_rn)
#undef SL_MATH1

template <typename C>
__device__ __forceinline__ C m_pow(C a, C b) {
  if constexpr (std::is_same_v<C, float>) return ::powf(a, b);
  else return ::pow(a, b);
}

// ---------------------------------------------------------------- binary ops (cpu/elementwise.cpp)
template <typename C>
__device__ __forceinline__ C int_floor_div(C a, C b) {
  if (b == 0) return 0;                        // as the CPU (and numpy): 0, no trap
  if (b == -1) return sub_rn(C(0), a);         // INT_MIN / -1 wraps to INT_MIN instead of trapping
  C q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;  // floor, as numpy's //
  return q;
}

template <typename C>
__device__ __forceinline__ C int_pow(C base, C exp) {
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
struct BinaryF {
  __device__ __forceinline__ auto operator()(C a, C b) const {
    if constexpr (Op == BinaryOp::kAdd) return add_rn(a, b);
    else if constexpr (Op == BinaryOp::kSub) return sub_rn(a, b);
    else if constexpr (Op == BinaryOp::kMul) return mul_rn(a, b);
    else if constexpr (Op == BinaryOp::kDiv) {
      if constexpr (std::is_integral_v<C>) return int_floor_div(a, b);
      else return div_rn(a, b);
    } else if constexpr (Op == BinaryOp::kPow) {
      if constexpr (std::is_integral_v<C>) return int_pow(a, b);
      else return m_pow(a, b);
    }
    // A nan in either operand wins, as numpy's maximum / minimum.
    else if constexpr (Op == BinaryOp::kMaximum) return (a > b || a != a) ? a : b;
    else if constexpr (Op == BinaryOp::kMinimum) return (a < b || a != a) ? a : b;
    // sign(a) * b, sign as the unary op's (a nan gives nan).
    else if constexpr (Op == BinaryOp::kReluGrad)
      return BinaryF<BinaryOp::kMul, C>()(C(C((C(0) < a) - (a < C(0))) + (a != a ? a : C(0))), b);
    else if constexpr (Op == BinaryOp::kEq) return a == b;
    else if constexpr (Op == BinaryOp::kNe) return a != b;
    else if constexpr (Op == BinaryOp::kLt) return a < b;
    else if constexpr (Op == BinaryOp::kLe) return a <= b;
    else if constexpr (Op == BinaryOp::kGt) return a > b;
    else return a >= b;
  }
};

// The operand order is a run-time flag rather than a template parameter: it is uniform across the grid,
// costs nothing next to the memory traffic, and halves the number of kernels compiled.
template <BinaryOp Op, typename C>
struct ScalarF {
  C s;
  bool scalar_first;
  __device__ __forceinline__ auto operator()(C v) const {
    return scalar_first ? BinaryF<Op, C>()(s, v) : BinaryF<Op, C>()(v, s);
  }
};

// ---------------------------------------------------------------- unary ops
template <UnaryOp Op, typename C>
struct UnaryF {
  __device__ __forceinline__ C operator()(C v) const {
    // IEEE negation and fabs keep the CPU's signed zeros; integers negate with wrap-around (-INT_MIN).
    if constexpr (Op == UnaryOp::kNeg) {
      if constexpr (std::is_integral_v<C>) return sub_rn(C(0), v);
      else return -v;
    } else if constexpr (Op == UnaryOp::kAbs) {
      if constexpr (std::is_integral_v<C>) return v < C(0) ? sub_rn(C(0), v) : v;
      else return m_fabs(v);
    }
    else if constexpr (Op == UnaryOp::kSign) return C((C(0) < v) - (v < C(0))) + (v != v ? v : C(0));
    else if constexpr (Op == UnaryOp::kSquare) return mul_rn(v, v);
    else if constexpr (Op == UnaryOp::kRelu) return v > C(0) ? v : (v != v ? v : C(0));
    else if constexpr (Op == UnaryOp::kExp) return m_exp(v);
    else if constexpr (Op == UnaryOp::kLog) return m_log(v);
    else if constexpr (Op == UnaryOp::kSqrt) return m_sqrt(v);
    else if constexpr (Op == UnaryOp::kTanh) return m_tanh(v);
    else if constexpr (Op == UnaryOp::kSigmoid) {
      // Both forms avoid exponentiating a large positive number; float follows cpu/vecmath.h's
      // sigmoid_f32 (one division, then e * inv), double the CPU's scalar form.
      if constexpr (std::is_same_v<C, float>) {
        const float e = m_exp(v < 0.0f ? v : -v);
        const float inv = div_rn(1.0f, 1.0f + e);
        return v < 0.0f ? e * inv : inv;
      } else {
        if (v >= C(0)) return div_rn(C(1), C(1) + m_exp(-v));
        const C e = m_exp(v);
        return div_rn(e, C(1) + e);
      }
    }
    else if constexpr (Op == UnaryOp::kReciprocal) return div_rn(C(1), v);
    else if constexpr (Op == UnaryOp::kSin) return m_sin(v);
    else if constexpr (Op == UnaryOp::kCos) return m_cos(v);
    else if constexpr (Op == UnaryOp::kFloor) return m_floor(v);
    else if constexpr (Op == UnaryOp::kCeil) return m_ceil(v);
    else if constexpr (Op == UnaryOp::kRound) return m_rint(v);
    else if constexpr (Op == UnaryOp::kLog1p) return m_log1p(v);
    else if constexpr (Op == UnaryOp::kExpm1) return m_expm1(v);
    else if constexpr (Op == UnaryOp::kErf) return m_erf(v);
    else return v > C(20) ? v : m_log1p(m_exp(v));  // softplus; exact to rounding above 20
  }
};

template <typename C>
struct ClipF {
  C lo, hi;
  __device__ __forceinline__ C operator()(C v) const { return v < lo ? lo : (v > hi ? hi : v); }  // nan passes
};

template <typename C>
struct AxpyF {
  C alpha;
  __device__ __forceinline__ C operator()(C y, C x) const { return add_rn(y, mul_rn(alpha, x)); }
};

// ---------------------------------------------------------------- copy conversions (cpu/loop.h convert)
// Float to integer outside the target's range (nan included) is undefined in C++; the CPU build (x86-64)
// gets the "integer indefinite" value, the type's minimum, from cvtt*2si. The GPU's cvt saturates and maps
// nan to 0, so the CPU's result is reproduced explicitly.
template <typename I, typename F>
__device__ __forceinline__ I float_to_int(F v) {
  const double d = double(v);
  if constexpr (std::is_same_v<I, int32_t>) {
    return (d > -2147483649.0 && d < 2147483648.0) ? I(v) : I(-2147483647 - 1);
  } else {
    return (d >= -9223372036854775808.0 && d < 9223372036854775808.0) ? I(v) : I(-9223372036854775807LL - 1);
  }
}

// In is the source's compute type (float for float16 and bfloat16). Same-dtype copies never get here (they move bits).
template <typename Out, typename In>
struct ConvertF {
  __device__ __forceinline__ Out operator()(In v) const {
    if constexpr (std::is_same_v<Out, __half>) {
      if constexpr (std::is_same_v<In, double>) return __double2half(v);  // one rounding, as the CPU
      else return __float2half_rn(static_cast<float>(v));                // ints round to float first, as the CPU
    } else if constexpr (std::is_same_v<Out, __nv_bfloat16>) {
      if constexpr (std::is_same_v<In, double>) return __double2bfloat16(v);
      else return __float2bfloat16_rn(static_cast<float>(v));
    } else if constexpr (std::is_same_v<Out, bool>) {
      return v != In(0);
    } else if constexpr (std::is_integral_v<Out> && std::is_floating_point_v<In>) {
      return float_to_int<Out>(v);
    } else {
      return static_cast<Out>(v);
    }
  }
};

struct Identity {
  template <typename T>
  __device__ __forceinline__ T operator()(T v) const { return v; }
};

// ---------------------------------------------------------------- geometry
// Collapsed geometry of N same-shaped operands: size-1 axes dropped, axes contiguous across all operands
// merged (cpu/loop.h's rule); strides in elements.
template <int N>
struct Geom {
  Strided s[N];
};

template <int N>
Geom<N> collapse(const std::array<const Tensor*, N>& ts, bool* contiguous) {
  const Shape& sh = ts[0]->shape();
  Geom<N> g;
  int nd = 0;
  for (size_t d = 0; d < sh.size(); ++d) {
    if (sh[d] == 1) continue;
    bool merge = nd > 0;
    for (int k = 0; k < N && merge; ++k) merge = g.s[k].strides[nd - 1] == ts[k]->strides()[d] * sh[d];
    for (int k = 0; k < N; ++k) {
      if (merge) {
        g.s[k].shape[nd - 1] *= sh[d];
        g.s[k].strides[nd - 1] = ts[k]->strides()[d];
      } else {
        g.s[k].shape[nd] = sh[d];
        g.s[k].strides[nd] = ts[k]->strides()[d];
      }
    }
    if (!merge) ++nd;
  }
  if (nd == 0) {  // a single element
    nd = 1;
    for (int k = 0; k < N; ++k) g.s[k].shape[0] = 1, g.s[k].strides[0] = 0;
  }
  *contiguous = nd == 1;
  for (int k = 0; k < N; ++k) {
    g.s[k].ndim = nd;
    *contiguous = *contiguous && (g.s[k].strides[0] == 1 || g.s[k].shape[0] == 1);
  }
  return g;
}

// Offsets of the i-th element in every operand. Strided::offset would divide once per operand and axis in
// 64 bits (a software routine); the operands share one shape, so the index is decomposed once, in 32 bits
// whenever n (hence every extent) fits. One axis (a flat slice, a broadcast scalar, a misaligned contiguous
// run) needs no division at all.
template <int N>
__device__ __forceinline__ void offsets(const Geom<N>& g, int64_t i, bool small, int64_t (&off)[N]) {
  const int nd = g.s[0].ndim;
#pragma unroll
  for (int k = 0; k < N; ++k) off[k] = nd == 1 ? i * g.s[k].strides[0] : 0;
  if (nd == 1) return;
  for (int d = nd - 1; d >= 0; --d) {
    int64_t idx;
    if (small) {
      const uint32_t e = uint32_t(g.s[0].shape[d]), q = uint32_t(i) / e;
      idx = uint32_t(i) - q * e;
      i = q;
    } else {
      const int64_t q = i / g.s[0].shape[d];
      idx = i - q * g.s[0].shape[d];
      i = q;
    }
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] += idx * g.s[k].strides[d];
  }
}

__device__ __forceinline__ int64_t first_index() { return blockIdx.x * int64_t(blockDim.x) + threadIdx.x; }
__device__ __forceinline__ int64_t grid_step() { return int64_t(gridDim.x) * blockDim.x; }

// ---------------------------------------------------------------- kernels
// f(off) with off[k] the element offset of operand k for the i-th element (row-major order).
template <bool Contiguous, int N, typename F>
__global__ void index_kernel(int64_t n, Geom<N> g, F f) {
  const bool small = n <= int64_t(UINT32_MAX);
  for (int64_t i = first_index(); i < n; i += grid_step()) {
    int64_t off[N];
    if constexpr (Contiguous) {
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] = i;
    } else {
      offsets(g, i, small, off);
    }
    f(off);
  }
}

struct None {};  // the absent second input of a one-input map

template <typename Out, typename R>
__device__ __forceinline__ Out finish(R r) {
  if constexpr (std::is_same_v<Out, R>) return r;  // comparisons, conversions and bit copies
  else return store_as<Out>(r);
}

template <typename F, typename A, typename B>
__device__ __forceinline__ auto apply(const F& f, const A* a, const B* b) {
  if constexpr (std::is_same_v<B, None>) return f(load(a));
  else return f(load(a), load(b));
}

// out[i] = f(a[i], b[i]) at strided offsets.
template <typename F, typename Out, typename A, typename B>
struct MapAt {
  F f;
  Out* o;
  const A* a;
  const B* b;
  template <int N>
  __device__ __forceinline__ void operator()(const int64_t (&off)[N]) const {
    if constexpr (std::is_same_v<B, None>) o[off[0]] = finish<Out>(apply(f, a + off[1], b));
    else o[off[0]] = finish<Out>(apply(f, a + off[1], b + off[2]));
  }
};

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Contiguous map, V elements per 16-byte access of the widest operand; the last n % V elements are done
// one by one by the first threads. No __restrict__: in-place use makes out alias an input.
template <int V, typename F, typename Out, typename A, typename B>
__global__ void map_vec_kernel(int64_t n, F f, Out* o, const A* a, const B* b) {
  const int64_t packs = n / V;
  for (int64_t p = first_index(); p < packs; p += grid_step()) {
    const Pack<A, V> av = reinterpret_cast<const Pack<A, V>*>(a)[p];
    Pack<Out, V> ov;
    if constexpr (std::is_same_v<B, None>) {
#pragma unroll
      for (int k = 0; k < V; ++k) ov.v[k] = finish<Out>(apply(f, &av.v[k], b));
    } else {
      const Pack<B, V> bv = reinterpret_cast<const Pack<B, V>*>(b)[p];
#pragma unroll
      for (int k = 0; k < V; ++k) ov.v[k] = finish<Out>(apply(f, &av.v[k], &bv.v[k]));
    }
    reinterpret_cast<Pack<Out, V>*>(o)[p] = ov;
  }
  const int64_t t = packs * V + first_index();
  if (t < n) {
    if constexpr (std::is_same_v<B, None>) o[t] = finish<Out>(apply(f, a + t, b));
    else o[t] = finish<Out>(apply(f, a + t, b + t));
  }
}

// ---------------------------------------------------------------- launchers
template <bool Contiguous, int N, typename F>
void launch_index(const char* name, int device, int64_t n, const Geom<N>& g, const F& f) {
  const Launch l = launch_for(n, device);
  index_kernel<Contiguous, N><<<l.blocks, l.threads, 0, stream(device)>>>(n, g, f);
  SL_CUDA_LAUNCHED(name);
}

template <typename T>
bool aligned(const void* p, int v) {
  return reinterpret_cast<uintptr_t>(p) % (uintptr_t(v) * sizeof(T)) == 0;
}

// out = f(a) (b == nullptr, B = None) or f(a, b): all of out's shape. Out / A / B are storage types.
template <typename Out, typename A, typename B = None, typename F>
void launch_map(const char* name, const Tensor& out, const F& f, const Tensor& a, const Tensor* b = nullptr) {
  constexpr bool kUnary = std::is_same_v<B, None>;
  constexpr int N = kUnary ? 2 : 3;
  const int64_t n = out.numel();
  if (n == 0) return;
  const int device = out.device().index;
  DeviceGuard guard(device);

  bool contiguous = false;
  Geom<N> g;
  if constexpr (kUnary) g = collapse<N>({&out, &a}, &contiguous);
  else g = collapse<N>({&out, &a, b}, &contiguous);
  Out* o = static_cast<Out*>(out.data_ptr());
  const A* pa = static_cast<const A*>(a.data_ptr());
  const B* pb = kUnary ? nullptr : static_cast<const B*>(b->data_ptr());

  constexpr size_t kWidest = std::max({sizeof(Out), sizeof(A), kUnary ? size_t(1) : sizeof(B)});
  constexpr int V = int(16 / kWidest);
  if (contiguous && aligned<Out>(o, V) && aligned<A>(pa, V) && (kUnary || aligned<B>(pb, V))) {
    const Launch l = launch_for(n / V > 0 ? n / V : 1, device);
    map_vec_kernel<V><<<l.blocks, l.threads, 0, stream(device)>>>(n, f, o, pa, pb);
    SL_CUDA_LAUNCHED(name);
    return;
  }
  launch_index<false>(name, device, n, g, MapAt<F, Out, A, B>{f, o, pa, pb});
}

// ---------------------------------------------------------------- compile-time op selection


template <BinaryOp Op, typename T>
using binary_out_t = std::conditional_t<(Op >= BinaryOp::kEq), bool, T>;

// The scalar takes the tensor's dtype first, as on the CPU: for float16 it is rounded to half (once, from
// double), not kept as a float.
template <typename T>
compute_of<T> scalar_as(double s) {
  if constexpr (std::is_same_v<T, __half>) return float(::sl::half(s));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return float(::sl::bfloat16(s));
  else if constexpr (std::is_same_v<T, bool>) return s != 0;
  else return static_cast<T>(s);
}

// Integer clip bounds beyond the type's range (the open bounds' infinities included) saturate to its ends.
template <typename C>
C clip_bound(double v) {
  if constexpr (std::is_integral_v<C>) {
    if (v <= double(std::numeric_limits<C>::min())) return std::numeric_limits<C>::min();
    if (v >= double(std::numeric_limits<C>::max())) return std::numeric_limits<C>::max();
  }
  return static_cast<C>(v);
}

// ---------------------------------------------------------------- SGD (cpu/optim.cpp)
// With d = g + wd * p:  buf = d (first step) or mom * buf + keep * d;  p -= lr * (nesterov ? d + mom * buf : buf),
// p updated with the unrounded buf, as on the CPU.
template <typename T, bool kFirst, bool kNesterov>
struct SgdMomentumAt {
  using C = compute_of<T>;
  T* p;
  const T* g;
  T* b;
  C lr, mom, keep, wd;
  __device__ __forceinline__ void operator()(const int64_t (&off)[3]) const {
    const C pv = load(p + off[0]);
    const C d = add_rn(load(g + off[1]), mul_rn(wd, pv));
    C bv;
    if constexpr (kFirst) bv = d;  // the old buffer is not read: it may be uninitialised
    else bv = add_rn(mul_rn(mom, load(b + off[2])), mul_rn(keep, d));
    b[off[2]] = store_as<T>(bv);
    p[off[0]] = store_as<T>(sub_rn(pv, mul_rn(lr, kNesterov ? add_rn(d, mul_rn(mom, bv)) : bv)));
  }
};

template <typename T>
struct SgdPlainAt {
  using C = compute_of<T>;
  T* p;
  const T* g;
  C lr, wd;
  __device__ __forceinline__ void operator()(const int64_t (&off)[2]) const {
    const C pv = load(p + off[0]);
    p[off[0]] = store_as<T>(sub_rn(pv, mul_rn(lr, add_rn(load(g + off[1]), mul_rn(wd, pv)))));
  }
};

template <int N, typename F>
void launch_index_any(const char* name, const Tensor& first, const std::array<const Tensor*, N>& ts, const F& f) {
  const int64_t n = first.numel();
  if (n == 0) return;
  const int device = first.device().index;
  DeviceGuard guard(device);
  bool contiguous = false;
  const Geom<N> g = collapse<N>(ts, &contiguous);
  if (contiguous) launch_index<true>(name, device, n, g, f);
  else launch_index<false>(name, device, n, g, f);
}

template <typename T, bool kFirst, bool kNesterov>
void sgd_momentum(const Tensor& param, const Tensor& grad, const Tensor& buf, const SgdStep& s) {
  using C = compute_of<T>;
  const SgdMomentumAt<T, kFirst, kNesterov> f{param.data<T>(), grad.data<T>(), buf.data<T>(), C(s.lr),
                                              C(s.momentum),   C(1.0 - s.dampening), C(s.weight_decay)};
  launch_index_any<3>("sgd_update", param, {&param, &grad, &buf}, f);
}

// One bit pattern written at every (strided) offset of a view. A broadcast view writes the same element several
// times with the same value, which is harmless, as on the CPU.
template <typename U>
struct FillAt {
  U* o;
  U v;
  __device__ __forceinline__ void operator()(const int64_t (&off)[1]) const { o[off[0]] = v; }
};

}  // namespace

void fill_strided(const Tensor& t, uint64_t pattern) {
  auto run = [&](auto tag) {
    using U = decltype(tag);
    launch_index_any<1>("fill", t, {&t}, FillAt<U>{static_cast<U*>(t.data_ptr()), static_cast<U>(pattern)});
  };
  switch (t.itemsize()) {
    case 1: return run(uint8_t());
    case 2: return run(uint16_t());
    case 4: return run(uint32_t());
    case 8: return run(uint64_t());
    default: throw TypeError(str("fill: unsupported item size ", t.itemsize()));
  }
}

// ---------------------------------------------------------------- entry points (cuda/kernels.h)
void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  with_binary_op(op, [&](auto op_c) {
    constexpr BinaryOp O = decltype(op_c)::value;
    auto run = [&](auto tag) {
      using T = decltype(tag);
      launch_map<binary_out_t<O, T>, T, T>(op_name(op), out, BinaryF<O, compute_of<T>>(), a, &b);
    };
    if constexpr (O >= BinaryOp::kEq) {
      SL_CUDA_DISPATCH_ALL(a.dtype(), op_name(op), [&] { run(scalar_t()); });
    } else {
      SL_CUDA_DISPATCH_NUMERIC(a.dtype(), op_name(op), [&] { run(scalar_t()); });
    }
  });
}

void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& a, double s, bool scalar_first) {
  with_binary_op(op, [&](auto op_c) {
    constexpr BinaryOp O = decltype(op_c)::value;
    auto run = [&](auto tag) {
      using T = decltype(tag);
      const ScalarF<O, compute_of<T>> f{scalar_as<T>(s), scalar_first};
      launch_map<binary_out_t<O, T>, T>(op_name(op), out, f, a);
    };
    if constexpr (O >= BinaryOp::kEq) {
      SL_CUDA_DISPATCH_ALL(a.dtype(), op_name(op), [&] { run(scalar_t()); });
    } else {
      SL_CUDA_DISPATCH_NUMERIC(a.dtype(), op_name(op), [&] { run(scalar_t()); });
    }
  });
}

void unary(UnaryOp op, const Tensor& out, const Tensor& x) {
  with_unary_op(op, [&](auto op_c) {
    constexpr UnaryOp O = decltype(op_c)::value;
    auto run = [&](auto tag) {
      using T = decltype(tag);
      launch_map<T, T>(op_name(op), out, UnaryF<O, compute_of<T>>(), x);
    };
    // Past relu the ops are floating-only (the front-end rejects integers), so no integer kernels exist.
    if constexpr (O > UnaryOp::kRelu) {
      SL_CUDA_DISPATCH_FLOAT(x.dtype(), op_name(op), [&] { run(scalar_t()); });
    } else {
      SL_CUDA_DISPATCH_NUMERIC(x.dtype(), op_name(op), [&] { run(scalar_t()); });
    }
  });
}

void clip(const Tensor& out, const Tensor& x, double lo, double hi) {
  SL_CUDA_DISPATCH_NUMERIC(x.dtype(), "clip", [&] {
    using C = compute_of<scalar_t>;
    launch_map<scalar_t, scalar_t>("clip", out, ClipF<C>{clip_bound<C>(lo), clip_bound<C>(hi)}, x);
  });
}

void axpy(double alpha, const Tensor& x, const Tensor& y) {
  SL_CUDA_DISPATCH_NUMERIC(y.dtype(), "axpy", [&] {
    using C = compute_of<scalar_t>;
    launch_map<scalar_t, scalar_t, scalar_t>("axpy", y, AxpyF<C>{static_cast<C>(alpha)}, y, &x);
  });
}

void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& buf, const SgdStep& s) {
  SL_CUDA_DISPATCH_FLOAT(param.dtype(), "sgd_update", [&] {
    using T = scalar_t;
    using C = compute_of<T>;
    if (!buf.defined()) {
      const SgdPlainAt<T> f{param.data<T>(), grad.data<T>(), C(s.lr), C(s.weight_decay)};
      return launch_index_any<2>("sgd_update", param, {&param, &grad}, f);
    }
    if (s.first)
      return s.nesterov ? sgd_momentum<T, true, true>(param, grad, buf, s)
                        : sgd_momentum<T, true, false>(param, grad, buf, s);
    return s.nesterov ? sgd_momentum<T, false, true>(param, grad, buf, s)
                      : sgd_momentum<T, false, false>(param, grad, buf, s);
  });
}

void copy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype()) {
    // Same dtype: move the bits (a float16 nan keeps its payload, as the CPU's memcpy / assignment).
    switch (dst.itemsize()) {
      case 1: return launch_map<uint8_t, uint8_t>("copy", dst, Identity(), src);
      case 2: return launch_map<uint16_t, uint16_t>("copy", dst, Identity(), src);
      case 4: return launch_map<uint32_t, uint32_t>("copy", dst, Identity(), src);
      case 8: return launch_map<uint64_t, uint64_t>("copy", dst, Identity(), src);
      default: throw TypeError(str("copy: unsupported dtype ", int(dst.dtype())));
    }
  }
  SL_CUDA_DISPATCH_ALL(dst.dtype(), "copy", [&] {
    using Out = scalar_t;
    SL_CUDA_DISPATCH_ALL(src.dtype(), "copy", [&] {
      launch_map<Out, scalar_t>("copy", dst, ConvertF<Out, compute_of<scalar_t>>(), src);
    });
  });
}

}  // namespace sl::cuda
