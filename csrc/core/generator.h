// Random numbers: one counter-based generator (Philox4x32-10) per device. A draw of n numbers reserves
// a range of counters, so each element's value depends only on (seed, counter): results are the same
// for any thread count, and a GPU kernel can reproduce them exactly.
#pragma once
#include <array>
#include <cstdint>
#include <utility>

#include "core/device.h"

namespace sl {

constexpr uint64_t kDefaultSeed = 0x5EEDu;  // fixed, so an unseeded run is still reproducible

// Reserves `counters` counters on the device's generator; returns (seed, first counter).
std::pair<uint64_t, uint64_t> reserve_counters(Device device, uint64_t counters);
void manual_seed(Device device, uint64_t seed);
uint64_t current_seed(Device device);
// The whole state, (seed, next counter): what a checkpoint saves so that a resumed run draws the same numbers
// as an uninterrupted one. set_generator_state checks that the device exists (a CUDA index on this machine).
std::pair<uint64_t, uint64_t> generator_state(Device device);
void set_generator_state(Device device, uint64_t seed, uint64_t counter);

// SL_HOST_DEVICE: also compiled for the GPU when a .cu file includes this header (cuda/random.cu draws the
// same streams element for element); a plain C++ compiler sees an ordinary inline function.
#ifdef __CUDACC__
#define SL_HOST_DEVICE __host__ __device__
#else
#define SL_HOST_DEVICE
#endif

// Philox4x32-10 of (counter, seed) into four words. Device code calls this form: it touches no std::array
// member (those are host constexpr functions, callable on the GPU only with --expt-relaxed-constexpr).
SL_HOST_DEVICE inline void philox4x32_words(uint64_t counter, uint64_t seed, uint32_t out[4]) {
  uint32_t c0 = uint32_t(counter), c1 = uint32_t(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(0xD2511F53u) * c0;
    uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
    uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(p1);
    c3 = uint32_t(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

inline std::array<uint32_t, 4> philox4x32(uint64_t counter, uint64_t seed) {
  std::array<uint32_t, 4> w;
  philox4x32_words(counter, seed, w.data());
  return w;
}

}  // namespace sl
