// NCCL's single-process multi-device communicator (Clique): creation as one group, grouped collectives on
// the devices' compute streams, polling every communicator with a deadline, failure (abort all) and close.
// nccl_clique.h explains the design; what it shares with the one-GPU communicator (polling pace, dtype and
// op mapping, the non-blocking config, failure hints, Event) comes from nccl_common.h.
#include "comm/nccl_clique.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include "comm/nccl_common.h"
#include "cuda/allocator.h"
#include "cuda/runtime.h"

namespace sl::cuda::nccl {

using namespace detail;  // NCCL's ABI and api() (nccl_api.h), the shared helpers (nccl_common.h)

struct CliqueState {
  std::vector<int> devices;        // rank i runs on cuda:devices[i]
  std::vector<ncclComm_t> comms;   // one per device; all null once aborted or destroyed
  std::vector<std::unique_ptr<Event>> done;  // per device, recorded on its compute stream after each operation
  bool issued = false;             // has any operation recorded `done`?
  std::function<void()> interrupt;
  std::atomic<double> timeout_s{300.0};

  std::mutex mutex;                // serialises every call: NCCL's group state is per thread, and a
                                   // communicator must not be used by two threads at once
  std::atomic<bool> closed{false};
  std::atomic<bool> failed{false};
  uint64_t count = 0;              // operations issued, to name them in messages

  std::mutex error_mutex;          // the error text, readable while `mutex` is held by a long call
  std::string error;

  int size() const { return int(devices.size()); }
  std::string all_devices() const {
    std::string s;
    for (int d : devices) s += str(s.empty() ? "" : ", ", "cuda:", d);
    return s;
  }
  // Where something happened: one rank (its device), or the whole clique (rank < 0).
  std::string where(int rank) const {
    if (rank < 0) return str("clique of ", all_devices());
    return str("rank ", rank, " of ", size(), ", cuda:", devices[size_t(rank)]);
  }
  std::string error_text() {
    std::lock_guard<std::mutex> lock(error_mutex);
    return error;
  }
};

namespace {

const char* kUnusable = " Every communicator of the clique is aborted and every later call on it raises this error; "
                        "create a new one (singa_lite.multi_device does so on its next all_reduce).";

std::string failure(const CliqueState& s, const std::string& what, const char* call, int rank, ncclResult_t r) {
  const ncclComm_t comm = rank >= 0 ? s.comms[size_t(rank)] : nullptr;
  return str("nccl clique ", what, " (", s.where(rank), "): ", call, " failed: ", error_string(r),
             last_error_detail(comm), ".", failure_hint(r), kUnusable);
}

// Marks the clique failed with `message` (the first failure wins) and aborts every communicator:
// ncclCommAbort ends their NCCL kernels, so compute streams waiting behind them drain. s.mutex must be held.
CommError fail(CliqueState& s, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(s.error_mutex);
    if (s.error.empty()) s.error = message;
  }
  s.failed = true;
  for (size_t i = 0; i < s.comms.size(); ++i) {
    if (s.comms[i] == nullptr) continue;
    ncclComm_t c = s.comms[i];
    s.comms[i] = nullptr;
    // Each communicator is aborted with its own device current; nothing here may throw, or the rest of the
    // clique would stay alive.
    std::optional<DeviceGuard> guard;
    try {
      guard.emplace(s.devices[i]);
    } catch (...) {
    }
    api().CommAbort(c);  // its result does not matter: the communicator is gone either way
  }
  return CommError(s.error_text());
}

// Polls `done(i)` for every rank i until all are true. `done` returns true, false (not yet) or throws.
// Deadline and interrupt as everywhere: at the deadline on_timeout(pending ranks) is thrown; an interrupt
// check (about every 40 ms) that throws runs on_interrupt() first, then propagates.
template <typename Done, typename OnTimeout, typename OnInterrupt>
void poll_all(CliqueState& s, Done&& done, Clock::time_point deadline, OnTimeout&& on_timeout,
              OnInterrupt&& on_interrupt) {
  std::vector<bool> finished(s.devices.size(), false);
  size_t left = finished.size();
  Backoff backoff;
  auto next_interrupt = Clock::now() + kInterruptEvery;
  for (;;) {
    for (size_t i = 0; i < finished.size(); ++i) {
      if (!finished[i] && done(int(i))) {
        finished[i] = true;
        --left;
      }
    }
    if (left == 0) return;
    const auto now = Clock::now();
    if (now >= deadline) {
      std::string pending;
      for (size_t i = 0; i < finished.size(); ++i)
        if (!finished[i]) pending += str(pending.empty() ? "" : ", ", "cuda:", s.devices[i]);
      throw on_timeout(pending);
    }
    if (s.interrupt && now >= next_interrupt) {
      next_interrupt = now + kInterruptEvery;
      try {
        s.interrupt();
      } catch (...) {
        on_interrupt();
        throw;
      }
    }
    backoff.pause();
  }
}

// An NCCL call that returned an error result: aborts the clique and throws. A group reports one result for
// all ranks, so the message names the rank whose communicator knows more, if one does. s.mutex held.
void check_result(CliqueState& s, ncclResult_t r, const char* call, const std::string& what) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  int rank = -1;
  for (int i = 0; i < s.size() && rank < 0; ++i) {
    ncclResult_t state = ncclSuccess;
    if (s.comms[size_t(i)] != nullptr && api().CommGetAsyncError(s.comms[size_t(i)], &state) == ncclSuccess &&
        state != ncclSuccess && state != ncclInProgress)
      rank = i;
  }
  throw fail(s, failure(s, what, call, rank, r));
}

