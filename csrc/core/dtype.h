// Element types, and the 16-bit float types used for float16 (IEEE binary16) and bfloat16 tensors on the CPU.
#pragma once
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

namespace sl {

// New dtypes go at the end: the codes are part of the Python API (DType values) and of checkpoints.
enum class DType : int { kFloat16 = 0, kFloat32 = 1, kFloat64 = 2, kInt32 = 3, kInt64 = 4, kBool = 5, kBFloat16 = 6 };
constexpr int kNumDTypes = 7;

size_t itemsize(DType t);
const char* dtype_name(DType t);
bool is_floating(DType t);
// numpy's array-interface type string ("<f4", "|b1", ...), used by the buffer protocol and DLPack.
const char* buffer_format(DType t);

// float <-> binary16 conversions: round to nearest even, keep inf and nan (quiet), subnormals exact.
inline float half_bits_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    float v = float(mant) * 5.9604644775390625e-08f;  // mant * 2^-24, exact
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_half_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u)  // inf stays inf; nan stays a (quiet) nan with its top payload bits
    return sign | 0x7c00u | (ax > 0x7f800000u ? uint16_t(0x200u | ((ax >> 13) & 0x3ffu)) : 0);
  if (ax >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf
  if (ax < 0x38800000u) {                        // below 2^-14: half subnormal (or zero)
    // Adding 0.5f puts the value's 2^-24 units into the low mantissa bits; the FPU rounds to even.
    float af;
    std::memcpy(&af, &ax, 4);
    af += 0.5f;
    uint32_t b;
    std::memcpy(&b, &af, 4);
    return sign | uint16_t(b - 0x3f000000u);
  }
  uint32_t odd = (ax >> 13) & 1u;
  ax += 0xc8000fffu + odd;  // rebias exponent (127 -> 15) and round to nearest even
  return sign | uint16_t(ax >> 13);
}

// double -> float rounding to odd (an inexact result gets its lowest mantissa bit set). A following
// round-to-nearest-even to a narrower format (binary16, bfloat16) then rounds as if from the double
// once; going through a plain float conversion would round twice and can land one ulp off.
inline float double_to_float_round_odd(double d) {
  float f = static_cast<float>(d);
  if (static_cast<double>(f) != d && d == d && f - f == 0.0f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    if (std::abs(static_cast<double>(f)) > std::abs(d)) --b;  // truncate toward zero (same sign)
    b |= 1u;                                                   // sticky: "there was more"
    std::memcpy(&f, &b, 4);
  }
  return f;
}

inline uint16_t double_to_half_bits(double d) { return float_to_half_bits(double_to_float_round_odd(d)); }

struct half {
  uint16_t bits = 0;
  half() = default;
  explicit half(float f) : bits(float_to_half_bits(f)) {}
  explicit half(double d) : bits(double_to_half_bits(d)) {}
  operator float() const { return half_bits_to_float(bits); }
};

// bfloat16 is the top half of a float32 (8 exponent bits, 7 mantissa bits): same range, so subnormals and
// overflow need no special case; rounding to nearest even, inf stays inf, nan stays a quiet nan.
inline float bfloat16_bits_to_float(uint16_t b) {
  const uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bfloat16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x0040u);  // nan: set the quiet bit
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even; a carry into the exponent is right (up to inf)
  return uint16_t(x >> 16);
}

inline uint16_t double_to_bfloat16_bits(double d) { return float_to_bfloat16_bits(double_to_float_round_odd(d)); }

struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  explicit bfloat16(float f) : bits(float_to_bfloat16_bits(f)) {}
  explicit bfloat16(double d) : bits(double_to_bfloat16_bits(d)) {}
  operator float() const { return bfloat16_bits_to_float(bits); }
};

// The 16-bit float storage types: stored as bits, computed in float.
template <typename T>
inline constexpr bool is_half_like_v = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

// Arithmetic type used to compute on an element type: float for half, the type itself otherwise.
template <typename T> struct compute_type { using type = T; };
template <> struct compute_type<half> { using type = float; };
template <> struct compute_type<bfloat16> { using type = float; };
template <typename T> using compute_t = typename compute_type<T>::type;

template <typename T> struct dtype_of;
template <> struct dtype_of<half> { static constexpr DType value = DType::kFloat16; };
template <> struct dtype_of<float> { static constexpr DType value = DType::kFloat32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::kFloat64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::kInt32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::kInt64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::kBool; };
template <> struct dtype_of<bfloat16> { static constexpr DType value = DType::kBFloat16; };

}  // namespace sl

// Runs the body with `scalar_t` bound to the C++ type of `dtype`: ALL types, NUMERIC (no bool) or FLOAT.
// The case lists nest, so a new dtype is added in one place.
#define SL_DISPATCH_CASE(enum_val, type, ...) \
  case enum_val: {                            \
    using scalar_t = type;                    \
    __VA_ARGS__();                            \
    break;                                    \
  }

#define SL_FLOAT_CASES(...)                                           \
  SL_DISPATCH_CASE(::sl::DType::kFloat16, ::sl::half, __VA_ARGS__)    \
  SL_DISPATCH_CASE(::sl::DType::kFloat32, float, __VA_ARGS__)         \
  SL_DISPATCH_CASE(::sl::DType::kFloat64, double, __VA_ARGS__)       \
  SL_DISPATCH_CASE(::sl::DType::kBFloat16, ::sl::bfloat16, __VA_ARGS__)
#define SL_NUMERIC_CASES(...)                                         \
  SL_FLOAT_CASES(__VA_ARGS__)                                         \
  SL_DISPATCH_CASE(::sl::DType::kInt32, int32_t, __VA_ARGS__)         \
  SL_DISPATCH_CASE(::sl::DType::kInt64, int64_t, __VA_ARGS__)

#define SL_DISPATCH_ALL(dtype, op_name, ...)                                         \
  switch (dtype) {                                                                   \
    SL_NUMERIC_CASES(__VA_ARGS__)                                                    \
    SL_DISPATCH_CASE(::sl::DType::kBool, bool, __VA_ARGS__)                          \
    default:                                                                         \
      throw ::sl::TypeError(::sl::str(op_name, ": unsupported dtype ", int(dtype))); \
  }

#define SL_DISPATCH_NUMERIC(dtype, op_name, ...)                                                        \
  switch (dtype) {                                                                                      \
    SL_NUMERIC_CASES(__VA_ARGS__)                                                                       \
    default:                                                                                            \
      throw ::sl::TypeError(::sl::str(op_name, ": expected a numeric dtype, got ", ::sl::dtype_name(dtype), \
                                      "; cast with as_type() first"));                                  \
  }

#define SL_DISPATCH_FLOAT(dtype, op_name, ...)                                                          \
  switch (dtype) {                                                                                      \
    SL_FLOAT_CASES(__VA_ARGS__)                                                                         \
    default:                                                                                            \
      throw ::sl::TypeError(::sl::str(op_name, ": expected a floating dtype (float16, bfloat16, float32, float64), got ", \
                                      ::sl::dtype_name(dtype), "; cast with as_type() first"));          \
  }
