// float32 Bernoulli draws with Philox computed for 16 counters at once (cpu/bernoulli_fast.cpp): the same values
// as cpu/random.cpp's element-by-element loop, several times faster (dropout masks).
#pragma once
#include <cstdint>

namespace sl::cpu {

// o[i] = 1 if u24(word i % 4 of philox(offset + i / 4, seed)) < p else 0, for i in [0, n); contiguous o.
void bernoulli_float32(float* o, int64_t n, double p, uint64_t seed, uint64_t offset);

}  // namespace sl::cpu