// Completes an NCCL call made on every communicator (a group's ncclGroupEnd, or one call per rank): an error
// result aborts the clique and throws; otherwise every communicator is polled (ncclCommGetAsyncError) until
// none is in progress -- NCCL forbids any other call on it, or dependent stream work, before that. An
// error, the deadline or an interrupt aborts the clique. s.mutex held.
void settle_all(CliqueState& s, ncclResult_t r, const char* call, const std::string& what, double seconds) {
  check_result(s, r, call, what);
  const Api& a = api();
  poll_all(
      s,
      [&](int i) {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t q = a.CommGetAsyncError(s.comms[size_t(i)], &state);
        if (q != ncclSuccess) throw fail(s, failure(s, what, "ncclCommGetAsyncError", i, q));
        if (state == ncclInProgress) return false;
        if (state != ncclSuccess) throw fail(s, failure(s, what, call, i, state));
        return true;
      },
      deadline_after(seconds),
      [&](const std::string& pending) {
        return fail(s, str("nccl clique ", what, " (", s.where(-1), "): ", call, " had not completed on ", pending,
                           " after ", seconds, " s. A GPU is stuck or much slower than the others (NCCL_DEBUG=WARN "
                           "shows what NCCL waits for), or the timeout is too short (timeout=).", kUnusable));
      },
      [&] {
        // The call is half done and cannot be cancelled: the communicators cannot be used again.
        fail(s, str("nccl clique ", what, " (", s.where(-1), "): interrupted while NCCL was completing ", call, ".",
                    kUnusable));
      });
}

void check_usable(CliqueState& s) {
  if (s.closed) throw CommError(str("nccl clique (", s.where(-1), "): used after close()"));
  if (s.failed) throw CommError(s.error_text());
  // Errors NCCL noticed since the last call, before queueing more work.
  for (int i = 0; i < s.size(); ++i) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = api().CommGetAsyncError(s.comms[size_t(i)], &state);
    if (q != ncclSuccess) throw fail(s, failure(s, "check", "ncclCommGetAsyncError", i, q));
    if (state != ncclSuccess && state != ncclInProgress)
      throw fail(s, failure(s, "check", "a previous operation", i, state));
  }
}

