// Deferred index checks: the per-device fault record and mapped flag, and their report (index_faults.h).
#include "cuda/index_faults.h"

#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "core/errors.h"
#include "cuda/check.h"
#include "cuda/context.h"

namespace sl::cuda {
namespace {

constexpr IndexFault kClear{0ull, LLONG_MAX, LLONG_MIN, 0, 0};

struct Faults {
  std::mutex mutex;
  IndexFault* record = nullptr;  // device memory
  int* flag = nullptr;           // mapped pinned host memory (host address; the device's one is below)
  int* flag_on_device = nullptr;
  bool unavailable = false;      // the mapped flag could not be had: the host checks instead
};

Faults& faults_of(int device) {
  static std::mutex mutex;
  static auto* all = new std::vector<std::unique_ptr<Faults>>();  // never destroyed: kernels may run during exit
  std::lock_guard<std::mutex> lock(mutex);
  if (int(all->size()) <= device) all->resize(size_t(device) + 1);
  auto& f = (*all)[size_t(device)];
  if (!f) f = std::make_unique<Faults>();
  return *f;
}

std::atomic<bool>& enabled() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("SINGA_LITE_SYNC_INDEX_CHECKS");
    return !(v && v[0] == '1');
  }()};
  return on;
}

std::atomic<unsigned long long> next_launch{1};

// With f.mutex held. False when pinned mapped memory is refused: the front-ends then check on the host.
bool ensure(Faults& f, int device) {
  if (f.record) return true;
  if (f.unavailable) return false;
  DeviceGuard guard(device);
  void* host = nullptr;
  if (cudaHostAlloc(&host, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();
    f.unavailable = true;
    return false;
  }
  void* on_device = nullptr;
  void* record = nullptr;
  cudaError_t err = cudaHostGetDevicePointer(&on_device, host, 0);
  if (err == cudaSuccess) err = cudaMalloc(&record, sizeof(IndexFault));
  if (err == cudaSuccess)
    err = cudaMemcpy(record, &kClear, sizeof(IndexFault), cudaMemcpyHostToDevice);  // before any kernel uses it
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (record) cudaFree(record);
    cudaFreeHost(host);
    f.unavailable = true;
    return false;
  }
  *static_cast<volatile int*>(host) = 0;
  f.flag = static_cast<int*>(host);
  f.flag_on_device = static_cast<int*>(on_device);
  f.record = static_cast<IndexFault*>(record);
  return true;
}

const char* op_name(int op) {
  switch (op) {
    case kOneHot: return "one_hot";
    case kTake: return "take";
    case kIndexAdd: return "index_add";
  }
  return "an index op";
}

}  // namespace

void set_deferred_index_checks(bool on) { enabled().store(on); }
bool deferred_index_checks_enabled() { return enabled().load(); }

namespace {

bool available(int device) {
  Faults& f = faults_of(device);
  std::lock_guard<std::mutex> lock(f.mutex);
  return ensure(f, device);
}

}  // namespace

bool defers_index_checks(int device) { return enabled().load(std::memory_order_relaxed) && available(device); }

IndexFaultSlot index_fault_slot(int device, IndexOp op, int64_t bound) {
  IndexFaultSlot s{nullptr, nullptr, 0ull, (long long)bound, int(op)};
  // Whenever the record exists, not only while deferral is on: a front-end that saw the switch on just before
  // another thread turned it off has skipped its host check, and its kernel must still report.
  if (!available(device)) return s;
  Faults& f = faults_of(device);
  s.record = f.record;  // set once, never changed
  s.host_flag = f.flag_on_device;
  s.launch = next_launch.fetch_add(1, std::memory_order_relaxed);
  return s;
}

void raise_index_faults(int device) {
  Faults& f = faults_of(device);
  IndexFault got{};
  {
    std::lock_guard<std::mutex> lock(f.mutex);
    if (!f.flag || *static_cast<volatile int*>(f.flag) == 0) return;
    // Cleared first: a fault recorded from here on either lands in the record read below or sets it again.
    *static_cast<volatile int*>(f.flag) = 0;
    DeviceGuard guard(device);
    // On the compute stream, the kernels' own: ordered after every launch that may write the record (another
    // thread may have queued more since the wait), and the clearing before every later one. Tiny copies.
    cudaStream_t st = stream(device);
    SL_CUDA_CHECK(cudaMemcpyAsync(&got, f.record, sizeof(got), cudaMemcpyDeviceToHost, st));
    SL_CUDA_CHECK(cudaMemcpyAsync(f.record, &kClear, sizeof(kClear), cudaMemcpyHostToDevice, st));
    SL_CUDA_CHECK(cudaStreamSynchronize(st));
  }
  if (got.launch == 0ull) return;
  throw IndexError(str(op_name(got.op), ": indices must lie in [0, ", got.bound, "), got out-of-range values in [",
                       got.lo, ", ", got.hi, "] on cuda:", device, ". The GPU checked them and this is the next time "
                       "the host waited for it, so the call that passed them came before the line that raised; its "
                       "out-of-range entries were skipped (nothing was read or written through them). To raise at "
                       "the call itself, set SINGA_LITE_SYNC_INDEX_CHECKS=1 (each check then waits for the GPU)"));
}

}  // namespace sl::cuda
