// Fill kernel: writes one bit pattern of 1, 2, 4 or 8 bytes n times (the host converts the value).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/runtime.h"

namespace sl::cuda {
namespace {

template <typename U>
__global__ void fill_kernel(U* dst, int64_t n, U value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = value;
}

template <typename U>
void launch(void* dst, int64_t n, uint64_t pattern) {
  const int threads = 256;
  const int64_t wanted = (n + threads - 1) / threads;
  const int blocks = int(wanted < 65535 ? wanted : 65535);  // grid-stride loop covers the rest
  fill_kernel<U><<<blocks, threads>>>(static_cast<U*>(dst), n, static_cast<U>(pattern));
}

}  // namespace

void fill_pattern(void* dst, int64_t n, int itemsize, uint64_t pattern, int device) {
  if (n == 0) return;
  switch (itemsize) {
    case 1: return launch<uint8_t>(dst, n, pattern);
    case 2: return launch<uint16_t>(dst, n, pattern);
    case 4: return launch<uint32_t>(dst, n, pattern);
    default: return launch<uint64_t>(dst, n, pattern);
  }
}

}  // namespace sl::cuda
