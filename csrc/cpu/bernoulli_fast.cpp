// float32 Bernoulli draws, the dropout masks' random numbers. cpu/random.cpp's loop computes Philox4x32-10 one
// counter at a time through a per-element callback (about 4-5 ns per element on one thread here); this one runs
// the rounds on kCounters counters side by side in plain arrays, which the per-level copies (cpu/isa.h) turn into
// 32 x 32 -> 64-bit vector multiplies. Same stream, same values: element i takes word i % 4 of counter
// offset + i / 4, and u24(w) < p is tested as the integer comparison (w >> 8) < ceil(p * 2^24), exact because
// u24(w) = (w >> 8) / 2^24 exactly. tests/unit/test_transformer_layers.py compares it with the float16 path
// (the same u24 lanes through the element loop).
#include "cpu/bernoulli_fast.h"

#include <cmath>

#include "core/generator.h"
#include "cpu/isa.h"
#include "cpu/loop.h"

namespace sl::cpu {
namespace {

constexpr int kCounters = 16;
constexpr int64_t kBlock = 4 * kCounters;  // elements per block of counters

struct BernoulliBlocks {
  // Blocks [b0, b1) of kBlock elements (all whole), element 0 of block b being element b * kBlock.
  template <Isa Level>
  static SL_ISA_INLINE void run(float* o, uint32_t threshold, uint64_t seed, uint64_t offset, int64_t b0,
                                int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      uint32_t c0[kCounters], c1[kCounters], c2[kCounters], c3[kCounters];
      const uint64_t first = offset + uint64_t(b) * kCounters;
      for (int j = 0; j < kCounters; ++j) {
        const uint64_t counter = first + uint64_t(j);
        c0[j] = uint32_t(counter), c1[j] = uint32_t(counter >> 32), c2[j] = 0, c3[j] = 0;
      }
      uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
      for (int round = 0; round < 10; ++round) {
        for (int j = 0; j < kCounters; ++j) {
          const uint64_t p0 = uint64_t(0xD2511F53u) * c0[j];
          const uint64_t p1 = uint64_t(0xCD9E8D57u) * c2[j];
          const uint32_t n0 = uint32_t(p1 >> 32) ^ c1[j] ^ k0;
          const uint32_t n2 = uint32_t(p0 >> 32) ^ c3[j] ^ k1;
          c1[j] = uint32_t(p1), c3[j] = uint32_t(p0), c0[j] = n0, c2[j] = n2;
        }
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
      }
      float* ob = o + b * kBlock;
      for (int j = 0; j < kCounters; ++j) {
        ob[4 * j + 0] = (c0[j] >> 8) < threshold ? 1.0f : 0.0f;
        ob[4 * j + 1] = (c1[j] >> 8) < threshold ? 1.0f : 0.0f;
        ob[4 * j + 2] = (c2[j] >> 8) < threshold ? 1.0f : 0.0f;
        ob[4 * j + 3] = (c3[j] >> 8) < threshold ? 1.0f : 0.0f;
      }
    }
  }
};

}  // namespace

void bernoulli_float32(float* o, int64_t n, double p, uint64_t seed, uint64_t offset) {
  // u24 < p  <=>  (w >> 8) < ceil(p * 2^24): p * 2^24 is exact in double; p >= 1 keeps every element (2^24 + 1
  // exceeds any w >> 8), p <= 0 none.
  const double scaled = std::ceil(p * 16777216.0);
  const uint32_t threshold = scaled <= 0 ? 0u : scaled > 16777216.0 ? 16777217u : uint32_t(scaled);
  const int64_t blocks = n / kBlock;
  parallel_range(blocks, [&](int64_t b0, int64_t b1) {
    run_isa<BernoulliBlocks>(o, threshold, seed, offset, b0, b1);
  }, 8 * kBlock);
  for (int64_t i = blocks * kBlock; i < n; ++i) {  // the tail, element by element
    const auto w = philox4x32(offset + uint64_t(i / 4), seed);
    o[i] = (w[size_t(i % 4)] >> 8) < threshold ? 1.0f : 0.0f;
  }
}

}  // namespace sl::cpu
