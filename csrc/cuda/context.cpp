#include "cuda/context.h"

#include <mutex>
#include <utility>
#include <vector>

#include "cuda/check.h"
#include "cuda/runtime.h"

namespace sl::cuda {

namespace {

// Whether `device`'s primary context exists. Since CUDA 12, cudaSetDevice creates it when it does not, and
// a thread that never chose a device reports device 0: restoring "the caller's device" blindly made every
// process that works on cuda:k (k > 0) hold a context, about 0.5 GiB, on GPU 0 too. The driver's
// cuDevicePrimaryCtxGetState answers without creating one; it is reached through the runtime, so that
// libcuda is not linked (a CUDA build must import on machines without a driver).
bool has_primary_context(int device) {
  using DeviceGet = int (*)(int*, int);                        // cuDeviceGet(CUdevice*, int ordinal)
  using CtxState = int (*)(int, unsigned int*, int*);          // cuDevicePrimaryCtxGetState(CUdevice, ...)
  static const auto fns = [] {
    void* get = nullptr;
    void* state = nullptr;
    cudaDriverEntryPointQueryResult q1{}, q2{};
#if CUDART_VERSION >= 12050
    cudaGetDriverEntryPointByVersion("cuDeviceGet", &get, 12000, cudaEnableDefault, &q1);
    cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &state, 12000, cudaEnableDefault, &q2);
#else
    cudaGetDriverEntryPoint("cuDeviceGet", &get, cudaEnableDefault, &q1);
    cudaGetDriverEntryPoint("cuDevicePrimaryCtxGetState", &state, cudaEnableDefault, &q2);
#endif
    cudaGetLastError();
    const bool ok = q1 == cudaDriverEntryPointSuccess && q2 == cudaDriverEntryPointSuccess;
    return std::make_pair(ok ? reinterpret_cast<DeviceGet>(get) : nullptr,
                          ok ? reinterpret_cast<CtxState>(state) : nullptr);
  }();
  if (!fns.first || !fns.second) return true;  // cannot tell: restore, as before
  int dev = 0, active = 0;
  unsigned int flags = 0;
  if (fns.first(&dev, device) != 0 || fns.second(dev, &flags, &active) != 0) return true;
  return active != 0;
}

}  // namespace

DeviceGuard::DeviceGuard(int device) {
  SL_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) SL_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  // Restores the caller's device when the scope left another one current (the guard, or code inside it that
  // walks several devices, as the NCCL clique does), unless the caller's device has no context: restoring
  // would create one. A destructor cannot throw: a failure is cleared, so that it is not reported later as
  // the failure of an unrelated kernel launch (SL_CUDA_LAUNCHED reads the thread's last error).
  int now = -1;
  if (previous_ < 0) return;
  if (cudaGetDevice(&now) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  if (now == previous_ || !has_primary_context(previous_)) return;
  if (cudaSetDevice(previous_) != cudaSuccess) cudaGetLastError();
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
