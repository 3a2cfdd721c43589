// The NCCL communicator (Comm, Work): the per-device communication streams, the shared CommState, failure
// messages, the watchdog thread and the collectives themselves. nccl.h explains the design (streams and
// events, timeouts, errors). NCCL's types and the loaded function table come from nccl_api.h; what this file
// shares with the multi-GPU clique (polling pace, dtype and op mapping, the non-blocking config, failure
// hints) from nccl_common.h; loading the library and the library functions of nccl.h (available, version,
// get_unique_id, ...) are in nccl_api.cpp.
#include "comm/nccl.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "core/errors.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "comm/nccl_api.h"
#include "comm/nccl_common.h"
#include "cuda/allocator.h"
#include "cuda/runtime.h"

namespace sl::cuda::nccl {

using namespace detail;  // NCCL's ABI and api() (nccl_api.h), the shared helpers (nccl_common.h)

namespace {

constexpr auto kWatchPeriod = std::chrono::milliseconds(10);  // watchdog tick

// One communication stream per device, created on first use with the device current and never destroyed
// (work may be in flight during interpreter exit). Highest priority: NCCL's kernels are scheduled ahead of
// queued compute kernels, so the exchange of early gradient buckets is not starved by the backward pass.
cudaStream_t comm_stream(int device) {
  static std::mutex* mutex = new std::mutex();
  static std::vector<cudaStream_t>* streams = new std::vector<cudaStream_t>();
  std::lock_guard<std::mutex> lock(*mutex);
  if (int(streams->size()) <= device) streams->resize(device + 1, nullptr);
  cudaStream_t& s = (*streams)[device];
  if (s == nullptr) {
    DeviceGuard guard(device);
    int least = 0, greatest = 0;
    SL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    SL_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
  }
  return s;
}

}  // namespace

// ---------------------------------------------------------------- shared state
struct CommState {
  int rank = 0, world_size = 1, device = 0;
  cudaStream_t stream = nullptr;  // the device's communication stream
  std::function<void()> interrupt;
  std::atomic<double> timeout_s{300.0};

  std::mutex mutex;            // serialises every NCCL call on `comm` (a communicator is not thread-safe)
  ncclComm_t comm = nullptr;   // null once destroyed or aborted
  std::atomic<bool> closed{false};
  uint64_t count = 0;          // operations enqueued, to name them in messages
  std::shared_ptr<Event> ready;  // recorded on the compute stream before each collective (one is enough:
                                 // cudaStreamWaitEvent uses the record that precedes it)

  std::mutex error_mutex;      // the error text, readable while `mutex` is held by a long call
  std::string error;
  std::atomic<bool> failed{false};

  // The watchdog: work in flight, oldest first (one stream: it finishes in that order).
  struct InFlight {
    std::shared_ptr<Event> done;
    Clock::time_point start;
    std::string what;
  };
  std::mutex watch_mutex;  // taken after `mutex` when both are needed, never before
  std::condition_variable watch_cv;
  std::deque<InFlight> in_flight;
  bool stop = false;
  std::thread watchdog;

  ~CommState() {
    {
      std::lock_guard<std::mutex> lock(watch_mutex);
      stop = true;
    }
    watch_cv.notify_all();
    if (watchdog.joinable()) {
      if (watchdog.get_id() == std::this_thread::get_id()) watchdog.detach();
      else watchdog.join();
    }
  }

