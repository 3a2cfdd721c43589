// SL_KERNEL(device, fn, args...): runs kernel `fn` of the device's kind: cpu::fn(args...) or cuda::fn(args...).
// Both kernel sets share one contract (cpu/kernels.h, cuda/kernels.h); the front-ends call them only
// through this, after their checks (check_kernel_device has rejected devices this build cannot serve).
#pragma once
#include "cpu/kernels.h"
#ifdef SINGA_LITE_WITH_CUDA
#include "cuda/kernels.h"
#define SL_KERNEL(device, fn, ...) \
  ((device).is_cuda() ? ::sl::cuda::fn(__VA_ARGS__) : ::sl::cpu::fn(__VA_ARGS__))
#else
#define SL_KERNEL(device, fn, ...) ::sl::cpu::fn(__VA_ARGS__)
#endif
