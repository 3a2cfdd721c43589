// Per-device CUDA state: the current-device guard, one compute stream per device (every kernel, copy and
// cuBLAS call of singa_lite is ordered on it, so freed memory can be reused at once by later work on the
// stream), created lazily on first use; Sync waits for it.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace sl::cuda {

// Makes `device` current for a scope and, at its end, makes current again exactly what the caller had: its
// context, or no context at all. Switching goes through the driver's current context (the device's primary
// context, the one the runtime uses), not cudaSetDevice: cudaSetDevice would also move the runtime's per-thread
// "current device" and, since CUDA 12, create a context on the caller's device just to restore it (context.cpp
// says why neither is acceptable). Never throws from its end.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  void* previous_context_ = nullptr;  // the caller's CUcontext; nullptr: it had none
};

// Makes `device`'s primary context current on this thread, as DeviceGuard does, without restoring anything:
// for code inside a guard that walks several devices (the NCCL clique, between ncclGroupStart and ncclGroupEnd,
// where nothing may throw). Returns "" or what failed; the next CUDA call on that device reports it too.
std::string make_current(int device) noexcept;

cudaStream_t stream(int device);  // the device's compute stream (non-blocking w.r.t. the legacy stream)
void sync(int device);            // waits for everything queued on the compute stream

// Launch geometry for grid-stride loops over n items: 256 threads, enough blocks to fill the GPU.
struct Launch {
  unsigned blocks, threads;
};
Launch launch_for(int64_t n, int device);

}  // namespace sl::cuda
