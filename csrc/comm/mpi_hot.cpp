// The mpi backend's hot path: see mpi_hot.h.
#include "comm/mpi_hot.h"

#include <dlfcn.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>

#include "comm/wait.h"  // Clock, cpu_relax
#include "core/errors.h"

namespace sl::comm {

// The MPICH ABI's values of the two pointer constants used here (mpi.h of MPICH: `#define MPI_IN_PLACE (void *)
// -1`, `#define MPI_STATUS_IGNORE (MPI_Status *)1`); handles are ints, passed in by mpi.py from mpi4py.
static void* const kInPlace = reinterpret_cast<void*>(intptr_t(-1));
static void* const kStatusIgnore = reinterpret_cast<void*>(intptr_t(1));
constexpr int kSigWords = 6;  // the signature: kind, dtype code, count, root, op code, call number
constexpr int kPending = -1;  // poll(): not settled yet

struct MpiHotPath::Api {
  void* library = nullptr;
  int (*Test)(int* request, int* flag, void* status) = nullptr;
  int (*Wait)(int* request, void* status) = nullptr;
  int (*Start)(int* request) = nullptr;
  int (*Win_sync)(int win) = nullptr;
  int (*Iallreduce)(const void* send, void* recv, int count, int type, int op, int comm, int* request) = nullptr;
};

template <typename Fn>
static bool resolve(void* library, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(library, name));
  return fn != nullptr;
}

MpiHotPath::MpiHotPath(MpiHotSetup setup, std::function<void()> check_signals)
    : s_(std::move(setup)), check_signals_(std::move(check_signals)), api_(std::make_unique<Api>()),
      pending_(s_.request_null) {
  SL_CHECK(s_.world_size >= 1 && s_.slot_bytes >= kSigWords * 8 && s_.slot != 0 && s_.slots != 0 && s_.entered != 0,
           ValueError, "MpiHotPath: incomplete setup (slots, board or world size missing)");
  // RTLD_NOLOAD: only the library mpi4py already loaded (and initialised) may be used, never a second copy.
  api_->library = dlopen(s_.library.c_str(), RTLD_NOW | RTLD_NOLOAD);
  SL_CHECK(api_->library != nullptr, ValueError, "MpiHotPath: ", s_.library, " is not loaded in this process (",
           dlerror(), ")");
  std::string missing;
  auto need = [&](const char* name, auto& fn) {
    if (!resolve(api_->library, name, fn)) missing += std::string(missing.empty() ? "" : ", ") + name;
  };
  need("MPI_Test", api_->Test);
  need("MPI_Wait", api_->Wait);
  need("MPI_Start", api_->Start);
  need("MPI_Win_sync", api_->Win_sync);
  need("MPI_Iallreduce", api_->Iallreduce);
  if (!missing.empty()) {
    dlclose(api_->library);
    throw ValueError(str("MpiHotPath: ", s_.library, " lacks ", missing));
  }
}

MpiHotPath::~MpiHotPath() {
  if (api_ && api_->library != nullptr) dlclose(api_->library);  // only drops our reference (RTLD_NOLOAD)
}

int MpiHotPath::test(int* request, bool* done) {
  int flag = 0;
  const int rc = api_->Test(request, &flag, kStatusIgnore);
  *done = flag != 0;
  if (rc != 0) last_error_ = rc;
  return rc;
}

void MpiHotPath::enter(int kind, int dtype_code, int64_t count, int root, int op, bool check, const void* payload,
                       size_t payload_bytes) {
  auto* entered = reinterpret_cast<int64_t*>(s_.entered);
  *entered += 1;
  api_->Win_sync(s_.win);  // the store becomes visible to a timed-out rank's Get of the board
  if (s_.progress != 0) *reinterpret_cast<volatile int64_t*>(s_.progress) = *entered;
  if (!check) return;
  int* request = reinterpret_cast<int*>(s_.check_request);
  if (check_active_) {  // the previous call failed between its check and its data (it raised already)
    api_->Wait(request, kStatusIgnore);
    check_active_ = false;
  }
  // Only now may the slot change: the stale check above was still sending it.
  if (payload_bytes > 0) std::memcpy(reinterpret_cast<char*>(s_.slot) + kSigWords * 8, payload, payload_bytes);
  auto* sig = reinterpret_cast<int64_t*>(s_.slot);
  const int64_t words[kSigWords] = {kind, dtype_code, count, root, op, *entered};
  std::memcpy(sig, words, sizeof words);
  const int rc = api_->Start(request);
  if (rc != 0) {
    last_error_ = rc;
    throw CommError(str("mpi: MPI_Start of the call check failed (MPI error ", rc, ")"));
  }
  check_active_ = true;
}

