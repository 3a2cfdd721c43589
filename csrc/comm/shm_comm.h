// ShmComm: collectives and point-to-point messages among the processes of one host, through one POSIX
// shared-memory segment (the `shm` backend of singa_lite.dist).
//
// Contract:
// - Every rank constructs it with the same name, world size and slot size; the first one creates the
//   segment (mode 0600), the others map it, through one transport (shm_rendezvous.h): memfd (Linux's
//   default) never gives the memory a name, and the name only identifies a rendezvous socket that the
//   creator closes once every rank has joined; named puts it in /dev/shm until the last rank to join
//   unlinks it. Either way the memory goes away by itself when the last process exits or dies. A failed
//   rendezvous names the ranks that did not join, and its creator removes the name (closes the socket).
// - Tensors are CPU, contiguous, of dtype float16/float32/float64/int32/int64. Arguments are checked
//   locally first (ValueError / TypeError, nothing shared is touched); then, after the collective's first
//   synchronisation, every rank compares what all ranks passed (kind, dtype, element count, root, op):
//   if any differ, every rank raises the same CollectiveMismatch (comm/mismatch.h, a ValueError) naming the
//   ranks, no data is exchanged, and the communicator stays usable.
// - Results are bitwise identical on every rank: each element is reduced once, over ranks 0..P-1 in
//   that order (see shm_reduce.h).
// - Nothing blocks forever: every wait ends after timeout() seconds; a peer that dies, or that closes its
//   communicator while others wait for it, is noticed within about 0.1 s. Any of these, and abort(),
//   mark the whole job aborted: every rank's current or next call raises CommError with the reason,
//   and so does every later call.
// - send returns once the message is in the channel: it blocks only while the channel is full, i.e.
//   for messages above the channel's capacity (about 256 KiB up to 8 ranks, 64 KiB at 16), which then
//   need the matching recv to be running. A message whose tag, dtype or size differs from what recv
//   expects stays queued, and recv raises ValueError naming both.
// - Calls from several threads are serialised; abort() may be called from any thread at any time.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "comm/shm_reduce.h"
#include "comm/shm_segment.h"
#include "core/tensor.h"

namespace sl::comm {

// What a rank is doing, for error messages; turned into text only when something fails.
struct Activity {
  const char* op;       // "all_reduce", "send", "rendezvous", ...
  uint64_t number = 0;  // collective sequence number, or message number to / from `peer`
  int peer = -1;        // send / recv: the other rank
  int64_t tag = 0;
  std::string str() const;  // "all_reduce #3", "send #2 to rank 1 (tag 7)", ...
};

// A borrowed reference to a `bool()` callable (no allocation, unlike std::function).
class ReadyRef {
 public:
  template <typename F>
  ReadyRef(F& f) : obj_(&f), call_([](void* o) { return bool((*static_cast<F*>(o))()); }) {}
  bool operator()() const { return call_(obj_); }

 private:
  void* obj_;
  bool (*call_)(void*);
};

class ShmComm {
 public:
  // Rendezvous (blocks until all world_size ranks have joined or timeout_s passes).
  // interrupt_check, when given, is called about every 40 ms while a call waits; whatever it throws
  // aborts the job and propagates (the binding raises pending Python signals, so Ctrl-C works).
  ShmComm(const std::string& name, int rank, int world_size, double timeout_s, size_t slot_bytes,
          std::function<void()> interrupt_check = {});
  ~ShmComm();  // close(); never throws
  ShmComm(const ShmComm&) = delete;
  ShmComm& operator=(const ShmComm&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return P_; }
  const std::string& name() const { return name_; }
  Transport transport() const { return transport_; }

  void all_reduce(const Tensor& t, CommOp op);                          // in place
  void broadcast(const Tensor& t, int root);                            // in place
  void all_gather(const Tensor& out, const Tensor& in);                 // out.numel() == P * in.numel()
  void reduce_scatter(const Tensor& out, const Tensor& in, CommOp op);  // in.numel() == P * out.numel()
  void reduce(const Tensor& t, int root, CommOp op);                    // result in t on root only
  void gather(const Tensor& out, const Tensor& in, int root);           // out used on root only
  void scatter(const Tensor& out, const Tensor& in, int root);          // in used on root only
  void barrier();
  void send(const Tensor& t, int dst, int64_t tag);
  void recv(const Tensor& t, int src, int64_t tag);  // in place

