// NCCL's single-process multi-device communicator: one process drives several GPUs, one NCCL communicator
// (rank) per GPU, all created and used from one thread (singa_lite.multi_device's all_reduce, as in MXNet's multi-GPU tutorial).
//
// Creation (why this order): NCCL's rule for one thread managing several devices is a group: ncclGetUniqueId
// once, then ncclGroupStart, for every device i (with that device current, since NCCL binds a communicator
// to the current device) ncclCommInitRankConfig(rank i of n), then ncclGroupEnd. Without the group the first
// init would wait for the other ranks, which this same thread has not created yet. The communicators are
// non-blocking (nccl_common.h), so the group returns at once and the clique polls every communicator's
// ncclCommGetAsyncError until none is still in progress, up to the timeout.
//
// Collectives: all_reduce and broadcast take one tensor per device, in the clique's device order, and issue
// one NCCL call per device inside one group (again: NCCL needs every rank's call before any can progress).
// Each call runs on its device's COMPUTE stream (cuda/context.h), not on a separate communication stream as
// Comm does: the tensors were written by kernels on that stream and later kernels, copies to the host and
// the caching allocator's reuse of freed blocks are all ordered on it, so the result is ordered for every
// later use without events, and a tensor freed right after the call is not reused before NCCL is done with
// it. Calls return once NCCL has queued the work (the host does not wait for the GPU); synchronize() waits.
//
// Nothing hangs forever: every wait (init, a group's completion, synchronize, close) has a deadline and checks
// the interrupt callback about every 40 ms (the binding raises pending Python signals, so Ctrl-C works). A
// failure, a timeout or an interrupt in the middle of an NCCL call aborts every communicator of the clique
// (ncclCommAbort; a half-issued group cannot be completed or cancelled) and every later call raises CommError
// naming the call, the device and the cause. Arguments are checked before any NCCL call: a wrong argument
// raises ValueError / TypeError and leaves the clique usable.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace sl::cuda::nccl {

struct CliqueState;  // nccl_clique.cpp: the communicators, their lock, the events and the error

class Clique {
 public:
  // One communicator per device of `devices` (distinct CUDA device ordinals; rank i on devices[i]). Returns
  // once all are initialised; CommError after timeout_s seconds, ValueError for a bad or repeated device.
  Clique(const std::vector<int>& devices, double timeout_s, std::function<void()> interrupt_check = {});
  ~Clique();  // close(); never throws
  Clique(const Clique&) = delete;
  Clique& operator=(const Clique&) = delete;

  const std::vector<int>& devices() const;
  int size() const;
  double timeout() const;
  void set_timeout(double seconds);
  std::string error() const;  // the CommError message once the clique failed, else ""
  bool closed() const;

  // tensors[i]: on cuda:devices()[i], contiguous, all of one shape and dtype (float16/32/64, int32/64).
  // In place: every tensor becomes the reduction (op: sum, avg, max, min, prod; avg for floating dtypes only).
  void all_reduce(const std::vector<Tensor>& tensors, const std::string& op);
  // In place: every tensor becomes a copy of tensors[root].
  void broadcast(const std::vector<Tensor>& tensors, int root);
  // Blocks the host until every device has finished the clique's last operation, at most timeout_s seconds;
  // after that the clique is aborted (its NCCL kernels end, so the streams drain) and CommError raised.
  void synchronize(double timeout_s);
  // Aborts every communicator; later calls raise CommError with the reason. Idempotent.
  void abort(const std::string& reason);
  // ncclCommFinalize on every communicator (polled together, up to the timeout), then ncclCommDestroy;
  // ncclCommAbort when that fails. Later calls raise CommError. Idempotent.
  void close();

 private:
  std::shared_ptr<CliqueState> state_;
};

}  // namespace sl::cuda::nccl
