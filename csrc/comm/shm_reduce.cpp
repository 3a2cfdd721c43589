// Reduction kernels of the shm collectives (see shm_reduce.h). Blocked so that the accumulator stays
// in L1 and each pass over one source is a flat loop the compiler vectorises.
#include "comm/shm_reduce.h"

#include <algorithm>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "core/errors.h"
#include "cpu/isa.h"

namespace sl::comm {

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::kSum: return "sum";
    case CommOp::kAvg: return "avg";
    case CommOp::kMax: return "max";
    case CommOp::kMin: return "min";
    case CommOp::kProd: return "prod";
  }
  return "?";
}

namespace {

// The type a dtype is accumulated in: float for float16 and bfloat16 (bfloat16 converts with shifts, so the
// plain fold below vectorises); for integers, the unsigned type of the same width
// for sum and prod (signed overflow is undefined in C++, unsigned wraps like numpy), the type itself
// for max and min.
template <typename T, CommOp kOp>
struct Acc {
  using type = std::conditional_t<
      is_half_like_v<T>, float,
      std::conditional_t<std::is_integral_v<T> && (kOp == CommOp::kSum || kOp == CommOp::kProd),
                         std::make_unsigned_t<std::conditional_t<std::is_integral_v<T>, T, int>>, T>>;
};

template <typename A, typename T>
inline A load(T v) {
  if constexpr (is_half_like_v<T>) return float(v);
  else return static_cast<A>(v);
}

template <typename T, typename A>
inline T store(A v) {
  if constexpr (is_half_like_v<T>) {
    return T(float(v));  // round to nearest even
  } else {
    return static_cast<T>(v);  // unsigned -> signed keeps the bits (GCC/Clang; C++20 guarantees it)
  }
}

template <CommOp kOp, typename A>
inline A combine(A a, A b) {
  if constexpr (kOp == CommOp::kSum || kOp == CommOp::kAvg) return a + b;
  else if constexpr (kOp == CommOp::kProd) return a * b;
  // NaN wins, as in numpy: a NaN accumulator stays (a != a); a NaN b fails a >= b and is taken.
  else if constexpr (kOp == CommOp::kMax) return (a >= b || a != a) ? a : b;
  else return (a <= b || a != a) ? a : b;
}

template <typename T, CommOp kOp>
void fold(const char* const* srcs, int n, char* dst, int64_t count) {
  using A = typename Acc<T, kOp>::type;
  constexpr int64_t kBlock = 512;
  A acc[kBlock];
  for (int64_t b = 0; b < count; b += kBlock) {
    const int64_t m = std::min(kBlock, count - b);
    const T* s0 = reinterpret_cast<const T*>(srcs[0]) + b;
    for (int64_t j = 0; j < m; ++j) acc[j] = load<A>(s0[j]);
    for (int q = 1; q < n; ++q) {
      const T* s = reinterpret_cast<const T*>(srcs[q]) + b;
      for (int64_t j = 0; j < m; ++j) acc[j] = combine<kOp>(acc[j], load<A>(s[j]));
    }
    T* d = reinterpret_cast<T*>(dst) + b;
    if constexpr (kOp == CommOp::kAvg) {
      const A div = A(n);
      for (int64_t j = 0; j < m; ++j) d[j] = store<T>(acc[j] / div);
    } else {
      for (int64_t j = 0; j < m; ++j) d[j] = store<T>(acc[j]);
    }
  }
}

// ---------------------------------------------------------------- float16
// Converting one half at a time in software costs several times the rest of the fold, so float16 (the wire
// dtype of DistOpt's fp16 path) would reduce slower than float32 of twice the bytes (measured:
// docs/benchmarks/communication.md, "Measurements behind the code's choices"). So halves are
// converted a block at a time, with the F16C instructions where the CPU has them (any x86-64 since
// 2012, chosen at run time; the build targets baseline x86-64; other architectures, e.g. the aarch64 wheel,
// take the software path). Both conversions round to nearest even
// exactly like the software ones, so results do not depend on the path.
void halves_to_floats_sw(const half* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = half_bits_to_float(s[i].bits);
}
void floats_to_halves_sw(const float* s, half* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i].bits = float_to_half_bits(s[i]);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx,f16c"))) void halves_to_floats_f16c(const half* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  halves_to_floats_sw(s + i, d + i, n - i);
}
__attribute__((target("avx,f16c"))) void floats_to_halves_f16c(const float* s, half* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  floats_to_halves_sw(s + i, d + i, n - i);
}
#endif

struct HalfConverters {
  void (*to_float)(const half*, float*, int64_t) = halves_to_floats_sw;
  void (*to_half)(const float*, half*, int64_t) = floats_to_halves_sw;
  HalfConverters() {
#if defined(__x86_64__) && defined(__GNUC__)
    if (cpu::has_f16c()) {  // CPUID itself: __builtin_cpu_supports reads nothing in the portable (zig) build
      to_float = halves_to_floats_f16c;
      to_half = floats_to_halves_f16c;
    }
#endif
  }
};

template <CommOp kOp>
void fold_half(const char* const* srcs, int n, char* dst, int64_t count) {
  static const HalfConverters cvt;
  constexpr int64_t kBlock = 512;
  float acc[kBlock], next[kBlock];
  for (int64_t b = 0; b < count; b += kBlock) {
    const int64_t m = std::min(kBlock, count - b);
    cvt.to_float(reinterpret_cast<const half*>(srcs[0]) + b, acc, m);
    for (int q = 1; q < n; ++q) {
      cvt.to_float(reinterpret_cast<const half*>(srcs[q]) + b, next, m);
      for (int64_t j = 0; j < m; ++j) acc[j] = combine<kOp>(acc[j], next[j]);
    }
    if constexpr (kOp == CommOp::kAvg) {
      const float div = float(n);
      for (int64_t j = 0; j < m; ++j) acc[j] /= div;
    }
    cvt.to_half(acc, reinterpret_cast<half*>(dst) + b, m);
  }
}

template <typename T, CommOp kOp>
void fold_any(const char* const* srcs, int n, char* dst, int64_t count) {
  if constexpr (std::is_same_v<T, half>) fold_half<kOp>(srcs, n, dst, count);
  else fold<T, kOp>(srcs, n, dst, count);
}

}  // namespace

void reduce_into(DType dtype, CommOp op, const char* const* srcs, int n, char* dst, int64_t count) {
  SL_DISPATCH_NUMERIC(dtype, "reduce", [&] {
    switch (op) {
      case CommOp::kSum: fold_any<scalar_t, CommOp::kSum>(srcs, n, dst, count); break;
      case CommOp::kMax: fold_any<scalar_t, CommOp::kMax>(srcs, n, dst, count); break;
      case CommOp::kMin: fold_any<scalar_t, CommOp::kMin>(srcs, n, dst, count); break;
      case CommOp::kProd: fold_any<scalar_t, CommOp::kProd>(srcs, n, dst, count); break;
      case CommOp::kAvg:
        if constexpr (std::is_integral_v<scalar_t>) SL_ASSERT(!"avg of an integer dtype is rejected earlier");
        else fold_any<scalar_t, CommOp::kAvg>(srcs, n, dst, count);
        break;
    }
  });
}

}  // namespace sl::comm
