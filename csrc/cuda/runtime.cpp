#include "cuda/runtime.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "core/errors.h"
#include "cpu/loop.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/index_faults.h"

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
  // Errors cannot be reported from a deleter; clearing them keeps them from being blamed on the next launch.
  try {
    DeviceGuard guard(device);
    if (cudaFree(p) != cudaSuccess) cudaGetLastError();
  } catch (...) {
  }
}

namespace {

// ----- pinned staging of large host<->device copies
// Host tensors live in pageable memory. A pageable cudaMemcpy is staged by the driver through its own small pinned
// buffers, one piece after the other. For copies of at least kStageMin bytes we stage ourselves instead, through a
// per-device pinned buffer of two kStageChunk halves, double-buffered: while the DMA engine moves one half, the
// CPU threads (OpenMP) fill or drain the other, so the host memcpy and the PCIe / NVLink transfer overlap.
// Why not cudaHostRegister on the caller's memory: pinning pages costs about as much as copying them, so a one-off
// copy gains nothing; numpy may free or reuse the buffer right after we return, so it would have to be unregistered
// every time; and two arrays sharing a page cannot both be registered. The staging buffer is pinned once and reused.
// Small copies keep the plain path (one cudaMemcpyAsync + synchronise), where our pipeline would only add latency.
// Results are byte-for-byte those of the plain path; set_copy_staging(false) switches it off (benchmarks).
constexpr size_t kStageMin = size_t(1) << 20;    // 1 MiB
constexpr size_t kStageChunk = size_t(8) << 20;  // 8 MiB halves: 16 MiB pinned per device that copies this much

std::atomic<bool> g_staging{true};
std::atomic<uint64_t> g_staged_copies{0};  // copies that took the staged path (tests check the path is taken)

struct Stage {
  std::mutex mutex;             // one staged copy per device at a time
  char* buffer = nullptr;       // 2 * kStageChunk pinned bytes (cudaHostAlloc), kept for the process
  bool unavailable = false;     // pinning failed once (e.g. a locked-memory limit): plain copies from then on
  cudaEvent_t done[2] = {};     // the transfer into / out of each half has finished
};

Stage& stage_of(int device) {
  static std::mutex mutex;
  static auto* stages = new std::vector<std::unique_ptr<Stage>>();  // never destroyed, like the streams
  std::lock_guard<std::mutex> lock(mutex);
  if (int(stages->size()) <= device) stages->resize(size_t(device) + 1);
  auto& s = (*stages)[size_t(device)];
  if (!s) s = std::make_unique<Stage>();
  return *s;
}

// Called with s.mutex held and the device current. Pinned memory and events are created on first use.
// False when pinned memory cannot be had: staging is an optimisation, so the copy then takes the plain path.
bool ensure_stage(Stage& s) {
  if (s.buffer) return true;
  if (s.unavailable) return false;
  void* p = nullptr;
  if (cudaHostAlloc(&p, 2 * kStageChunk, cudaHostAllocDefault) != cudaSuccess) {
    cudaGetLastError();
    s.unavailable = true;
    return false;
  }
  cudaEvent_t e[2] = {};
  for (int i = 0; i < 2; ++i) {
    cudaError_t err = cudaEventCreateWithFlags(&e[i], cudaEventDisableTiming);
    if (err != cudaSuccess) {
      if (i == 1) cudaEventDestroy(e[0]);
      cudaFreeHost(p);
      SL_CUDA_CHECK(err);
    }
  }
  s.buffer = static_cast<char*>(p);
  s.done[0] = e[0];
  s.done[1] = e[1];
  return true;
}

// memcpy on the CPU threads: one thread cannot fill a PCIe 5 / NVLink-C2C link.
void host_copy(char* dst, const char* src, size_t n) {
  constexpr int64_t kPiece = 256 << 10;
  const int64_t pieces = int64_t((n + kPiece - 1) / kPiece);
  cpu::parallel_range(pieces, [&](int64_t b, int64_t e) {
    const size_t lo = size_t(b * kPiece), hi = std::min(n, size_t(e * kPiece));
    std::memcpy(dst + lo, src + lo, hi - lo);
  }, kPiece / 8);
}

// False (nothing done) when no pinned buffer could be had.
bool staged_copy(void* dst, const void* src, size_t nbytes, bool to_device, int device, cudaStream_t st) {
  Stage& s = stage_of(device);
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!ensure_stage(s)) return false;
  g_staged_copies.fetch_add(1, std::memory_order_relaxed);
  // A previous staged copy that failed half-way may have left a transfer in flight: let it end first.
  SL_CUDA_CHECK(cudaEventSynchronize(s.done[0]));
  SL_CUDA_CHECK(cudaEventSynchronize(s.done[1]));
  auto* to = static_cast<char*>(dst);
  const auto* from = static_cast<const char*>(src);
  const size_t chunks = (nbytes + kStageChunk - 1) / kStageChunk;
  auto len_of = [&](size_t i) { return std::min(kStageChunk, nbytes - i * kStageChunk); };
  auto half = [&](size_t i) { return s.buffer + (i % 2) * kStageChunk; };
  if (to_device) {
    for (size_t i = 0; i < chunks; ++i) {
      if (i >= 2) SL_CUDA_CHECK(cudaEventSynchronize(s.done[i % 2]));  // the half's previous transfer is done
      host_copy(half(i), from + i * kStageChunk, len_of(i));
      SL_CUDA_CHECK(cudaMemcpyAsync(to + i * kStageChunk, half(i), len_of(i), cudaMemcpyHostToDevice, st));
      SL_CUDA_CHECK(cudaEventRecord(s.done[i % 2], st));
    }
  } else {
    auto issue = [&](size_t i) {
      SL_CUDA_CHECK(cudaMemcpyAsync(half(i), from + i * kStageChunk, len_of(i), cudaMemcpyDeviceToHost, st));
      SL_CUDA_CHECK(cudaEventRecord(s.done[i % 2], st));
    };
    issue(0);
    if (chunks > 1) issue(1);
    for (size_t i = 0; i < chunks; ++i) {
      SL_CUDA_CHECK(cudaEventSynchronize(s.done[i % 2]));
      host_copy(to + i * kStageChunk, half(i), len_of(i));
      if (i + 2 < chunks) issue(i + 2);  // the half just drained takes the chunk after next
    }
  }
  SL_CUDA_CHECK(cudaStreamSynchronize(st));  // as the plain path: the host side is done when we return
  return true;
}

}  // namespace