// Every argument check of a collective, before any NCCL call (a wrong argument leaves the clique usable).
ncclDataType_t check_tensors(const CliqueState& s, const std::vector<Tensor>& ts, const char* op) {
  const int n = s.size();
  SL_CHECK(int(ts.size()) == n, ValueError, op, ": this nccl clique has ", n, " device(s) (", s.all_devices(),
           ") and takes one tensor per device in that order, got ", ts.size(), " tensor(s)");
  for (int i = 0; i < n; ++i) {
    const Tensor& t = ts[size_t(i)];
    const int dev = s.devices[size_t(i)];
    SL_CHECK(t.defined(), ValueError, op, ": tensor ", i, " is undefined");
    SL_CHECK(t.device() == Device::cuda(dev), ValueError, op, ": tensor ", i, " must be on cuda:", dev,
             " (the clique's device ", i, "; its devices are ", s.all_devices(), "), got ", t.device().str(),
             "; move it with to_device(cuda:", dev, ") or list the tensors in the clique's device order");
    SL_CHECK(t.is_contiguous(), ValueError, op, ": tensor ", i, " (on cuda:", dev,
             ") must be contiguous; call contiguous() first");
    SL_CHECK(t.dtype() == ts[0].dtype(), TypeError, op, ": every tensor must have tensor 0's dtype ",
             dtype_name(ts[0].dtype()), ", tensor ", i, " (on cuda:", dev, ") is ", dtype_name(t.dtype()),
             "; cast with as_type()");
    SL_CHECK(t.shape() == ts[0].shape(), ValueError, op, ": every tensor must have tensor 0's shape ",
             shape_str(ts[0].shape()), ", tensor ", i, " (on cuda:", dev, ") has ", shape_str(t.shape()));
  }
  return nccl_type(ts[0].dtype(), op);
}

// Issues one NCCL call per rank inside one group, completes it, and records `done` on every compute stream.
// The group is always closed, even after a failed call: NCCL's group state belongs to the thread and would
// otherwise capture this thread's later NCCL calls. `call_one(i, stream)` makes rank i's call. s.mutex held.
template <typename CallOne>
void grouped_on_compute_streams(CliqueState& s, const char* op, const char* call, const Tensor& like,
                                CallOne&& call_one) {
  const Api& a = api();
  const std::string what = str(op, " #", ++s.count, " (", like.numel(), " ", dtype_name(like.dtype()), ")");
  const double seconds = s.timeout_s.load();
  std::vector<cudaStream_t> streams;
  for (int d : s.devices) streams.push_back(cuda::stream(d));  // created (if new) before the group opens
  DeviceGuard restore(s.devices[0]);
  check_result(s, a.GroupStart(), "ncclGroupStart", what);
  ncclResult_t first = ncclSuccess;
  int first_rank = -1;
  for (int i = 0; i < s.size(); ++i) {
    // NCCL launches on the communicator's own device; the current device is set anyway, as NCCL's own
    // multi-device examples do, so that nothing NCCL does with the current device lands on another GPU.
    make_current(s.devices[size_t(i)]);
    const ncclResult_t x = call_one(i, streams[size_t(i)]);
    if (first == ncclSuccess && x != ncclSuccess && x != ncclInProgress) {
      first = x;
      first_rank = i;
    }
  }
  const ncclResult_t end = a.GroupEnd();
  if (first != ncclSuccess) throw fail(s, failure(s, what, call, first_rank, first));
  settle_all(s, end, "ncclGroupEnd", what, seconds);
  for (int i = 0; i < s.size(); ++i) {
    make_current(s.devices[size_t(i)]);  // the event's and the stream's device, current for the record
    cudaError_t err = cudaEventRecord(s.done[size_t(i)]->e, streams[size_t(i)]);
    if (err != cudaSuccess)  // the collective is queued: its tensors must not be used while the state is unknown
      throw fail(s, str("nccl clique ", what, " (", s.where(i), "): cudaEventRecord failed after the collective: ",
                        cudaGetErrorString(err), ".", kUnusable));
  }
  s.issued = true;
}

}  // namespace