  std::string where() const { return str("rank ", rank, " of ", world_size, ", cuda:", device); }
  std::string error_text() {
    std::lock_guard<std::mutex> lock(error_mutex);
    return error;
  }
};

namespace {

const char* kUnusable = " The communicator is aborted and every later call on it raises this error; create a new "
                        "one (dist.init) or restart the job.";

std::string nccl_failure(CommState& s, const std::string& what, const char* call, ncclResult_t r) {
  return str("nccl ", what, " (", s.where(), "): ", call, " failed: ", error_string(r), last_error_detail(s.comm), ".",
             failure_hint(r), kUnusable);
}

std::string timeout_failure(CommState& s, const std::string& what, double seconds) {
  if (what == "init")
    return str("nccl init (", s.where(), "): the ", s.world_size, " ranks did not all join within ", seconds,
               " s. Every rank must call dist.init(backend='nccl') with the same NcclIdHolder (or in the same "
               "mpiexec job) and world_size=", s.world_size, "; a rank that failed before joining printed its own "
               "error. Raise the timeout (timeout= or SINGA_LITE_COMM_TIMEOUT) if ranks start slowly.");
  return str("nccl ", what, " (", s.where(), "): not finished after ", seconds,
             " s. A rank died, has not called it, or called a different operation (NCCL cannot tell which rank: "
             "look at the other ranks' output), or the timeout is too short for this job (timeout= or "
             "SINGA_LITE_COMM_TIMEOUT).", kUnusable);
}

// Marks the communicator failed with `message` (the first failure wins) and aborts it: ncclCommAbort ends
// this rank's NCCL kernels, so streams waiting for them drain. s.mutex must be held. Returns the error.
CommError fail(CommState& s, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(s.error_mutex);
    if (s.error.empty()) s.error = message;
  }
  s.failed = true;
  if (s.comm != nullptr) {
    ncclComm_t c = s.comm;
    s.comm = nullptr;
    // The calling thread (Comm::abort from Python, an op's failure) may have another GPU current: NCCL works on
    // the current device, so make the communicator's current. The abort goes ahead even if that fails.
    std::optional<DeviceGuard> guard;
    try {
      guard.emplace(s.device);
    } catch (...) {
    }
    api().CommAbort(c);  // its result does not matter: the communicator is gone either way
  }
  {
    std::lock_guard<std::mutex> lock(s.watch_mutex);
    s.in_flight.clear();
  }
  return CommError(s.error_text());
}

// Completes a call on the non-blocking communicator: success returns; ncclInProgress is polled through
// ncclCommGetAsyncError until it settles (NCCL forbids any other call on the communicator, or CUDA work on
// its stream, before that); an error or the deadline aborts the communicator and throws. s.mutex held.
void settle(CommState& s, ncclResult_t r, const char* call, const std::string& what, Clock::time_point deadline,
            double seconds) {
  if (r == ncclSuccess) return;
  if (r != ncclInProgress) throw fail(s, nccl_failure(s, what, call, r));
  const Api& a = api();
  Backoff backoff;
  auto next_interrupt = Clock::now() + kInterruptEvery;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t q = a.CommGetAsyncError(s.comm, &state);
    if (q != ncclSuccess) throw fail(s, nccl_failure(s, what, "ncclCommGetAsyncError", q));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) throw fail(s, nccl_failure(s, what, call, state));
    const auto now = Clock::now();
    if (now >= deadline) throw fail(s, timeout_failure(s, what, seconds));
    if (s.interrupt && now >= next_interrupt) {
      next_interrupt = now + kInterruptEvery;
      try {
        s.interrupt();
      } catch (...) {
        // The call is half done and cannot be cancelled: the communicator cannot be used again.
        fail(s, str("nccl ", what, " (", s.where(), "): interrupted while NCCL was completing ", call, ".",
                    kUnusable));
        throw;
      }
    }
    backoff.pause();
  }
}

void check_usable(CommState& s) {
  if (s.closed) throw CommError(str("nccl communicator (", s.where(), "): used after close()"));
  if (s.failed) throw CommError(s.error_text());
  // Errors NCCL noticed since the last call (a peer's connection broke, ...), before queueing more work.
  ncclResult_t state = ncclSuccess;
  ncclResult_t q = api().CommGetAsyncError(s.comm, &state);
  if (q != ncclSuccess) throw fail(s, nccl_failure(s, "check", "ncclCommGetAsyncError", q));
  if (state != ncclSuccess && state != ncclInProgress)
    throw fail(s, nccl_failure(s, "check", "a previous operation", state));
}