void set_copy_staging(bool enabled) { g_staging.store(enabled); }
bool copy_staging() { return g_staging.load(); }
uint64_t staged_copy_count() { return g_staged_copies.load(); }

void copy_bytes(void* dst, const void* src, size_t nbytes, CopyKind kind, int device) {
  if (nbytes == 0) return;
  DeviceGuard guard(device);
  cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                     : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                       : cudaMemcpyDeviceToDevice;
  cudaStream_t st = stream(device);
  if (kind != CopyKind::kDeviceToDevice && nbytes >= kStageMin && g_staging.load(std::memory_order_relaxed) &&
      staged_copy(dst, src, nbytes, kind == CopyKind::kHostToDevice, device, st)) {
    raise_index_faults(device);
    return;
  }
  SL_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, k, st));
  // Host memory is pageable and may be freed or read as soon as we return: wait for copies that touch it.
  // Device-to-device copies stay queued on the stream.
  if (kind != CopyKind::kDeviceToDevice) {
    SL_CUDA_CHECK(cudaStreamSynchronize(st));
    // The host has waited for the device: what the kernels found wrong with indices is reported now
    // (index_faults.h). A value read back (item(), to_numpy, the loss) is the usual place.
    raise_index_faults(device);
  }
}

void fill(const Tensor& t, double value) {
  uint64_t pattern = 0;
  SL_DISPATCH_ALL(t.dtype(), "fill", [&] {
    scalar_t v = cpu::convert<scalar_t>(value);
    std::memcpy(&pattern, &v, sizeof(v));
  });
  if (!t.is_contiguous()) return fill_strided(t, pattern);  // t[:, 0] = 1.0 and other views
  DeviceGuard guard(t.device().index);
  fill_pattern(t.data_ptr(), t.numel(), int(t.itemsize()), pattern, t.device().index);
}

}  // namespace sl::cuda
