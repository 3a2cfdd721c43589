// uniform / gaussian / bernoulli fills on the GPU: the CPU's Philox streams element for element
// (cpu/random.cpp). Element i of a draw uses counter offset + i / 4, word i % 4 (float64: offset + i / 2,
// words 2 (i % 2) and 2 (i % 2) + 1); one thread computes one counter's Philox block and writes its
// elements.
//
// Bit-exactness with the CPU:
//  * every product followed by a sum is written with __fmul_rn / __dmul_rn / __dadd_rn, which nvcc never
//    contracts into an FMA: the CPU build (x86-64 baseline, no FMA) rounds the product and the sum apart;
//  * double -> float16 rounds once (__double2half: cvt.rn.f16.f64), as the CPU's half(double);
//  * uniform's `top` (the largest value below `high`) is computed on the host by the CPU's own rule;
//  * gaussian calls the accurate device sqrt / log / cos / sin (never the __fast intrinsics, and the build
//    must not use --use_fast_math). sqrt is correctly rounded on both sides, but device logf / cosf / sinf
//    / log / cos / sin may differ from glibc's in the last ulp, so a few gaussian values can be one ulp
//    (of the float or double computation) away from the CPU's; uniform and bernoulli are bit-identical.
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/generator.h"
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace sl::cuda {
namespace {

constexpr double kTwoPi = 6.283185307179586;

template <typename T> constexpr int kPerCounter = std::is_same_v<T, double> ? 2 : 4;  // elements per counter

// As cpu/random.cpp: 24 random bits -> [0, 1) in float, 53 bits -> [0, 1) in double (both exact).
__device__ __forceinline__ float u24(uint32_t w) { return __fmul_rn(float(w >> 8), 1.0f / 16777216.0f); }
__device__ __forceinline__ double u53(uint32_t hi, uint32_t lo) {
  return __dmul_rn(double((uint64_t(hi) << 21) ^ (lo >> 11)), 1.0 / 9007199254740992.0);
}

// double -> storage type with one rounding, as cpu::convert<T>(double).
template <typename T>
__device__ __forceinline__ T from_double(double v) {
  if constexpr (std::is_same_v<T, __half>) return __double2half(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __double2bfloat16(v);
  else if constexpr (std::is_same_v<T, bool>) return v != 0.0;
  else return T(v);
}

template <typename T>
struct UniformGen {
  double low, high;
  T top;  // the largest T below high (host-computed); replaces values that rounded up to high
  __device__ __forceinline__ T one(double u) const {
    const T v = from_double<T>(__dadd_rn(low, __dmul_rn(high - low, u)));
    return double(load(&v)) >= high && high > low ? top : v;  // keep the interval half-open: [low, high)
  }
  __device__ __forceinline__ void operator()(const uint32_t (&w)[4], T (&v)[kPerCounter<T>]) const {
    if constexpr (std::is_same_v<T, double>) {
      v[0] = one(u53(w[0], w[1]));
      v[1] = one(u53(w[2], w[3]));
    } else {
#pragma unroll
      for (int lane = 0; lane < 4; ++lane) v[lane] = one(double(u24(w[lane])));
    }
  }
};

// Box-Muller: float32 / float16 / bfloat16 pair words (0,1) -> elements 0 (cos) and 1 (sin), words (2,3) -> 2 and 3,
// computed in float; float64 uses all four words for its two elements, in double.
template <typename T>
struct GaussianGen {
  double mean, stddev;
  __device__ __forceinline__ T scale(double z) const { return from_double<T>(__dadd_rn(mean, __dmul_rn(stddev, z))); }
  __device__ __forceinline__ void operator()(const uint32_t (&w)[4], T (&v)[kPerCounter<T>]) const {
    if constexpr (std::is_same_v<T, double>) {
      const double u1 = __dsub_rn(1.0, u53(w[0], w[1])), u2 = u53(w[2], w[3]);  // u1 in (0, 1]
      const double r = sqrt(__dmul_rn(-2.0, log(u1)));
      const double a = __dmul_rn(kTwoPi, u2);
      v[0] = scale(__dmul_rn(r, cos(a)));
      v[1] = scale(__dmul_rn(r, sin(a)));
    } else {
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        const float u1 = __fsub_rn(1.0f, u24(w[2 * pair])), u2 = u24(w[2 * pair + 1]);
        const float r = sqrtf(__fmul_rn(-2.0f, logf(u1)));
        const float a = __fmul_rn(float(kTwoPi), u2);
        v[2 * pair] = scale(double(__fmul_rn(r, cosf(a))));
        v[2 * pair + 1] = scale(double(__fmul_rn(r, sinf(a))));
      }
    }
  }
};

template <typename T>
struct BernoulliGen {
  double p;
  __device__ __forceinline__ void operator()(const uint32_t (&w)[4], T (&v)[kPerCounter<T>]) const {
    if constexpr (std::is_same_v<T, double>) {
      v[0] = u53(w[0], w[1]) < p ? 1.0 : 0.0;
      v[1] = u53(w[2], w[3]) < p ? 1.0 : 0.0;
    } else {
#pragma unroll
      for (int lane = 0; lane < 4; ++lane) v[lane] = from_double<T>(double(u24(w[lane])) < p ? 1.0 : 0.0);
    }
  }
};

// One thread per counter c (grid-stride): elements c * per ... c * per + per - 1 that lie below n.
template <typename T, typename Gen>
__global__ void random_kernel(T* __restrict__ out, int64_t n, uint64_t seed, uint64_t offset, Gen gen) {
  constexpr int per = kPerCounter<T>;
  const int64_t counters = (n + per - 1) / per;
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < counters; c += int64_t(gridDim.x) * blockDim.x) {
    uint32_t w[4];
    philox4x32_words(offset + uint64_t(c), seed, w);
    T v[per];
    gen(w, v);
    const int64_t i0 = c * per;
#pragma unroll
    for (int l = 0; l < per; ++l)
      if (i0 + l < n) out[i0 + l] = v[l];
  }
}

template <typename T, typename Gen>
void launch_random(const Tensor& t, uint64_t seed, uint64_t offset, const Gen& gen, const char* name) {
  const int64_t n = t.numel();
  const int device = t.device().index;
  const Launch l = launch_for((n + kPerCounter<T> - 1) / kPerCounter<T>, device);
  random_kernel<T, Gen><<<l.blocks, l.threads, 0, stream(device)>>>(t.data<T>(), n, seed, offset, gen);
  SL_CUDA_LAUNCHED(name);
}

// ---- uniform's `top`, on the host, by cpu/random.cpp's largest_below: the largest value of the type
// strictly below `high` (low + u (high - low) can round up to high); `low` when the interval is empty.
template <typename F>
F largest_below_float(double high) {
  F v = static_cast<F>(high);
  while (double(v) >= high) v = std::nextafter(v, -std::numeric_limits<F>::infinity());
  return v;
}

template <typename H>  // ::sl::half or ::sl::bfloat16 (sign-magnitude bits)
H largest_below_half(double high) {
  H v(high);
  while (double(float(v)) >= high) {
    if (v.bits == 0x0000u) v.bits = 0x8001u;  // +0 -> the negative subnormal closest to 0
    else if (v.bits & 0x8000u) ++v.bits;      // negative: larger magnitude
    else --v.bits;                            // positive: smaller magnitude
  }
  return v;
}

template <typename T> T uniform_top(double low, double high);
template <> __half uniform_top<__half>(double low, double high) {
  const ::sl::half h = high > low ? largest_below_half<::sl::half>(high) : ::sl::half(low);
  __half_raw raw;
  raw.x = h.bits;
  return __half(raw);
}
template <> __nv_bfloat16 uniform_top<__nv_bfloat16>(double low, double high) {
  const ::sl::bfloat16 h = high > low ? largest_below_half<::sl::bfloat16>(high) : ::sl::bfloat16(low);
  __nv_bfloat16_raw raw;
  raw.x = h.bits;
  return __nv_bfloat16(raw);
}
template <> float uniform_top<float>(double low, double high) {
  return high > low ? largest_below_float<float>(high) : static_cast<float>(low);
}
template <> double uniform_top<double>(double low, double high) {
  return high > low ? largest_below_float<double>(high) : low;
}

}  // namespace

