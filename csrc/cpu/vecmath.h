// float32 exp / tanh / sigmoid written without branches or library calls, so a plain loop over them compiles to
// SIMD code. libm's expf / tanhf are scalar calls (the largest cost of a tanh MLP's training step:
// docs/benchmarks/cpu_core.md, "Measurements behind the kernels' design"); these stay within 2 ulp of the float64
// result over the float range (tests/unit/test_core_elementwise.py checks against numpy in float64).
//
// Method (the classic one, as in Cephes and SLEEF): exp reduces x = n ln2 + r with |r| <= ln2 / 2, evaluates
// a degree-7 polynomial for e^r and scales by 2^n through the exponent bits (in two steps, so that results
// in the subnormal range keep their precision); tanh uses an odd polynomial near 0, where 1 - 2 / (e^2x + 1)
// would cancel, and that formula elsewhere. Special values are selected at the end: nan stays nan, the
// infinities and out-of-range inputs give the limits.
#pragma once
#include <cstdint>
#include <cstring>

// Always inlined: as an out-of-line call the per-element function cannot be vectorised, and GCC's heuristics
// decline to inline it at some call sites.
#define SL_VECMATH inline __attribute__((always_inline))

namespace sl::cpu::vecmath {

SL_VECMATH float bits_to_float(int32_t i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}

SL_VECMATH float exp_f32(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;     // ln 2 split so that n * kLn2Hi is exact for |n| < 2^9
  constexpr float kLn2Lo = 1.428606765330187e-06f;
  constexpr float kMax = 88.72283905206835f;       // above: +inf
  constexpr float kMin = -103.97208f;              // below: +0 (the smallest subnormal is e^-103.28)
  float xc = x > kMax ? kMax : x;
  xc = xc >= kMin ? xc : kMin;  // nan fails the test too: computed on kMin, replaced at the end
  // Round to nearest by adding and removing 1.5 * 2^23 (the SSE2 baseline has no vector round).
  constexpr float kRound = 12582912.0f;
  const float nf = (xc * kLog2e + kRound) - kRound;
  const float r = (xc - nf * kLn2Hi) - nf * kLn2Lo;
  // e^r = 1 + r + r^2 (1/2 + r/6 + ...): Taylor coefficients to r^7, error < 1e-9 relative on |r| <= ln2/2.
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r * r + r + 1.0f;
  // 2^n = 2^(n/2) * 2^(n - n/2): each factor is a normal float for n in [-150, 128].
  const int32_t n = int32_t(nf);
  const int32_t n1 = n / 2, n2 = n - n1;
  float y = p * bits_to_float((n1 + 127) << 23) * bits_to_float((n2 + 127) << 23);
  y = x > kMax ? __builtin_inff() : y;
  y = x < kMin ? 0.0f : y;
  return x != x ? x : y;
}

SL_VECMATH float tanh_f32(float x) {
  const float a = x < 0.0f ? -x : x;
  // |x| < 0.625: x + x^3 P(x^2), minimax coefficients (Cephes tanhf), within 1 ulp.
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  // Elsewhere 1 - 2 / (e^2|x| + 1) with the sign of x; e^2|x| overflows to inf for |x| > 44, giving 1.
  const float large_abs = 1.0f - 2.0f / (exp_f32(2.0f * a) + 1.0f);
  const float large = x < 0.0f ? -large_abs : large_abs;
  return a < 0.625f ? small : large;  // nan fails the test and takes exp's nan through `large`
}

SL_VECMATH float sigmoid_f32(float x) {
  // With e = e^-|x| (never overflows): 1 / (1 + e) for x >= 0, e / (1 + e) for x < 0, so results down in
  // the subnormal range keep their precision instead of becoming 1 / inf = 0. nan passes through e.
  const float e = exp_f32(x < 0.0f ? x : -x);
  const float inv = 1.0f / (1.0f + e);
  return x < 0.0f ? e * inv : inv;
}

}  // namespace sl::cpu::vecmath
