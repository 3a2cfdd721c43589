// Per-device CUDA state: the current-device guard, one compute stream per device (every kernel, copy and
// cuBLAS call of singa_lite is ordered on it, so freed memory can be reused at once by later work on the
// stream), created lazily on first use; Sync waits for it.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace sl::cuda {

// Makes `device` current for a scope and restores the caller's device after it, unless that device has no
// CUDA context yet (restoring would create one there; context.cpp says why). Never throws from its end.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  // the caller's device
};

cudaStream_t stream(int device);  // the device's compute stream (non-blocking w.r.t. the legacy stream)
void sync(int device);            // waits for everything queued on the compute stream

// Launch geometry for grid-stride loops over n items: 256 threads, enough blocks to fill the GPU.
struct Launch {
  unsigned blocks, threads;
};
Launch launch_for(int64_t n, int device);

}  // namespace sl::cuda