MpiStatus MpiHotPath::settle_check(bool* pending) {
  *pending = false;
  bool done = false;
  if (test(reinterpret_cast<int*>(s_.check_request), &done) != 0) {
    check_active_ = false;
    return MpiStatus::kMpiError;
  }
  if (!done) {
    *pending = true;
    return MpiStatus::kDone;
  }
  check_active_ = false;
  const char* mine = reinterpret_cast<const char*>(s_.slot);
  const char* rows = reinterpret_cast<const char*>(s_.slots);
  for (int r = 0; r < s_.world_size; ++r)
    if (std::memcmp(rows + r * s_.slot_bytes, mine, kSigWords * 8) != 0) return MpiStatus::kMismatch;
  return MpiStatus::kDone;
}

template <typename Settled>
MpiStatus MpiHotPath::poll(Settled&& settled, double timeout) {
  int r = settled();
  if (r != kPending) return MpiStatus(r);
  using std::chrono::nanoseconds;
  const auto start = Clock::now();
  // At most a million seconds: an infinite timeout must not overflow the clock's arithmetic.
  const auto limit = nanoseconds(int64_t(std::min(timeout, 1e6) * 1e9));
  const auto deadline = start + limit;
  const auto spin_end = start + nanoseconds(s_.spin_ns);
  const auto yield_end = start + nanoseconds(s_.yield_ns);
  auto next_signals = start + std::chrono::milliseconds(40);
  int64_t nap_ns = 10'000;
  for (;;) {
    r = settled();
    if (r != kPending) return MpiStatus(r);
    const auto now = Clock::now();
    // Spin first: every rank has a core in the common case and the peers arrive within microseconds; a
    // sched_yield costs a sizeable part of a fused 4 KiB all_reduce (docs/benchmarks/communication.md).
    if (now < spin_end) {
      cpu_relax();
      continue;
    }
    if (now >= deadline) return MpiStatus::kTimeout;  // settled() was pending just above
    if (now >= next_signals) {  // Ctrl-C ends a long wait with KeyboardInterrupt (may throw)
      if (check_signals_) check_signals_();
      next_signals = now + std::chrono::milliseconds(40);
    }
    if (now < yield_end) {
      sched_yield();  // with more ranks than cores, let the rank we wait for run
    } else {          // a rank waiting for a slow peer leaves the CPU to the others
      timespec ts{0, long(nap_ns)};
      nanosleep(&ts, nullptr);
      nap_ns = std::min<int64_t>(nap_ns * 2, 1'000'000);
    }
  }
}

MpiStatus MpiHotPath::wait(intptr_t request, double timeout) {
  int* req = reinterpret_cast<int*>(request);
  return poll([&]() -> int {
    if (check_active_) {  // the check first: a mismatch must not wait for data that may never pair up
      bool pending = false;
      const MpiStatus st = settle_check(&pending);
      if (pending) return kPending;
      if (st != MpiStatus::kDone) return int(st);
    }
    if (req == nullptr || *req == s_.request_null) return int(MpiStatus::kDone);
    bool done = false;
    if (test(req, &done) != 0) return int(MpiStatus::kMpiError);
    return done ? int(MpiStatus::kDone) : kPending;
  }, timeout);
}

bool MpiHotPath::drain(double seconds) {
  const auto end = Clock::now() + std::chrono::nanoseconds(int64_t(std::min(seconds, 1e6) * 1e9));
  while (pending_ != s_.request_null) {
    bool done = false;
    if (test(&pending_, &done) != 0) {  // MPI's own error (a truncated message): the collective is over
      pending_ = s_.request_null;
      return true;
    }
    if (done) return true;
    if (Clock::now() >= end) return false;
    timespec ts{0, 100'000};
    nanosleep(&ts, nullptr);
  }
  return true;
}

bool MpiHotPath::reduces_here(DType dtype, int op) const {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kFloat64:  // numpy's max / min pick among NaNs and signed zeros its own way: left to it
      return op != s_.max_op && op != s_.min_op;
    case DType::kInt32:
    case DType::kInt64:
      return true;
    default:
      return false;
  }
}

namespace {

// out[i] = op over rows r = 0, 1, ... of row_r[i], applied left to right in rank order, as numpy's reduce
// along axis 0 does (the same bits as the Python path). A: the arithmetic type; unsigned for integers, whose
// sums and products wrap like numpy's.
template <typename T, typename A>
void reduce_rows_as(T* out, const char* rows, int64_t stride, int P, int64_t n, int op, const MpiHotSetup& s) {
  auto row = [&](int r) { return reinterpret_cast<const T*>(rows + r * stride); };
  const T* first = row(0);
  if (op == s.max_op || op == s.min_op) {
    const bool is_max = op == s.max_op;
    for (int64_t i = 0; i < n; ++i) {
      T acc = first[i];
      for (int r = 1; r < P; ++r) {
        const T v = row(r)[i];
        acc = is_max ? (v > acc ? v : acc) : (v < acc ? v : acc);  // integers only (reduces_here)
      }
      out[i] = acc;
    }
    return;
  }
  const bool is_prod = op != 0 && op != s.avg_op;  // REDUCE_OPS: sum 0, avg, max, min, prod
  for (int64_t i = 0; i < n; ++i) {
    A acc = A(first[i]);
    for (int r = 1; r < P; ++r) acc = is_prod ? A(acc * A(row(r)[i])) : A(acc + A(row(r)[i]));
    out[i] = T(acc);
  }
  if (op == s.avg_op)
    for (int64_t i = 0; i < n; ++i) out[i] = T(out[i] / T(P));
}

}  // namespace

