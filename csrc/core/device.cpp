#include "core/device.h"

#include <sys/stat.h>

#include <cstdlib>

#include "core/errors.h"
#ifdef SINGA_LITE_WITH_CUDA
#include "cuda/runtime.h"
#endif

namespace sl {

Device::Device(DeviceKind k, int i) : kind(k), index(i) {
  SL_CHECK(i >= 0, ValueError, "Device: index must be >= 0, got ", i);
  if (k == DeviceKind::kCPU) SL_CHECK(i == 0, ValueError, "Device: the CPU device has index 0, got ", i);
}

Device Device::parse(const std::string& s) {
  if (s == "cpu" || s == "cpu:0") return cpu();
  std::string rest;
  if (s.rfind("cuda", 0) == 0) rest = s.substr(4);
  else if (s.rfind("gpu", 0) == 0) rest = s.substr(3);
  else throw ValueError(sl::str("Device: expected 'cpu', 'cuda' or 'cuda:N', got '", s, "'"));
  if (rest.empty()) return cuda(0);
  SL_CHECK(rest[0] == ':' && rest.size() > 1, ValueError, "Device: expected 'cuda:N', got '", s, "'");
  for (size_t i = 1; i < rest.size(); ++i)
    SL_CHECK(rest[i] >= '0' && rest[i] <= '9', ValueError, "Device: expected 'cuda:N', got '", s, "'");
  return cuda(std::stoi(rest.substr(1)));
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

#ifdef SINGA_LITE_WITH_CUDA
std::string cuda_absent_reason() {
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    const std::string visible(v);
    if (visible.empty() || visible.rfind("-1", 0) == 0)
      return str("CUDA_VISIBLE_DEVICES='", visible, "' hides every GPU");
  }
  struct stat st;
  for (const char* path : {"/dev/nvidia0", "/dev/dxg", "/proc/driver/nvidia/gpus"})  // dxg: WSL 2
    if (stat(path, &st) == 0) return "";
  for (int i = 1; i < 64; ++i)  // a container may expose only some GPUs, e.g. /dev/nvidia3
    if (stat(str("/dev/nvidia", i).c_str(), &st) == 0) return "";
  return "no NVIDIA GPU or driver is visible (no /dev/nvidia* device)";
}

bool cuda_compiled() { return true; }
int cuda_device_count() { return cuda::device_count(); }
std::string cuda_unavailable_reason() { return cuda::unavailable_reason(); }
#else
std::string cuda_absent_reason() { return cuda_unavailable_reason(); }  // the build's reason; nothing to initialise

bool cuda_compiled() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_unavailable_reason() {
  return "singa_lite was built without CUDA (the CPU wheel, or a build where nvcc was not found or "
         "SINGA_LITE_CUDA=OFF). Fix: install a CUDA build instead: the wheel singa-lite-cuda13x (CUDA 13 "
         "drivers) or singa-lite-cuda12x (CUDA 12), e.g. pip uninstall singa_lite && pip install "
         "singa-lite-cuda13x; or, from a clone with the CUDA toolkit, SINGA_LITE_CUDA=ON pip install -e "
         "'.[cuda13]' (or '.[cuda12]')";
}
#endif

}  // namespace sl
