// The NCCL communicator (the `nccl` backend of singa_lite.dist): GPU collectives among processes, one
// communicator per process and GPU.
//
// Loading: libnccl is opened at run time (dlopen), never linked, so a CUDA build imports and runs its CPU and
// single-GPU paths on machines without NCCL, and compiles without NCCL's headers: the few types and values
// used are declared in nccl_api.h with NCCL's documented numbers. The library is looked for in the directory
// given to set_library_dir() (the Python package passes the nvidia-nccl wheel's lib/ folder), then as
// libnccl.so.2 on the loader's path. NCCL 2.14 or newer is needed (non-blocking communicators, finalize).
//
// Streams and events (why): the gradients a collective reads are written by kernels on the device's compute
// stream (cuda/context.h). Each collective runs on a separate communication stream of the device, which
// first waits for an event recorded on the compute stream (so it sees finished gradients), and records a
// `done` event after it. Work::order() makes the compute stream wait for `done` (cudaStreamWaitEvent: the
// host does not block), so backward kernels keep running while an earlier bucket is being all-reduced, and
// anything queued on the compute stream after order() sees the result. A Work holds its tensors until then:
// the caching allocator (cuda/allocator.h) reuses freed blocks at once for compute-stream work, which would
// otherwise overwrite memory NCCL still reads.
//
// Nothing hangs forever: the communicator is created non-blocking (config.blocking = 0), so every NCCL call
// returns at once and is completed by polling ncclCommGetAsyncError with the communicator's timeout (this
// covers the rendezvous of init and the connection set-up of first collectives). A watchdog thread polls
// the `done` events of work in flight and the asynchronous error: when an operation has not finished after
// the timeout (a peer died or never called it), or NCCL reports an error, it aborts the communicator
// (ncclCommAbort, which also ends the NCCL kernels, so compute-stream work waiting for them drains), and
// every later call raises CommError naming the operation, the rank and the cause.
//
// Errors are exceptions (CommError, CudaError, ValueError); nothing aborts or exits the process.
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace sl::cuda::nccl {

// ----- the library
void set_library_dir(const std::string& dir);  // looked in first; a failed load is tried again after it
bool available();                              // loads NCCL when not loaded yet; false when it cannot
std::string unavailable_reason();              // why available() is false ("" when it is true)
int version();                                 // e.g. 23203 for 2.32.3; throws CommError when unavailable
// A new unique id (128 bytes) for ncclCommInitRank. Needs NCCL and a GPU: throws CommError / CudaError
// saying which is missing (the NcclIdHolder catches that and stays usable for the shm backend). Makes no
// CUDA call (the GPU check looks at the driver's device files): the parent process of multiprocessing
// workers calls it, and a process that has initialised CUDA cannot fork workers that use the GPU.
std::string get_unique_id();

struct CommState;  // nccl.cpp: the NCCL handle, its lock, the streams and the watchdog
struct Event;      // nccl_common.h: a cudaEvent_t owned by whoever still needs it

// One enqueued operation. Returned by every Comm call; the caller decides how to wait for it.
class Work {
 public:
  Work(std::shared_ptr<CommState> state, std::string what, std::shared_ptr<Event> done, std::vector<Tensor> held);
  ~Work();  // order()s the compute stream if nobody did, so that released tensors are never reused too early
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  const std::string& what() const { return what_; }
  // Has the GPU finished it? Raises the communicator's CommError when it failed.
  bool completed();
  // Makes the compute stream wait for it (no host block) and releases the tensors. Idempotent. Raises the
  // communicator's CommError when it failed (its result would be garbage).
  void order();
  // Blocks the host until the GPU finished it, at most timeout_s seconds (GIL released by the binding).
  // On expiry: with abort_on_timeout (the communicator's own timeout) the communicator is aborted and the
  // CommError says so; without, a CommError says that this wait ended and the communicator stays usable.
  void synchronize(double timeout_s, bool abort_on_timeout, const std::function<void()>& interrupt_check = {});

 private:
  std::shared_ptr<CommState> state_;
  std::string what_;
  std::shared_ptr<Event> done_;
  std::vector<Tensor> held_;  // cleared once the compute stream waits for done_
  bool ordered_ = false;
};

class Comm {
 public:
  // Joins the communicator of `world_size` ranks named by `unique_id` (128 bytes) as `rank`, on cuda:`device`.
  // Returns once every rank has joined; CommError after timeout_s seconds otherwise. interrupt_check, when
  // given, is called about every 40 ms while a call polls; what it throws aborts the communicator and
  // propagates (the binding raises pending Python signals, so Ctrl-C works).
  Comm(const std::string& unique_id, int rank, int world_size, int device, double timeout_s,
       std::function<void()> interrupt_check = {});
  ~Comm();  // close(); never throws
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const;
  int world_size() const;
  int device() const;
  double timeout() const;
  void set_timeout(double seconds);
  std::string error() const;  // the CommError message once the communicator failed, else ""
  bool closed() const;

  // Tensors: contiguous, on cuda:device(), float16/32/64, int32/64; op: sum, avg, max, min, prod (avg only
  // for floating dtypes: NCCL's ncclAvg, which pre-divides floating values by the world size before summing).
  std::shared_ptr<Work> all_reduce(const Tensor& t, const std::string& op);                    // in place
  std::shared_ptr<Work> broadcast(const Tensor& t, int root);                                  // in place
  std::shared_ptr<Work> reduce(const Tensor& t, int root, const std::string& op);              // on root
  std::shared_ptr<Work> all_gather(const Tensor& out, const Tensor& in);                       // P * in
  std::shared_ptr<Work> reduce_scatter(const Tensor& out, const Tensor& in, const std::string& op);
  std::shared_ptr<Work> gather(const Tensor& out, const Tensor& in, int root);  // out: root only (else undefined)
  std::shared_ptr<Work> scatter(const Tensor& out, const Tensor& in, int root);  // in: root only (else undefined)
  std::shared_ptr<Work> send(const Tensor& t, int peer);
  std::shared_ptr<Work> recv(const Tensor& t, int peer);

  // Aborts the communicator (ncclCommAbort): this rank's work in flight ends, every later call raises
  // CommError with the reason. The other ranks cannot be told by NCCL: they fail at their timeout.
  void abort(const std::string& reason);
  // Flushes and releases the communicator (ncclCommFinalize, then ncclCommDestroy; ncclCommAbort when it
  // failed or finalize times out) and stops the watchdog. Later calls raise CommError. Idempotent.
  void close();

 private:
  std::shared_ptr<CommState> state_;
};

}  // namespace sl::cuda::nccl