void watchdog_loop(CommState* s) {
  // Events of this device are queried from here; errors surface through cudaEventQuery below.
  make_current(s->device);
  std::unique_lock<std::mutex> wl(s->watch_mutex);
  while (!s->stop && !s->failed) {
    s->watch_cv.wait_for(wl, kWatchPeriod);
    if (s->stop || s->failed) break;
    std::string timed_out, cuda_error;
    while (!s->in_flight.empty()) {
      cudaError_t err = cudaEventQuery(s->in_flight.front().done->e);
      if (err == cudaSuccess) {
        s->in_flight.pop_front();
        continue;
      }
      if (err == cudaErrorNotReady) {
        cudaGetLastError();
      } else {
        cuda_error = str("nccl ", s->in_flight.front().what, " (", s->where(), "): the GPU reported ",
                         cudaGetErrorString(err), " while it ran.", kUnusable);
      }
      break;
    }
    const bool busy = !s->in_flight.empty();
    if (busy && cuda_error.empty()) {
      const double seconds = s->timeout_s.load();
      const auto& front = s->in_flight.front();
      if (Clock::now() - front.start > std::chrono::duration<double>(seconds))
        timed_out = timeout_failure(*s, front.what, seconds);
    }
    if (!busy && cuda_error.empty()) continue;  // nothing in flight: nothing to protect
    const std::string front_what = busy ? s->in_flight.front().what : std::string("check");
    wl.unlock();  // lock order: s->mutex before watch_mutex
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      if (s->comm != nullptr) {
        if (!cuda_error.empty()) {
          fail(*s, cuda_error);
        } else if (!timed_out.empty()) {
          fail(*s, timed_out);
        } else {
          ncclResult_t state = ncclSuccess;
          ncclResult_t q = api().CommGetAsyncError(s->comm, &state);
          if (q != ncclSuccess) fail(*s, nccl_failure(*s, front_what, "ncclCommGetAsyncError", q));
          else if (state != ncclSuccess && state != ncclInProgress)
            fail(*s, nccl_failure(*s, front_what, "the operation", state));
        }
      }
    }
    wl.lock();
  }
}

void check_tensor(const CommState& s, const Tensor& t, const char* op, const char* name) {
  SL_CHECK(t.defined(), ValueError, op, ": ", name, " is undefined");
  SL_CHECK(t.device() == Device::cuda(s.device), ValueError, op, ": this nccl communicator (", s.where(),
           ") moves tensors on cuda:", s.device, ", got ", name, " on ", t.device().str(),
           "; move it with to_device(cuda:", s.device, ") (one communicator per process and GPU)");
  SL_CHECK(t.is_contiguous(), ValueError, op, ": ", name, " must be contiguous; call contiguous() first");
  nccl_type(t.dtype(), op);
}

void check_root(const CommState& s, int root, const char* op, const char* name) {
  SL_CHECK(root >= 0 && root < s.world_size, ValueError, op, ": ", name, " must be a rank in [0, ", s.world_size,
           "), got ", root);
}

// One point-to-point call per rank except `skip`, fused in a group (so that they progress together). The
// group is always closed, even after a failed call: NCCL's group state belongs to the thread and would
// otherwise capture this thread's later NCCL calls.
template <typename Call>
void grouped(CommState& s, const char* call, const std::string& what, Clock::time_point dl, double sec, int skip,
             Call&& one) {
  if (s.world_size == 1) return;
  const Api& a = api();
  settle(s, a.GroupStart(), "ncclGroupStart", what, dl, sec);
  ncclResult_t first = ncclSuccess;
  for (int r = 0; r < s.world_size; ++r) {
    if (r == skip) continue;
    const ncclResult_t x = one(r);
    if (first == ncclSuccess && x != ncclSuccess && x != ncclInProgress) first = x;
  }
  const ncclResult_t end = a.GroupEnd();
  if (first != ncclSuccess) settle(s, first, call, what, dl, sec);  // throws
  settle(s, end, "ncclGroupEnd", what, dl, sec);
}

// Queues one operation: the communication stream waits for the compute stream, `issue` makes the NCCL
// calls (and settles them), `done` is recorded behind them and handed to the watchdog. A failure after
// NCCL may have queued anything aborts the communicator: tensors it may still use would be released.
template <typename Issue>
std::shared_ptr<Work> enqueue(const std::shared_ptr<CommState>& sp, const char* op, const Tensor& like,
                              std::vector<Tensor> held, Issue&& issue) {
  CommState& s = *sp;
  std::lock_guard<std::mutex> lock(s.mutex);
  check_usable(s);
  const std::string what = str(op, " #", ++s.count, " (", like.numel(), " ", dtype_name(like.dtype()), ")");
  DeviceGuard guard(s.device);
  auto done = std::make_shared<Event>(s.device);
  SL_CUDA_CHECK(cudaEventRecord(s.ready->e, cuda::stream(s.device)));
  SL_CUDA_CHECK(cudaStreamWaitEvent(s.stream, s.ready->e, 0));
  const double seconds = s.timeout_s.load();
  try {
    issue(what, deadline_after(seconds), seconds);
    SL_CUDA_CHECK(cudaEventRecord(done->e, s.stream));
  } catch (const CommError&) {
    throw;  // settle() failed the communicator already
  } catch (const std::exception& e) {
    if (!s.failed) fail(s, str("nccl ", what, " (", s.where(), "): ", e.what(), ".", kUnusable));
    throw;
  }
  {
    std::lock_guard<std::mutex> wl(s.watch_mutex);
    s.in_flight.push_back({done, Clock::now(), what});
  }
  return std::make_shared<Work>(sp, what, std::move(done), std::move(held));
}

}  // namespace

