// CUDA runtime services: device discovery, memory, copies. Every CUDA call is checked; a failure
// becomes sl::CudaError naming the call, the runtime's message and file:line. Nothing here aborts.
// Safe to call on machines without a driver or GPU: device_count() is then 0 and unavailable_reason() says why.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace sl::cuda {

int device_count();
std::string unavailable_reason();
int runtime_version();  // e.g. 13000
int driver_version();   // 0 without a driver

void* malloc_on(int device, size_t nbytes);
void free_on(int device, void* p) noexcept;

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };
// Queued on the device's compute stream; host<->device copies return when the host side is done. Those of 1 MiB
// or more go through a pinned, double-buffered staging buffer (see runtime.cpp) unless set_copy_staging(false).
void copy_bytes(void* dst, const void* src, size_t nbytes, CopyKind kind, int device);
void set_copy_staging(bool enabled);  // for benchmarks: the plain path for every size
bool copy_staging();
// Copies that went through the staging buffer so far (pinning may fail, e.g. under a locked-memory limit:
// copies then take the plain path, silently, since the result is the same).
uint64_t staged_copy_count();

// Fills a CUDA tensor, contiguous or any strided view, with value (converted on the host to the tensor's dtype).
void fill(const Tensor& t, double value);

// Implemented in fill.cu: writes `n` copies of an itemsize-byte bit pattern.
void fill_pattern(void* dst, int64_t n, int itemsize, uint64_t pattern, int device);
// Implemented in elementwise.cu: the pattern at every element of a strided view (its geometry collapsed as the
// element-wise kernels do).
void fill_strided(const Tensor& t, uint64_t pattern);

}  // namespace sl::cuda