void uniform(const Tensor& t, double low, double high, uint64_t seed, uint64_t offset) {
  if (t.numel() == 0) return;
  DeviceGuard guard(t.device().index);
  SL_CUDA_DISPATCH_FLOAT(t.dtype(), "uniform", [&] {
    launch_random<scalar_t>(t, seed, offset, UniformGen<scalar_t>{low, high, uniform_top<scalar_t>(low, high)},
                            "uniform");
  });
}

void gaussian(const Tensor& t, double mean, double std, uint64_t seed, uint64_t offset) {
  if (t.numel() == 0) return;
  DeviceGuard guard(t.device().index);
  SL_CUDA_DISPATCH_FLOAT(t.dtype(), "gaussian", [&] {
    launch_random<scalar_t>(t, seed, offset, GaussianGen<scalar_t>{mean, std}, "gaussian");
  });
}

void bernoulli(const Tensor& t, double p, uint64_t seed, uint64_t offset) {
  if (t.numel() == 0) return;
  DeviceGuard guard(t.device().index);
  SL_CUDA_DISPATCH_ALL(t.dtype(), "bernoulli", [&] {
    launch_random<scalar_t>(t, seed, offset, BernoulliGen<scalar_t>{p}, "bernoulli");
  });
}

}  // namespace sl::cuda