// ---------------------------------------------------------------- Clique
Clique::Clique(const std::vector<int>& devices, double timeout_s, std::function<void()> interrupt_check) {
  SL_CHECK(!devices.empty(), ValueError, "nccl clique: no devices given; list one CUDA device ordinal per rank");
  std::set<int> seen;
  for (int d : devices)
    SL_CHECK(seen.insert(d).second, ValueError, "nccl clique: cuda:", d, " is listed more than once; NCCL cannot "
             "put two ranks of one communicator on one GPU (it may hang). List each GPU once, or use the host "
             "route (multi_device.all_reduce(..., backend='host')) for replicas that share a GPU");
  SL_CHECK(timeout_s > 0, ValueError, "nccl clique: timeout must be a positive number of seconds, got ", timeout_s);
  const int count = cuda::device_count();
  if (count == 0) throw CudaError(str("the nccl clique needs GPUs: ", cuda::unavailable_reason()));
  for (int d : devices)
    SL_CHECK(d >= 0 && d < count, ValueError, "nccl clique: cuda:", d, " does not exist (this machine has ", count,
             " GPU(s), cuda:0 to cuda:", count - 1, ")");
  const Api& a = api();  // CommError saying how to install NCCL when it cannot be loaded

  auto s = std::make_shared<CliqueState>();
  s->devices = devices;
  s->comms.assign(devices.size(), nullptr);
  s->timeout_s = timeout_s;
  s->interrupt = std::move(interrupt_check);
  for (int d : devices) {
    cuda::stream(d);  // the compute streams exist before the first collective is queued on them
    s->done.push_back(std::make_unique<Event>(d));
    cuda::empty_cache(d);  // NCCL's buffers come from cudaMalloc: not from blocks our cache holds free (allocator.h)
  }

  ncclUniqueId id;
  const ncclResult_t got = a.GetUniqueId(&id);
  if (got != ncclSuccess)
    throw CommError(str("nccl clique init (", s->where(-1), "): ncclGetUniqueId failed: ", error_string(got),
                        ". NCCL_DEBUG=WARN makes NCCL report the cause."));
  ncclConfig_v21400 config = nonblocking_config();
  std::lock_guard<std::mutex> lock(s->mutex);
  DeviceGuard restore(devices[0]);  // the caller's current device is restored afterwards
  check_result(*s, a.GroupStart(), "ncclGroupStart", "init");  // no communicator yet: nothing to abort
  std::string problem;  // the first failure inside the group, reported once the group is closed
  for (int i = 0; i < s->size() && problem.empty(); ++i) {
    // NCCL binds each communicator to the device current at its creation. (The device was made current
    // above already, for its stream and event, so this does not fail short of a broken CUDA context.)
    const std::string not_current = make_current(devices[size_t(i)]);
    if (!not_current.empty()) {
      problem = str("nccl clique init (", s->where(i), "): ", not_current, ".");
      break;
    }
    ncclComm_t c = nullptr;
    const ncclResult_t r = a.CommInitRankConfig(&c, s->size(), id, i, &config);
    s->comms[size_t(i)] = c;  // non-blocking: the handle exists at once, to be polled (or aborted)
    if (r != ncclSuccess && r != ncclInProgress) problem = failure(*s, "init", "ncclCommInitRankConfig", i, r);
  }
  const ncclResult_t end = a.GroupEnd();  // closes the group whatever happened inside it
  if (!problem.empty()) {
    fail(*s, problem);  // aborts the communicators created so far
    throw CommError(problem);
  }
  settle_all(*s, end, "ncclCommInitRankConfig", "init", timeout_s);
  state_ = std::move(s);
}

Clique::~Clique() {
  if (!state_) return;
  state_->interrupt = nullptr;  // no calls into Python from a destructor
  try {
    close();
  } catch (...) {
    // close() reports failures to callers that asked for it; here there is nobody to tell
  }
}

const std::vector<int>& Clique::devices() const { return state_->devices; }
int Clique::size() const { return state_->size(); }
double Clique::timeout() const { return state_->timeout_s.load(); }
void Clique::set_timeout(double seconds) {
  SL_CHECK(seconds > 0, ValueError, "nccl clique: timeout must be a positive number of seconds, got ", seconds);
  state_->timeout_s = seconds;
}
std::string Clique::error() const { return state_->error_text(); }
bool Clique::closed() const { return state_->closed; }

void Clique::all_reduce(const std::vector<Tensor>& tensors, const std::string& op) {
  CliqueState& s = *state_;
  const ncclDataType_t type = check_tensors(s, tensors, "all_reduce");
  const ncclRedOp_t rop = nccl_op(op, tensors[0].dtype(), "all_reduce");
  std::lock_guard<std::mutex> lock(s.mutex);
  check_usable(s);
  const size_t count = size_t(tensors[0].numel());
  if (count == 0) return;  // nothing to reduce; no NCCL call for empty buffers
  grouped_on_compute_streams(s, "all_reduce", "ncclAllReduce", tensors[0], [&](int i, cudaStream_t stream) {
    void* p = tensors[size_t(i)].data_ptr();
    return api().AllReduce(p, p, count, type, rop, s.comms[size_t(i)], stream);
  });
}