// ---------------------------------------------------------------- Work
Work::Work(std::shared_ptr<CommState> state, std::string what, std::shared_ptr<Event> done, std::vector<Tensor> held)
    : state_(std::move(state)), what_(std::move(what)), done_(std::move(done)), held_(std::move(held)) {}

Work::~Work() {
  if (ordered_ || held_.empty()) return;
  // Nobody waited: order the compute stream anyway before the tensors go back to the allocator.
  try {
    cudaStreamWaitEvent(cuda::stream(state_->device), done_->e, 0);
  } catch (...) {
    // during interpreter exit CUDA may be gone; nothing is reused then
  }
}

bool Work::completed() {
  if (state_->failed) return true;  // over; order() and wait() raise the error
  return event_done(done_->e);
}

void Work::order() {
  if (state_->failed) throw CommError(state_->error_text());
  if (ordered_) return;
  SL_CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(state_->device), done_->e, 0));
  ordered_ = true;
  held_.clear();  // later compute-stream work, which may reuse these blocks, now runs after the operation
}

void Work::synchronize(double timeout_s, bool abort_on_timeout, const std::function<void()>& interrupt_check) {
  SL_CHECK(timeout_s > 0, ValueError, "wait: timeout must be a positive number of seconds, got ", timeout_s);
  CommState& s = *state_;
  const auto deadline = deadline_after(timeout_s);
  auto next_interrupt = Clock::now() + kInterruptEvery;
  Backoff backoff;
  for (;;) {
    if (s.failed) throw CommError(s.error_text());
    if (event_done(done_->e)) {
      if (s.failed) throw CommError(s.error_text());  // aborted kernels also "finish"
      return;
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      if (!abort_on_timeout)
        throw CommError(str("nccl ", what_, " (", s.where(), "): not finished after waiting ", timeout_s,
                            " s; the communicator is still usable (it times out after ", s.timeout_s.load(), " s)"));
      std::lock_guard<std::mutex> lock(s.mutex);
      if (!s.failed) throw fail(s, timeout_failure(s, what_, timeout_s));
      throw CommError(s.error_text());
    }
    if (interrupt_check && now >= next_interrupt) {
      next_interrupt = now + kInterruptEvery;
      interrupt_check();  // a Ctrl-C ends the wait; the operation itself goes on
    }
    backoff.pause();
  }
}