  // Marks the job failed with `reason` and wakes every waiting rank. A no-op on a closed communicator.
  void abort(const std::string& reason);
  bool aborted() const;
  std::string abort_reason() const;  // "rank R: reason", or "" while not aborted
  void set_timeout(double seconds);
  double timeout() const { return timeout_s_.load(std::memory_order_relaxed); }
  // Detaches (marks this rank as left and unmaps); later calls raise CommError. Idempotent.
  void close();
  bool closed() const;

 private:
  // One collective call in flight: created by begin(), passed to every sync().
  struct Op {
    Activity what;
    bool checked = false;  // descriptors compared (done at the first sync)
  };

  // ----- rendezvous (shm_comm.cpp)
  void join(Clock::time_point deadline);

  // ----- waiting and failing (shm_comm.cpp)
  // Who a wait depends on: the ranks that have not reached the current sync point, the ranks that have
  // joined so far (rendezvous), or one peer (send / recv).
  enum class WaitFor { kSync, kJoin, kPeer };
  // Waits (wait.h) until ready(). Meanwhile the ranks it depends on are checked for having died or
  // left; on that, on abort and on timeout the job is aborted and CommError thrown.
  // `deadline` defaults to now + timeout().
  void wait(const Activity& what, Doorbell& bell, ReadyRef ready, WaitFor kind, int peer = -1,
            Clock::time_point deadline = Clock::time_point::max());
  std::vector<int> awaited(WaitFor kind, int peer) const;
  // Finds a rank in `peers` that has left or (when look_at_processes) died; fills why and what to do.
  bool find_gone_peer(const std::vector<int>& peers, bool look_at_processes, std::string* reason,
                      std::string* fix) const;
  std::string timeout_reason(const Activity& what, WaitFor kind, int peer, std::string* fix) const;
  std::string transport_hint() const;  // for a rendezvous that timed out: "; ..." or ""
  // Aborts the job with `reason` and throws CommError "<what>: <reason>; fix: <fix>".
  [[noreturn]] void fail(const Activity& what, const std::string& reason, const std::string& fix);
  [[noreturn]] void throw_aborted(const Activity& what) const;
  std::string describe_rank(int q) const;     // "rank 2 (pid 4242)"
  std::string describe_laggard(int q) const;  // ... and which collective it entered last
  void check_usable(const char* op) const;    // closed / aborted -> CommError

  // ----- collective plumbing (shm_comm.cpp)
  // Publishes this rank's descriptor of the call: dtype -1 / root -1 / op -1 where not applicable.
  Op begin(OpKind kind, int32_t dtype, int64_t count, int32_t root, int32_t op);
  void sync(Op& op);    // every rank arrives, then the first sync of a call compares descriptors
  // Polls ready() (yielding the core between polls) up to in_call_spin_ns_ (SINGA_LITE_SHM_SPIN_US; 0: returns
  // false at once); whether it became true (shm_comm.cpp).
  template <typename Ready>
  bool spin_in_call(Ready& ready);
  static int64_t in_call_spin_from_env();
  int64_t in_call_spin_ns_ = 0;
  void finish(Op& op);  // a call that moved no data still synchronises once (the descriptor check)
  void check_descriptors(const Op& op) const;

  // ----- the data movement of each collective (shm_collectives.cpp)
  uint32_t next_half() { return uint32_t(++chunks_ & 1u); }
  // all_gather (root < 0) and gather: the same staging, different receivers.
  void gather_blocks(OpKind kind, const Tensor& out, const Tensor& in, int root);
  void all_reduce_impl(Op& op, char* data, int64_t n, DType dtype, CommOp cop, bool copy_out);

  Segment seg_;
  std::string name_;
  Transport transport_ = Transport::kMemfd;
  int rank_ = 0;
  int P_ = 1;
  std::atomic<double> timeout_s_{300.0};
  ProcessId self_;
  std::function<void()> interrupt_check_;
  int owner_pid_ = 0;       // the process that joined; a forked child must not mark the rank as left
  uint64_t seq_ = 0;        // collectives entered
  uint64_t syncs_ = 0;      // synchronisation points reached
  uint64_t chunks_ = 0;     // chunks staged: chunk k uses half k % 2 of every slot (shm_collectives.cpp)
  std::vector<uint64_t> sends_to_, recvs_from_;  // messages per peer, to number them in errors
  mutable std::mutex op_mutex_;     // one call at a time
  mutable std::mutex state_mutex_;  // close() against abort() and the properties
  bool closed_ = false;
  std::string closed_abort_reason_;  // abort_reason() as it was when closed
};

// Removes a segment name (the launcher's cleanup after a failed job); a missing name is fine.
void shm_unlink_name(const std::string& name);

}  // namespace sl::comm
