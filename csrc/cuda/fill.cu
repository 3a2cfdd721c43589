// Fill kernel: writes one bit pattern of 1, 2, 4 or 8 bytes n times (the host converts the value).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/runtime.h"

namespace sl::cuda {
namespace {

template <typename U>
__global__ void fill_kernel(U* dst, int64_t n, U value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = value;
}

template <typename U>
void launch(void* dst, int64_t n, uint64_t pattern, int device) {
  const Launch l = launch_for(n, device);
  fill_kernel<U><<<l.blocks, l.threads, 0, stream(device)>>>(static_cast<U*>(dst), n, static_cast<U>(pattern));
  SL_CUDA_LAUNCHED("fill");
}

}  // namespace

void fill_pattern(void* dst, int64_t n, int itemsize, uint64_t pattern, int device) {
  if (n == 0) return;
  switch (itemsize) {
    case 1: return launch<uint8_t>(dst, n, pattern, device);
    case 2: return launch<uint16_t>(dst, n, pattern, device);
    case 4: return launch<uint32_t>(dst, n, pattern, device);
    default: return launch<uint64_t>(dst, n, pattern, device);
  }
}

}  // namespace sl::cuda
