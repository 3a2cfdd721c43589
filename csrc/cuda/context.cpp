#include "cuda/context.h"

#include <mutex>
#include <vector>

#include "cuda/check.h"
#include "cuda/runtime.h"

namespace sl::cuda {

DeviceGuard::DeviceGuard(int device) {
  SL_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) SL_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);  // cannot throw from a destructor; the next checked call sees errors
}

namespace {

struct Streams {
  std::mutex mutex;
  std::vector<cudaStream_t> by_device;  // nullptr until first use
  std::vector<int> sm_count;
};

Streams& streams() {
  static Streams* s = new Streams();  // never destroyed: tensors may be freed during interpreter exit
  return *s;
}

void ensure(Streams& s, int device) {
  if (int(s.by_device.size()) <= device) {
    s.by_device.resize(device + 1, nullptr);
    s.sm_count.resize(device + 1, 0);
  }
  if (s.by_device[device] == nullptr) {
    DeviceGuard guard(device);
    cudaStream_t st = nullptr;
    SL_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    int sms = 0;
    SL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    s.by_device[device] = st;
    s.sm_count[device] = sms;
  }
}

}  // namespace

cudaStream_t stream(int device) {
  Streams& s = streams();
  std::lock_guard<std::mutex> lock(s.mutex);
  ensure(s, device);
  return s.by_device[device];
}

void sync(int device) {
  cudaStream_t st = stream(device);
  DeviceGuard guard(device);
  SL_CUDA_CHECK(cudaStreamSynchronize(st));
}

Launch launch_for(int64_t n, int device) {
  int sms = 0;
  {
    Streams& s = streams();
    std::lock_guard<std::mutex> lock(s.mutex);
    ensure(s, device);
    sms = s.sm_count[device];
  }
  const int64_t threads = 256;
  int64_t blocks = (n + threads - 1) / threads;
  const int64_t cap = int64_t(sms > 0 ? sms : 80) * 8;  // a few waves; the grid-stride loop covers the rest
  if (blocks > cap) blocks = cap;
  if (blocks < 1) blocks = 1;
  return {unsigned(blocks), unsigned(threads)};
}

}  // namespace sl::cuda
