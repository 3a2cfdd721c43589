// uniform / gaussian / bernoulli fills. Element i of a draw uses counter (offset + i / 4), word i % 4:
// four 32-bit words per counter, so the front-end reserves ceil(n / 4) counters per draw.
// float64 uses two words per uniform (53 random bits), so two elements per counter.
#include <cmath>
#include <limits>

#include "core/errors.h"
#include "core/generator.h"
#include "cpu/bernoulli_fast.h"
#include "cpu/kernels.h"
#include "cpu/loop.h"

namespace sl::cpu {
namespace {

constexpr double kTwoPi = 6.283185307179586;

inline float u24(uint32_t w) { return float(w >> 8) * (1.0f / 16777216.0f); }  // [0, 1)
inline double u53(uint32_t hi, uint32_t lo) {
  return double((uint64_t(hi) << 21) ^ (lo >> 11)) * (1.0 / 9007199254740992.0);  // [0, 1)
}

// The largest value of type T strictly below `high` (rounding low + u * (high - low) to T can reach high).
template <typename T>
T largest_below(double high) {
  T v = convert<T>(high);
  while (double(compute_t<T>(v)) >= high) {
    if constexpr (is_half_like_v<T>) {  // sign-magnitude bits: step the magnitude
      if (v.bits == 0x0000u) v.bits = 0x8001u;           // +0 -> the negative subnormal closest to 0
      else if (v.bits & 0x8000u) ++v.bits;               // negative: larger magnitude
      else --v.bits;                                     // positive: smaller magnitude
    } else {
      v = std::nextafter(v, -std::numeric_limits<T>::infinity());
    }
  }
  return v;
}

// Fills contiguous t; gen(counter_words, lane) -> the element's value of type T.
template <typename T, typename Gen>
void fill_random(const Tensor& t, uint64_t seed, uint64_t offset, Gen gen) {
  T* o = t.data<T>();
  parallel_range(t.numel(), [&](int64_t b, int64_t e) {
    constexpr int per = std::is_same_v<T, double> ? 2 : 4;
    for (int64_t i = b; i < e;) {
      const int64_t c = i / per;
      const auto words = philox4x32(offset + uint64_t(c), seed);
      for (int lane = int(i % per); lane < per && i < e; ++lane, ++i) o[i] = gen(words, lane);
    }
  }, 8);
}

}  // namespace

void uniform(const Tensor& t, double low, double high, uint64_t seed, uint64_t offset) {
  SL_DISPATCH_FLOAT(t.dtype(), "uniform", [&] {
    using C = compute_t<scalar_t>;
    const scalar_t top = high > low ? largest_below<scalar_t>(high) : convert<scalar_t>(low);
    fill_random<scalar_t>(t, seed, offset, [&](const std::array<uint32_t, 4>& w, int lane) {
      double u = std::is_same_v<C, double> ? u53(w[2 * lane], w[2 * lane + 1]) : double(u24(w[lane]));
      scalar_t v = convert<scalar_t>(low + (high - low) * u);
      return double(C(v)) >= high && high > low ? top : v;  // keep the interval half-open: [low, high)
    });
  });
}

void gaussian(const Tensor& t, double mean, double std, uint64_t seed, uint64_t offset) {
  // Box-Muller: words (0,1) give elements 0 and 1 of a counter, words (2,3) elements 2 and 3.
  SL_DISPATCH_FLOAT(t.dtype(), "gaussian", [&] {
    using C = compute_t<scalar_t>;
    fill_random<scalar_t>(t, seed, offset, [&](const std::array<uint32_t, 4>& w, int lane) {
      if constexpr (std::is_same_v<C, double>) {
        double u1 = 1.0 - u53(w[0], w[1]), u2 = u53(w[2], w[3]);  // u1 in (0, 1]
        double r = std::sqrt(-2.0 * std::log(u1));
        return convert<scalar_t>(mean + std * (lane == 0 ? r * std::cos(kTwoPi * u2) : r * std::sin(kTwoPi * u2)));
      } else {
        int pair = lane / 2;
        float u1 = 1.0f - u24(w[2 * pair]), u2 = u24(w[2 * pair + 1]);
        float r = std::sqrt(-2.0f * std::log(u1));
        float z = (lane % 2 == 0) ? r * std::cos(float(kTwoPi) * u2) : r * std::sin(float(kTwoPi) * u2);
        return convert<scalar_t>(mean + std * double(z));
      }
    });
  });
}

void bernoulli(const Tensor& t, double p, uint64_t seed, uint64_t offset) {
  if (t.dtype() == DType::kFloat32) return bernoulli_float32(t.data<float>(), t.numel(), p, seed, offset);
  SL_DISPATCH_ALL(t.dtype(), "bernoulli", [&] {
    fill_random<scalar_t>(t, seed, offset, [&](const std::array<uint32_t, 4>& w, int lane) {
      if constexpr (std::is_same_v<scalar_t, double>) return convert<scalar_t>(double(u53(w[2 * lane], w[2 * lane + 1]) < p));
      else return convert<scalar_t>(double(double(u24(w[lane])) < p));
    });
  });
}

}  // namespace sl::cpu