// ---------------------------------------------------------------- Comm
Comm::Comm(const std::string& unique_id, int rank, int world_size, int device, double timeout_s,
           std::function<void()> interrupt_check) {
  const Api& a = api();
  SL_CHECK(unique_id.size() == sizeof(ncclUniqueId), ValueError, "nccl: the unique id must be ",
           sizeof(ncclUniqueId), " bytes (from nccl_get_unique_id), got ", unique_id.size());
  SL_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, ValueError,
           "nccl: need 0 <= rank < world_size, got rank=", rank, ", world_size=", world_size);
  SL_CHECK(timeout_s > 0, ValueError, "nccl: timeout must be a positive number of seconds, got ", timeout_s);
  const int n = cuda::device_count();
  if (n == 0) throw CudaError(str("the nccl backend needs a GPU: ", cuda::unavailable_reason()));
  SL_CHECK(device >= 0 && device < n, ValueError, "nccl: cuda:", device, " does not exist (this machine has ", n,
           " GPU(s), cuda:0 to cuda:", n - 1, ")");

  auto s = std::make_shared<CommState>();
  s->rank = rank;
  s->world_size = world_size;
  s->device = device;
  s->timeout_s = timeout_s;
  s->interrupt = std::move(interrupt_check);
  // NCCL binds a communicator to the device current when it is created: make it the chosen one.
  DeviceGuard guard(device);
  // NCCL allocates its buffers with cudaMalloc, at init and at its first collectives, and cannot be retried once a
  // collective half failed: give it the blocks the caching allocator holds free (allocator.h). First of all: the
  // streams and the event below need a little device memory too, and on a GPU our cache had filled, creating the
  // communication stream failed with "out of memory" (the first GPU run).
  cuda::empty_cache(device);
  cuda::stream(device);  // the compute stream exists before the first collective waits for it
  s->stream = comm_stream(device);
  s->ready = std::make_shared<Event>(device);

  ncclConfig_v21400 config = nonblocking_config();  // calls return at once; we poll with a timeout
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  {
    std::lock_guard<std::mutex> lock(s->mutex);
    ncclComm_t c = nullptr;
    ncclResult_t r = a.CommInitRankConfig(&c, world_size, id, rank, &config);
    s->comm = c;
    if (r != ncclSuccess && r != ncclInProgress) {
      std::string message = nccl_failure(*s, "init", "ncclCommInitRankConfig", r);
      if (s->comm != nullptr) fail(*s, message);
      throw CommError(message);
    }
    settle(*s, r, "ncclCommInitRankConfig", "init", deadline_after(timeout_s), timeout_s);
  }
  CommState* raw = s.get();
  s->watchdog = std::thread([raw] { watchdog_loop(raw); });
  state_ = std::move(s);
}

Comm::~Comm() {
  if (!state_) return;
  state_->interrupt = nullptr;  // no calls into Python from a destructor
  try {
    close();
  } catch (...) {
    // close() reports failures to callers that asked for it; here there is nobody to tell
  }
}

int Comm::rank() const { return state_->rank; }
int Comm::world_size() const { return state_->world_size; }
int Comm::device() const { return state_->device; }
double Comm::timeout() const { return state_->timeout_s.load(); }
void Comm::set_timeout(double seconds) {
  SL_CHECK(seconds > 0, ValueError, "nccl: timeout must be a positive number of seconds, got ", seconds);
  state_->timeout_s = seconds;
}
std::string Comm::error() const { return state_->error_text(); }
bool Comm::closed() const { return state_->closed; }

std::shared_ptr<Work> Comm::all_reduce(const Tensor& t, const std::string& op) {
  CommState& s = *state_;
  check_tensor(s, t, "all_reduce", "tensor");
  const ncclRedOp_t rop = nccl_op(op, t.dtype(), "all_reduce");
  const ncclDataType_t type = nccl_type(t.dtype(), "all_reduce");
  return enqueue(state_, "all_reduce", t, {t}, [&](const std::string& what, Clock::time_point dl, double sec) {
    settle(s, api().AllReduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), type, rop, s.comm, s.stream),
           "ncclAllReduce", what, dl, sec);
  });
}

std::shared_ptr<Work> Comm::broadcast(const Tensor& t, int root) {
  CommState& s = *state_;
  check_tensor(s, t, "broadcast", "tensor");
  check_root(s, root, "broadcast", "root");
  const ncclDataType_t type = nccl_type(t.dtype(), "broadcast");
  return enqueue(state_, "broadcast", t, {t}, [&](const std::string& what, Clock::time_point dl, double sec) {
    settle(s, api().Broadcast(t.data_ptr(), t.data_ptr(), size_t(t.numel()), type, root, s.comm, s.stream),
           "ncclBroadcast", what, dl, sec);
  });
}

std::shared_ptr<Work> Comm::reduce(const Tensor& t, int root, const std::string& op) {
  CommState& s = *state_;
  check_tensor(s, t, "reduce", "tensor");
  check_root(s, root, "reduce", "root");
  const ncclRedOp_t rop = nccl_op(op, t.dtype(), "reduce");
  const ncclDataType_t type = nccl_type(t.dtype(), "reduce");
  // Only the root receives: other ranks pass no receive buffer, so their tensor stays as it was.
  void* recv = s.rank == root ? t.data_ptr() : nullptr;
  return enqueue(state_, "reduce", t, {t}, [&](const std::string& what, Clock::time_point dl, double sec) {
    settle(s, api().Reduce(t.data_ptr(), recv, size_t(t.numel()), type, rop, root, s.comm, s.stream), "ncclReduce",
           what, dl, sec);
  });
}

