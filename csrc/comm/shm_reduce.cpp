// Reduction kernels of the shm collectives (see shm_reduce.h). Blocked so that the accumulator stays
// in L1 and each pass over one source is a flat loop the compiler vectorises.
#include "comm/shm_reduce.h"

#include <algorithm>
#include <type_traits>

#include "core/errors.h"

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

// The type a dtype is accumulated in: float for half; for integers, the unsigned type of the same width
// for sum and prod (signed overflow is undefined in C++, unsigned wraps like numpy), the type itself
// for max and min.
template <typename T, CommOp kOp>
struct Acc {
  using type = std::conditional_t<
      std::is_same_v<T, half>, float,
      std::conditional_t<std::is_integral_v<T> && (kOp == CommOp::kSum || kOp == CommOp::kProd),
                         std::make_unsigned_t<std::conditional_t<std::is_integral_v<T>, T, int>>, T>>;
};

template <typename A, typename T>
inline A load(T v) {
  if constexpr (std::is_same_v<T, half>) return half_bits_to_float(v.bits);
  else return static_cast<A>(v);
}

template <typename T, typename A>
inline T store(A v) {
  if constexpr (std::is_same_v<T, half>) {
    half h;
    h.bits = float_to_half_bits(v);
    return h;
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

}  // namespace

void reduce_into(DType dtype, CommOp op, const char* const* srcs, int n, char* dst, int64_t count) {
  SL_DISPATCH_NUMERIC(dtype, "reduce", [&] {
    switch (op) {
      case CommOp::kSum: fold<scalar_t, CommOp::kSum>(srcs, n, dst, count); break;
      case CommOp::kMax: fold<scalar_t, CommOp::kMax>(srcs, n, dst, count); break;
      case CommOp::kMin: fold<scalar_t, CommOp::kMin>(srcs, n, dst, count); break;
      case CommOp::kProd: fold<scalar_t, CommOp::kProd>(srcs, n, dst, count); break;
      case CommOp::kAvg:
        if constexpr (std::is_integral_v<scalar_t>) SL_ASSERT(!"avg of an integer dtype is rejected earlier");
        else fold<scalar_t, CommOp::kAvg>(srcs, n, dst, count);
        break;
    }
  });
}

}  // namespace sl::comm