void MpiHotPath::reduce_rows(const Tensor& t, int op) const {
  const char* rows = reinterpret_cast<const char*>(s_.slots) + kSigWords * 8;
  const int P = s_.world_size;
  const int64_t n = t.numel(), stride = s_.slot_bytes;
  void* out = t.data_ptr();
  switch (t.dtype()) {
    case DType::kFloat32: reduce_rows_as<float, float>(static_cast<float*>(out), rows, stride, P, n, op, s_); break;
    case DType::kFloat64:
      reduce_rows_as<double, double>(static_cast<double*>(out), rows, stride, P, n, op, s_);
      break;
    case DType::kInt32:
      reduce_rows_as<int32_t, uint32_t>(static_cast<int32_t*>(out), rows, stride, P, n, op, s_);
      break;
    case DType::kInt64:
      reduce_rows_as<int64_t, uint64_t>(static_cast<int64_t*>(out), rows, stride, P, n, op, s_);
      break;
    default: SL_ASSERT(false);
  }
}

MpiStatus MpiHotPath::all_reduce(const Tensor& t, int op, bool check, double timeout) {
  const size_t d = size_t(t.dtype());
  if (!t.is_contiguous() || !t.device().is_cpu() || d >= s_.dtype_codes.size() || s_.dtype_codes[d] < 0 || op < 0 ||
      size_t(op) >= s_.mpi_ops.size())
    return MpiStatus::kNotHandled;
  const bool floating = t.dtype() != DType::kInt32 && t.dtype() != DType::kInt64;
  if (op == s_.avg_op && !floating) return MpiStatus::kNotHandled;  // mpi.py's check raises TypeError
  // The same rule as mpi.py's _fusable / _fused_signature: every rank must decide alike.
  if (check && s_.world_size > 1 && int64_t(t.nbytes()) <= s_.slot_bytes - kSigWords * 8)
    return fused_all_reduce(t, op, timeout);
  if (s_.mpi_types[d] == 0 || t.numel() > INT_MAX) return MpiStatus::kNotHandled;
  return mpi_all_reduce(t, op, check && s_.world_size > 1, timeout);
}

MpiStatus MpiHotPath::fused_all_reduce(const Tensor& t, int op, double timeout) {
  enter(s_.all_reduce_kind, s_.dtype_codes[size_t(t.dtype())], t.numel(), -1, op, true, t.data_ptr(), t.nbytes());
  const MpiStatus st = wait(0, timeout);
  if (st != MpiStatus::kDone) return st;
  if (!reduces_here(t.dtype(), op)) return MpiStatus::kReduceInPython;
  reduce_rows(t, op);
  return MpiStatus::kDone;
}

MpiStatus MpiHotPath::mpi_all_reduce(const Tensor& t, int op, bool check, double timeout) {
  const size_t d = size_t(t.dtype());
  SL_CHECK(pending_ == s_.request_null, CommError,
           "mpi all_reduce: the previous mismatched call's data collective never ended");
  enter(s_.all_reduce_kind, s_.dtype_codes[d], t.numel(), -1, op, check);
  const int rc = api_->Iallreduce(kInPlace, t.data_ptr(), int(t.numel()), s_.mpi_types[d], s_.mpi_ops[size_t(op)],
                                  s_.comm, &pending_);
  if (rc != 0) {
    last_error_ = rc;
    pending_ = s_.request_null;
    return MpiStatus::kMpiError;
  }
  const MpiStatus st = wait(reinterpret_cast<intptr_t>(&pending_), timeout);
  if (st != MpiStatus::kDone) return st;
  if (op == s_.avg_op) {  // floating dtypes only (the communicator refuses "avg" of integers)
    const int64_t n = t.numel();
    const int P = s_.world_size;
    if (t.dtype() == DType::kFloat32) {
      float* x = static_cast<float*>(t.data_ptr());
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] / float(P);
    } else if (t.dtype() == DType::kFloat64) {
      double* x = static_cast<double*>(t.data_ptr());
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] / double(P);
    }
  }
  return st;
}

}  // namespace sl::comm