std::shared_ptr<Work> Comm::all_gather(const Tensor& out, const Tensor& in) {
  CommState& s = *state_;
  check_tensor(s, in, "all_gather", "input");
  check_tensor(s, out, "all_gather", "out");
  SL_CHECK(out.dtype() == in.dtype() && out.numel() == in.numel() * s.world_size, ValueError,
           "all_gather: out must hold world_size * input.numel = ", in.numel() * s.world_size, " ",
           dtype_name(in.dtype()), " elements, got ", out.numel(), " ", dtype_name(out.dtype()));
  const ncclDataType_t type = nccl_type(in.dtype(), "all_gather");
  return enqueue(state_, "all_gather", in, {out, in}, [&](const std::string& what, Clock::time_point dl, double sec) {
    settle(s, api().AllGather(in.data_ptr(), out.data_ptr(), size_t(in.numel()), type, s.comm, s.stream),
           "ncclAllGather", what, dl, sec);
  });
}

std::shared_ptr<Work> Comm::reduce_scatter(const Tensor& out, const Tensor& in, const std::string& op) {
  CommState& s = *state_;
  check_tensor(s, in, "reduce_scatter", "input");
  check_tensor(s, out, "reduce_scatter", "out");
  SL_CHECK(out.dtype() == in.dtype() && in.numel() == out.numel() * s.world_size, ValueError,
           "reduce_scatter: input must hold world_size * out.numel = ", out.numel() * s.world_size, " ",
           dtype_name(out.dtype()), " elements, got ", in.numel(), " ", dtype_name(in.dtype()));
  const ncclRedOp_t rop = nccl_op(op, in.dtype(), "reduce_scatter");
  const ncclDataType_t type = nccl_type(in.dtype(), "reduce_scatter");
  return enqueue(state_, "reduce_scatter", in, {out, in},
                 [&](const std::string& what, Clock::time_point dl, double sec) {
                   settle(s, api().ReduceScatter(in.data_ptr(), out.data_ptr(), size_t(out.numel()), type, rop, s.comm,
                                                 s.stream),
                          "ncclReduceScatter", what, dl, sec);
                 });
}

// NCCL's own gather and scatter arrived only in recent versions; a group of point-to-point calls does the
// same on every NCCL 2.7+, and the root's own block is a device-to-device copy on the communication stream.
std::shared_ptr<Work> Comm::gather(const Tensor& out, const Tensor& in, int root) {
  CommState& s = *state_;
  check_root(s, root, "gather", "root");
  check_tensor(s, in, "gather", "input");
  const bool is_root = s.rank == root;
  if (is_root) {
    check_tensor(s, out, "gather", "out");
    SL_CHECK(out.dtype() == in.dtype() && out.numel() == in.numel() * s.world_size, ValueError,
             "gather: out must hold world_size * input.numel = ", in.numel() * s.world_size, " ",
             dtype_name(in.dtype()), " elements, got ", out.numel(), " ", dtype_name(out.dtype()));
  }
  const ncclDataType_t type = nccl_type(in.dtype(), "gather");
  const size_t n = size_t(in.numel());
  const size_t block = n * in.itemsize();
  std::vector<Tensor> held{in};
  if (is_root) held.push_back(out);
  auto issue = [&](const std::string& what, Clock::time_point dl, double sec) {
    const Api& a = api();
    if (!is_root) {
      settle(s, a.Send(in.data_ptr(), n, type, root, s.comm, s.stream), "ncclSend", what, dl, sec);
      return;
    }
    char* base = static_cast<char*>(out.data_ptr());
    SL_CUDA_CHECK(cudaMemcpyAsync(base + size_t(root) * block, in.data_ptr(), block, cudaMemcpyDeviceToDevice,
                                  s.stream));
    grouped(s, "ncclRecv", what, dl, sec, root,
            [&](int r) { return a.Recv(base + size_t(r) * block, n, type, r, s.comm, s.stream); });
  };
  return enqueue(state_, "gather", in, std::move(held), issue);
}