void Clique::broadcast(const std::vector<Tensor>& tensors, int root) {
  CliqueState& s = *state_;
  const ncclDataType_t type = check_tensors(s, tensors, "broadcast");
  SL_CHECK(root >= 0 && root < s.size(), ValueError, "broadcast: root must be a position in the clique's device "
           "list [0, ", s.size(), ") (", s.all_devices(), "), got ", root);
  std::lock_guard<std::mutex> lock(s.mutex);
  check_usable(s);
  const size_t count = size_t(tensors[0].numel());
  if (count == 0) return;
  grouped_on_compute_streams(s, "broadcast", "ncclBroadcast", tensors[0], [&](int i, cudaStream_t stream) {
    void* p = tensors[size_t(i)].data_ptr();
    return api().Broadcast(p, p, count, type, root, s.comms[size_t(i)], stream);
  });
}

void Clique::synchronize(double timeout_s) {
  SL_CHECK(timeout_s > 0, ValueError, "synchronize: timeout must be a positive number of seconds, got ", timeout_s);
  CliqueState& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.failed) throw CommError(s.error_text());
  if (s.closed) throw CommError(str("nccl clique (", s.where(-1), "): used after close()"));
  if (!s.issued) return;
  poll_all(
      s, [&](int i) { return event_done(s.done[size_t(i)]->e); }, deadline_after(timeout_s),
      [&](const std::string& pending) {
        return fail(s, str("nccl clique synchronize (", s.where(-1), "): the last operation (#", s.count,
                           ") had not finished on ", pending, " after ", timeout_s, " s (it waits for the work queued "
                           "before it on those devices' compute streams too).", kUnusable));
      },
      [] {});  // a Ctrl-C ends this wait only; the operation itself goes on and the clique stays usable
  if (s.failed) throw CommError(s.error_text());  // aborted kernels also "finish"
}

void Clique::abort(const std::string& reason) {
  CliqueState& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.closed || s.failed) return;
  fail(s, str("nccl clique (", s.where(-1), ") aborted: ", reason, ".", kUnusable));
}

void Clique::close() {
  CliqueState& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.closed) return;
  s.closed = true;
  if (s.failed) return;  // aborted already
  const Api& a = api();
  const double seconds = s.timeout_s.load();
  // Finalize flushes each communicator's work and completes only once all ranks are quiescent: issued on
  // every communicator first (non-blocking, so each returns at once) and then polled together; finalizing
  // them one after the other to completion would wait on ranks not finalized yet.
  DeviceGuard restore(s.devices[0]);
  ncclResult_t first = ncclSuccess;
  int first_rank = -1;
  for (int i = 0; i < s.size(); ++i) {
    make_current(s.devices[size_t(i)]);
    const ncclResult_t r = a.CommFinalize(s.comms[size_t(i)]);
    if (first == ncclSuccess && r != ncclSuccess && r != ncclInProgress) {
      first = r;
      first_rank = i;
    }
  }
  if (first != ncclSuccess) throw fail(s, failure(s, "close", "ncclCommFinalize", first_rank, first));
  settle_all(s, ncclInProgress, "ncclCommFinalize", "close", seconds);
  std::string errors;
  for (int i = 0; i < s.size(); ++i) {
    ncclComm_t c = s.comms[size_t(i)];
    s.comms[size_t(i)] = nullptr;
    make_current(s.devices[size_t(i)]);
    // Non-blocking: NCCL may finish freeing in its own thread, so ncclInProgress is success here (the handle
    // must not be used again, so there is nothing to poll).
    const ncclResult_t r = a.CommDestroy(c);
    if (r != ncclSuccess && r != ncclInProgress)
      errors += str(" cuda:", s.devices[size_t(i)], ": ", error_string(r), ";");
  }
  if (!errors.empty())
    throw CommError(str("nccl clique close (", s.where(-1), "): ncclCommDestroy failed on", errors,
                        " the other communicators were released"));
}

}  // namespace sl::cuda::nccl
