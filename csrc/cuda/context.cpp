#include "cuda/context.h"

#include <mutex>
#include <vector>

#include "core/errors.h"
#include "cuda/check.h"
#include "cuda/runtime.h"

namespace sl::cuda {

namespace {

// The driver functions DeviceGuard switches contexts with, reached through the runtime's entry-point query so
// that libcuda is not linked (a CUDA build must import on machines without a driver).
//
// Why the driver's current context and not cudaSetDevice: a thread that never chose a device has no context, and
// the runtime treats it as being on device 0. Restoring that with cudaSetDevice(0) creates a context on GPU 0
// (about 0.5 GiB; since CUDA 12 cudaSetDevice initialises the primary context), which made every process working on
// cuda:k hold one on GPU 0 too; not restoring it left the thread on cuda:k, so that other code in the thread (a
// PyTorch or CuPy call meaning "the current GPU") landed on cuda:k. Setting the device's primary context current
// with cuCtxSetCurrent, and the caller's context (null included) back afterwards, restores exactly what the caller
// had and creates nothing: the runtime uses whatever context the driver has current, and keeps its own per-thread
// device record, untouched here, for when there is none. Libraries with their own copy of the runtime (NCCL,
// cuBLAS) also read the driver's current context, so they see the same device.
struct Driver {
  using CtxGet = int (*)(void**);                      // cuCtxGetCurrent(CUcontext*)
  using CtxSet = int (*)(void*);                       // cuCtxSetCurrent(CUcontext)
  using DeviceGet = int (*)(int*, int);                // cuDeviceGet(CUdevice*, int ordinal)
  using PrimaryRetain = int (*)(void**, int);          // cuDevicePrimaryCtxRetain(CUcontext*, CUdevice)
  CtxGet get = nullptr;
  CtxSet set = nullptr;
  DeviceGet device = nullptr;
  PrimaryRetain retain = nullptr;
  bool ok() const { return get && set && device && retain; }
};

template <typename F>
void entry_point(const char* name, F& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
  const cudaError_t err = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q);
#else
  const cudaError_t err = cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &q);
#endif
  if (err != cudaSuccess) cudaGetLastError();
  fn = err == cudaSuccess && q == cudaDriverEntryPointSuccess ? reinterpret_cast<F>(p) : nullptr;
}

// The table, resolved once; throws CudaError when the driver lacks an entry (a driver older than CUDA 12 cannot
// run this build's runtime anyway, so this names the real problem early).
const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    entry_point("cuCtxGetCurrent", r.get);
    entry_point("cuCtxSetCurrent", r.set);
    entry_point("cuDeviceGet", r.device);
    entry_point("cuDevicePrimaryCtxRetain", r.retain);
    return r;
  }();
  if (!d.ok())
    throw CudaError("the CUDA driver does not provide cuCtxGetCurrent / cuCtxSetCurrent / cuDeviceGet / "
                    "cuDevicePrimaryCtxRetain; install an NVIDIA driver for CUDA 12 or newer");
  return d;
}

void check_driver(int result, const char* call, int device) {
  if (result != 0)
    throw CudaError(str(call, " failed for cuda:", device, ": CUDA driver error ", result,
                        " (a broken driver or GPU; nvidia-smi says more)"));
}

// Each device's primary context, retained once (the runtime shares it) and kept for the process.
void* primary_context(int device) {
  static std::mutex mutex;
  static auto* contexts = new std::vector<void*>();  // never destroyed: guards run during interpreter exit
  std::lock_guard<std::mutex> lock(mutex);
  if (int(contexts->size()) <= device) contexts->resize(size_t(device) + 1, nullptr);
  void*& ctx = (*contexts)[size_t(device)];
  if (ctx == nullptr) {
    const Driver& d = driver();
    int dev = 0;
    check_driver(d.device(&dev, device), "cuDeviceGet", device);
    check_driver(d.retain(&ctx, dev), "cuDevicePrimaryCtxRetain", device);
  }
  return ctx;
}

}  // namespace

DeviceGuard::DeviceGuard(int device) {
  const Driver& d = driver();
  void* target = primary_context(device);
  check_driver(d.get(&previous_context_), "cuCtxGetCurrent", device);
  if (previous_context_ != target) check_driver(d.set(target), "cuCtxSetCurrent", device);
}

DeviceGuard::~DeviceGuard() {
  // Also when code inside the scope switched again (make_current): the caller's context, null included. The
  // constructor succeeded, so driver() does not throw here.
  const Driver& d = driver();
  void* now = nullptr;
  if (d.get(&now) != 0 || now != previous_context_) d.set(previous_context_);
}

std::string make_current(int device) noexcept {
  try {
    check_driver(driver().set(primary_context(device)), "cuCtxSetCurrent", device);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
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