std::shared_ptr<Work> Comm::scatter(const Tensor& out, const Tensor& in, int root) {
  CommState& s = *state_;
  check_root(s, root, "scatter", "root");
  check_tensor(s, out, "scatter", "out");
  const bool is_root = s.rank == root;
  if (is_root) {
    check_tensor(s, in, "scatter", "input");
    SL_CHECK(out.dtype() == in.dtype() && in.numel() == out.numel() * s.world_size, ValueError,
             "scatter: input must hold world_size * out.numel = ", out.numel() * s.world_size, " ",
             dtype_name(out.dtype()), " elements, got ", in.numel(), " ", dtype_name(in.dtype()));
  }
  const ncclDataType_t type = nccl_type(out.dtype(), "scatter");
  const size_t n = size_t(out.numel());
  const size_t block = n * out.itemsize();
  std::vector<Tensor> held{out};
  if (is_root) held.push_back(in);
  auto issue = [&](const std::string& what, Clock::time_point dl, double sec) {
    const Api& a = api();
    if (!is_root) {
      settle(s, a.Recv(out.data_ptr(), n, type, root, s.comm, s.stream), "ncclRecv", what, dl, sec);
      return;
    }
    const char* base = static_cast<const char*>(in.data_ptr());
    SL_CUDA_CHECK(cudaMemcpyAsync(out.data_ptr(), base + size_t(root) * block, block, cudaMemcpyDeviceToDevice,
                                  s.stream));
    grouped(s, "ncclSend", what, dl, sec, root,
            [&](int r) { return a.Send(base + size_t(r) * block, n, type, r, s.comm, s.stream); });
  };
  return enqueue(state_, "scatter", out, std::move(held), issue);
}

std::shared_ptr<Work> Comm::send(const Tensor& t, int peer) {
  CommState& s = *state_;
  check_tensor(s, t, "send", "tensor");
  check_root(s, peer, "send", "dst");
  SL_CHECK(peer != s.rank, ValueError, "send: dst=", peer, " is this rank itself");
  const ncclDataType_t type = nccl_type(t.dtype(), "send");
  return enqueue(state_, "send", t, {t}, [&](const std::string& what, Clock::time_point dl, double sec) {
    settle(s, api().Send(t.data_ptr(), size_t(t.numel()), type, peer, s.comm, s.stream), "ncclSend", what, dl, sec);
  });
}

std::shared_ptr<Work> Comm::recv(const Tensor& t, int peer) {
  CommState& s = *state_;
  check_tensor(s, t, "recv", "tensor");
  check_root(s, peer, "recv", "src");
  SL_CHECK(peer != s.rank, ValueError, "recv: src=", peer, " is this rank itself");
  const ncclDataType_t type = nccl_type(t.dtype(), "recv");
  return enqueue(state_, "recv", t, {t}, [&](const std::string& what, Clock::time_point dl, double sec) {
    settle(s, api().Recv(t.data_ptr(), size_t(t.numel()), type, peer, s.comm, s.stream), "ncclRecv", what, dl, sec);
  });
}

void Comm::abort(const std::string& reason) {
  CommState& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.closed || s.failed) return;
  fail(s, str("nccl communicator (", s.where(), ") aborted: ", reason, ". The other ranks fail when their "
              "operations with this rank time out.", kUnusable));
}

void Comm::close() {
  CommState& s = *state_;
  {
    std::lock_guard<std::mutex> wl(s.watch_mutex);
    s.stop = true;
  }
  s.watch_cv.notify_all();
  // The watchdog takes s.mutex: join it before taking that lock ourselves.
  if (s.watchdog.joinable() && s.watchdog.get_id() != std::this_thread::get_id()) s.watchdog.join();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.closed) return;
  s.closed = true;
  if (s.comm == nullptr) return;  // failed: aborted already
  // A healthy communicator is finalized (its work in flight is flushed) before it is destroyed, and both
  // happen before CUDA is torn down (the Python package closes communicators at exit).
  const double seconds = s.timeout_s.load();
  DeviceGuard guard(s.device);
  settle(s, api().CommFinalize(s.comm), "ncclCommFinalize", "close", deadline_after(seconds), seconds);
  ncclComm_t c = s.comm;
  s.comm = nullptr;
  // On a non-blocking communicator NCCL may finish freeing in its own thread: ncclInProgress is success
  // here (the handle must not be used again, so there is nothing to poll).
  ncclResult_t r = api().CommDestroy(c);
  if (r != ncclSuccess && r != ncclInProgress)
    throw CommError(str("nccl close (", s.where(), "): ncclCommDestroy failed: ", error_string(r)));
}

}  // namespace sl::cuda::nccl
