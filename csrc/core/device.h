// Device: a small value type (kind + index). Invariant: cpu has index 0; cuda has index >= 0.
#pragma once
#include <string>

namespace sl {

enum class DeviceKind : int { kCPU = 0, kCUDA = 1 };

struct Device {
  DeviceKind kind = DeviceKind::kCPU;
  int index = 0;

  Device() = default;
  Device(DeviceKind k, int i);
  static Device cpu() { return Device(); }
  static Device cuda(int i) { return Device(DeviceKind::kCUDA, i); }
  // Parses "cpu", "cuda", "cuda:N", "gpu:N".
  static Device parse(const std::string& s);

  bool is_cpu() const { return kind == DeviceKind::kCPU; }
  bool is_cuda() const { return kind == DeviceKind::kCUDA; }
  std::string str() const;
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// What the CUDA runtime reports; both are safe to call in a CPU-only build or on a machine without a driver.
// Both initialise CUDA (cudaGetDeviceCount), after which a fork()ed child cannot use the GPU.
bool cuda_compiled();
int cuda_device_count();           // 0 when not compiled, no driver or no GPU
std::string cuda_unavailable_reason();  // "" when at least one GPU is usable

// Why there is certainly no usable GPU, or "" when there may be one, decided WITHOUT initialising CUDA or loading
// the driver: from the build, CUDA_VISIBLE_DEVICES and the driver's device files only. For a parent process that
// decides before forking children that will use the GPU (a process that has initialised CUDA cannot fork children
// that use it: every CUDA call there fails with "initialization error"). Unsure means "": the children then report
// precisely.
std::string cuda_absent_reason();

}  // namespace sl
