// Front-ends of the random fills: check, reserve counters on the device's generator, run the kernel.
#include <cmath>

#include "core/generator.h"
#include "ops/dispatch.h"
#include "ops/checks.h"
#include "ops/ops.h"

namespace sl {
namespace {

// Fills t (contiguous, or through a contiguous temporary) with kernel(tmp, seed, offset).
template <typename Kernel>
void random_fill(const char* op, const Tensor& t, Kernel kernel) {
  check_defined(t, op, "tensor");
  check_kernel_device(op, t);
  const uint64_t per_counter = t.dtype() == DType::kFloat64 ? 2 : 4;
  auto [seed, offset] = reserve_counters(t.device(), (uint64_t(t.numel()) + per_counter - 1) / per_counter);
  if (t.is_contiguous()) {
    kernel(t, seed, offset);
    return;
  }
  Tensor tmp = Tensor::empty(t.shape(), t.dtype(), t.device());
  kernel(tmp, seed, offset);
  SL_KERNEL(t.device(), copy, t, tmp);
}

}  // namespace

void uniform_(const Tensor& t, double low, double high) {
  SL_CHECK(std::isfinite(low) && std::isfinite(high) && low <= high, ValueError,
           "uniform: expected finite low <= high, got low=", low, ", high=", high);
  check_floating("uniform", t);
  random_fill("uniform", t, [&](const Tensor& x, uint64_t s, uint64_t o) { SL_KERNEL(x.device(), uniform, x, low, high, s, o); });
}

void gaussian_(const Tensor& t, double mean, double std) {
  SL_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0, ValueError,
           "gaussian: expected finite mean and std >= 0, got mean=", mean, ", std=", std);
  check_floating("gaussian", t);
  random_fill("gaussian", t, [&](const Tensor& x, uint64_t s, uint64_t o) { SL_KERNEL(x.device(), gaussian, x, mean, std, s, o); });
}

void bernoulli_(const Tensor& t, double p) {
  SL_CHECK(p >= 0 && p <= 1, ValueError, "bernoulli: p must lie in [0, 1], got ", p);
  random_fill("bernoulli", t, [&](const Tensor& x, uint64_t s, uint64_t o) { SL_KERNEL(x.device(), bernoulli, x, p, s, o); });
}

}  // namespace sl
