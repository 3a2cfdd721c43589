// What the two NCCL front ends share: the communicator of one process and GPU (nccl.cpp, Comm) and the clique
// of one process and several GPUs (nccl_clique.cpp, Clique). Polling pace, deadlines, the CUDA event holder,
// the mapping of dtypes and ops to NCCL's, the non-blocking config and the wording of NCCL failures live here
// once, so that both report alike and neither drifts. Internal like nccl_api.h: only csrc/comm/nccl*.cpp
// include it.
#pragma once
#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <thread>

#include "comm/nccl_api.h"
#include "core/errors.h"
#include "core/tensor.h"
#include "cuda/check.h"
#include "cuda/context.h"

namespace sl::cuda::nccl {

// A cudaEvent_t owned by whoever still needs it (declared in nccl.h, where Work holds one).
struct Event {
  cudaEvent_t e = nullptr;
  explicit Event(int device) {
    DeviceGuard guard(device);
    // No timing: recording and waiting are cheaper, and only ordering is needed.
    SL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  ~Event() {
    if (e != nullptr) cudaEventDestroy(e);  // nothing to report from a destructor
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

namespace detail {

using Clock = std::chrono::steady_clock;

// Polling back-off: spin (yielding) for a short while, then sleep, growing to 1 ms between polls. Keeps
// latency low for the common quick case without burning a core on a long wait.
class Backoff {
 public:
  void pause() {
    if (Clock::now() - start_ < std::chrono::microseconds(50)) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(nap_us_));
    nap_us_ = nap_us_ * 2 > 1000 ? 1000 : nap_us_ * 2;
  }

 private:
  Clock::time_point start_ = Clock::now();
  int nap_us_ = 20;
};

constexpr auto kInterruptEvery = std::chrono::milliseconds(40);  // how often a long poll looks at Ctrl-C

inline Clock::time_point deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// true once everything recorded before the event has run; false while it has not. Other results throw.
inline bool event_done(cudaEvent_t e) {
  cudaError_t err = cudaEventQuery(e);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    cudaGetLastError();  // "not ready" is an answer, not an error: keep it out of later checks
    return false;
  }
  SL_CUDA_CHECK(err);
  return false;
}

inline ncclDataType_t nccl_type(DType t, const char* op) {
  switch (t) {
    case DType::kFloat16: return ncclFloat16;
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kBFloat16: return ncclBfloat16;
    default: break;
  }
  throw TypeError(str(op, ": the nccl backend moves float16, bfloat16, float32, float64, int32 and int64 ",
                      "tensors, got ", dtype_name(t), "; cast with as_type()"));
}

inline ncclRedOp_t nccl_op(const std::string& op, DType t, const char* what) {
  ncclRedOp_t r;
  if (op == "sum") r = ncclSum;
  else if (op == "prod") r = ncclProd;
  else if (op == "max") r = ncclMax;
  else if (op == "min") r = ncclMin;
  else if (op == "avg") r = ncclAvg;
  else throw ValueError(str(what, ": op must be one of 'sum', 'avg', 'max', 'min', 'prod', got '", op, "'"));
  SL_CHECK(r != ncclAvg || is_floating(t), TypeError, what, ": op='avg' needs a floating dtype, got ",
           dtype_name(t), "; use op='sum' and divide, or cast to float32");
  return r;
}

// The config of every communicator we create: non-blocking, so that every NCCL call returns at once and is
// completed by polling ncclCommGetAsyncError with a deadline, instead of blocking forever.
inline ncclConfig_v21400 nonblocking_config() {
  ncclConfig_v21400 config{};
  config.size = offsetof(ncclConfig_v21400, blocking) + sizeof(int);  // the fields we set, no padding
  config.magic = kConfigMagic;
  config.version = kConfigVersion;
  config.blocking = 0;
  return config;
}

// " (NCCL's last error text)" when NCCL has one for `comm`, else "".
inline std::string last_error_detail(ncclComm_t comm) {
  const Api& a = api();
  if (a.GetLastError == nullptr || comm == nullptr) return "";
  const char* last = a.GetLastError(comm);
  return last != nullptr && *last != '\0' ? str(" (", last, ")") : std::string();
}

// What to look at when a call failed with `r`, for the end of the message.
inline const char* failure_hint(ncclResult_t r) {
  switch (r) {
    case ncclRemoteError:
    case ncclSystemError:
      return " Another rank failed or a connection broke: look at the other ranks' output (NCCL_DEBUG=WARN "
             "makes NCCL report the cause).";
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return " Every rank must call the same collectives in the same order with the same sizes and dtypes "
             "(NCCL_DEBUG=WARN makes NCCL say which argument).";
    case ncclUnhandledCudaError:
      return " A CUDA call inside NCCL failed (out of GPU memory, or an earlier kernel failed). singa_lite empties "
             "its cache of free blocks before creating a communicator; NCCL allocates more at its first collectives, "
             "so on a full GPU cap that cache (SINGA_LITE_CUDA_CACHE_LIMIT, e.g. 2G) or free tensors first.";
    default:
      return " NCCL_DEBUG=WARN makes NCCL report the cause.";
  }
}

}  // namespace detail
}  // namespace sl::cuda::nccl
