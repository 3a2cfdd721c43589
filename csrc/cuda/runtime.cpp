#include "cuda/runtime.h"

#include <cuda_runtime.h>

#include <cstring>

#include "core/errors.h"
#include "cpu/loop.h"
#include "cuda/check.h"
#include "cuda/context.h"

namespace sl::cuda {
namespace {

void check_index(int device) {
  int n = device_count();
  SL_CHECK(device >= 0 && device < n, ValueError, "cuda:", device, " does not exist: ",
           n == 0 ? unavailable_reason() : str("this machine has ", n, " GPU(s), cuda:0 to cuda:", n - 1));
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error so later calls are not poisoned
    return 0;
  }
  return n;
}

std::string unavailable_reason() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaSuccess && n > 0) return "";
  cudaGetLastError();
  if (err == cudaErrorInsufficientDriver)
    return "no NVIDIA driver (or one older than this CUDA runtime) is installed; install or update the driver";
  if (err == cudaErrorNoDevice || (err == cudaSuccess && n == 0)) return "no CUDA GPU is visible (check CUDA_VISIBLE_DEVICES)";
  return str("the CUDA runtime reports: ", cudaGetErrorString(err));
}

int runtime_version() {
  int v = 0;
  cudaRuntimeGetVersion(&v);
  return v;
}

int driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return v;
}

void* malloc_on(int device, size_t nbytes) {
  check_index(device);
  DeviceGuard guard(device);
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, nbytes == 0 ? 1 : nbytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw OutOfMemory(str("cannot allocate ", nbytes, " bytes on cuda:", device, " (out of GPU memory)"));
  }
  SL_CUDA_CHECK(err);
  return p;
}

void free_on(int device, void* p) noexcept {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return;
  cudaSetDevice(device);
  cudaFree(p);  // errors here cannot be reported from a destructor; the next checked call sees them
  cudaSetDevice(previous);
}

void copy_bytes(void* dst, const void* src, size_t nbytes, CopyKind kind, int device) {
  if (nbytes == 0) return;
  DeviceGuard guard(device);
  cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                     : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                       : cudaMemcpyDeviceToDevice;
  cudaStream_t st = stream(device);
  SL_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, k, st));
  // Host memory is pageable and may be freed or read as soon as we return: wait for copies that touch it.
  // Device-to-device copies stay queued on the stream.
  if (kind != CopyKind::kDeviceToDevice) SL_CUDA_CHECK(cudaStreamSynchronize(st));
}

void fill(const Tensor& t, double value) {
  uint64_t pattern = 0;
  SL_DISPATCH_ALL(t.dtype(), "fill", [&] {
    scalar_t v = cpu::convert<scalar_t>(value);
    std::memcpy(&pattern, &v, sizeof(v));
  });
  DeviceGuard guard(t.device().index);
  fill_pattern(t.data_ptr(), t.numel(), int(t.itemsize()), pattern, t.device().index);
}

}  // namespace sl::cuda
