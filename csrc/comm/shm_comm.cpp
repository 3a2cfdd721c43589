// ShmComm's life cycle and synchronisation: rendezvous, close and abort, the wait with failure
// detection, and the per-call descriptor check. The collectives themselves are in shm_collectives.cpp,
// send / recv in shm_p2p.cpp.
#include "comm/shm_comm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <thread>

#include "comm/mismatch.h"
#include "core/errors.h"

namespace sl::comm {

namespace {

constexpr auto kLookEvery = std::chrono::milliseconds(40);  // how often a waiter reads /proc for its peers

std::string ranks_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::string describe_desc(const OpDesc& d) {
  const OpKind kind = OpKind(d.kind);
  if (kind == OpKind::kBarrier || kind == OpKind::kNone) return op_kind_name(kind);
  std::string s = str(op_kind_name(kind), " of ", d.count, " ", dtype_name(DType(d.dtype)), " elements");
  if (d.root >= 0) s += str(" with root ", d.root);
  if (d.op >= 0) s += str(d.root >= 0 ? " and" : " with", " op '", comm_op_name(CommOp(d.op)), "'");
  return s;
}

}  // namespace

std::string Activity::str() const {
  if (peer >= 0)
    return sl::str(op, " #", number, std::string(op) == "send" ? " to rank " : " from rank ", peer, " (tag ", tag, ")");
  if (number > 0) return sl::str(op, " #", number);
  return op;
}

// ---------------------------------------------------------------- life cycle

ShmComm::ShmComm(const std::string& name, int rank, int world_size, double timeout_s, size_t slot_bytes,
                 std::function<void()> interrupt_check)
    : name_(name), rank_(rank), P_(world_size), interrupt_check_(std::move(interrupt_check)) {
  validate_name(name, "ShmComm");
  const Layout layout = Layout::make(world_size, slot_bytes, "ShmComm");
  SL_CHECK(rank >= 0 && rank < world_size, ValueError, "ShmComm: rank must be in [0, ", world_size, "), got ", rank);
  set_timeout(timeout_s);
  in_call_spin_ns_ = in_call_spin_from_env();
  transport_ = default_transport();
  self_ = self_process();
  owner_pid_ = self_.pid;
  sends_to_.assign(size_t(P_), 0);
  recvs_from_.assign(size_t(P_), 0);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  seg_ = Segment::attach(name, layout, deadline, transport_, interrupt_check_);
  try {
    join(deadline);
  } catch (...) {
    // A creator whose rendezvous failed removes the name (closes the socket), so that nobody joins a failed
    // job and the segment vanishes with its last mapping.
    if (seg_.created()) seg_.release_name();
    seg_.unmap();
    throw;
  }
}

void ShmComm::join(Clock::time_point deadline) {
  Header& h = seg_.header();
  int by = -1;
  std::string reason;
  if (read_abort(h, &by, &reason))
    throw CommError(str("ShmComm: segment '", name_, "' belongs to a job that rank ", by, " aborted: ", reason,
                        "; fix: give every job a fresh segment name"));
  RankInfo& me = seg_.rank(rank_);
  uint32_t expected = kEmpty;
  if (!me.state.compare_exchange_strong(expected, kJoining, std::memory_order_acq_rel))
    throw CommError(str("ShmComm: rank ", rank_, " has already joined segment '", name_, "' (",
                        describe_rank(rank_), "): two processes were given the same rank, or the name belongs to "
                        "an earlier job; fix: give every process its own rank and every job a fresh name (or "
                        "remove the old one with singa_lite._core.shm_unlink('", name_, "'))"));
  me.pid.store(self_.pid, std::memory_order_relaxed);
  me.start_time.store(self_.start_time, std::memory_order_relaxed);
  me.pid_ns.store(self_.pid_ns, std::memory_order_relaxed);
  me.state.store(kJoined, std::memory_order_release);
  bool last = false;
  try {
    last = h.joined.fetch_add(1, std::memory_order_acq_rel) + 1 == uint32_t(P_);
    if (last) {
      ring(h.join_bell);
    } else {
      auto ready = [&h, this] { return h.joined.load(std::memory_order_acquire) >= uint32_t(P_); };
      wait(Activity{"rendezvous"}, h.join_bell, ReadyRef(ready), WaitFor::kJoin, -1, deadline);
    }
  } catch (...) {
    me.state.store(kLeft, std::memory_order_release);
    seg_.wake_all();
    throw;
  }
  // Every rank has mapped the segment: the name is not needed any more. A named segment's name is unlinked
  // by the last rank to join (the first to know, so that no rank waits for another to clean up); the
  // memfd transport's socket can only be closed by its creator, which has waited for everyone anyway.
  // From here on nothing of the job has a name: the memory is freed when the last process unmaps or dies.
  if (seg_.transport() == Transport::kNamed ? last : seg_.created()) seg_.release_name();
}

ShmComm::~ShmComm() {
  try {
    close();
  } catch (...) {
    // A destructor must not throw; close() only fails on a broken mutex.
  }
}

void ShmComm::close() {
  std::lock_guard<std::mutex> op_lock(op_mutex_);  // let a call in flight finish (it has a timeout)
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (closed_) return;
  closed_ = true;
  if (!seg_.mapped()) return;
  int by = -1;
  std::string reason;
  if (read_abort(seg_.header(), &by, &reason)) closed_abort_reason_ = str("rank ", by, ": ", reason);
  // A child forked from this process shares the mapping but is not this rank: it must not retire it.
  if (getpid() == owner_pid_) {
    seg_.rank(rank_).state.store(kLeft, std::memory_order_release);
    seg_.wake_all();  // anyone waiting for this rank now fails fast instead of timing out
  }
  seg_.unmap();
}

bool ShmComm::closed() const {
  std::lock_guard<std::mutex> lock(state_mutex_);
  return closed_;
}

void ShmComm::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (closed_ || !seg_.mapped()) return;
  set_abort(seg_.header(), rank_, reason.empty() ? "aborted" : reason);
  seg_.wake_all();
}

bool ShmComm::aborted() const { return !abort_reason().empty(); }

std::string ShmComm::abort_reason() const {
  std::lock_guard<std::mutex> lock(state_mutex_);
  if (closed_ || !seg_.mapped()) return closed_abort_reason_;
  int by = -1;
  std::string reason;
  return read_abort(seg_.header(), &by, &reason) ? str("rank ", by, ": ", reason) : std::string();
}

void ShmComm::set_timeout(double seconds) {
  SL_CHECK(std::isfinite(seconds) && seconds > 0 && seconds <= 1e7, ValueError,
           "ShmComm: timeout must be a positive number of seconds (at most 1e7), got ", seconds);
  timeout_s_.store(seconds, std::memory_order_relaxed);
}

void shm_unlink_name(const std::string& name) { unlink_name(name); }

// ---------------------------------------------------------------- failing

void ShmComm::check_usable(const char* op) const {
  SL_CHECK(!closed_, CommError, op, ": the communicator is closed; create a new ShmComm");
  if (seg_.header().abort_state.load(std::memory_order_acquire) != 0) throw_aborted(Activity{op});
}

void ShmComm::throw_aborted(const Activity& what) const {
  int by = -1;
  std::string reason;
  read_abort(seg_.header(), &by, &reason);
  if (by == rank_) throw CommError(str(what.str(), ": this rank (", by, ") aborted the job: ", reason));
  throw CommError(str(what.str(), ": the job was aborted by rank ", by, ": ", reason));
}

void ShmComm::fail(const Activity& what, const std::string& reason, const std::string& fix) {
  // Others read the reason as "aborted by rank <this rank>: <reason> (during <what>)".
  set_abort(seg_.header(), rank_, str(reason, " (rank ", rank_, " noticed during ", what.str(), ")"));
  seg_.wake_all();
  throw CommError(str(what.str(), ": ", reason, fix.empty() ? "" : "; fix: ", fix));
}

std::string ShmComm::describe_rank(int q) const {
  const RankInfo& ri = seg_.rank(q);
  const int32_t pid = ri.pid.load(std::memory_order_relaxed);
  return pid > 0 ? str("rank ", q, " (pid ", pid, ")") : str("rank ", q);
}

std::string ShmComm::describe_laggard(int q) const {
  const RankInfo& ri = seg_.rank(q);
  const uint64_t entered = ri.entered_seq.load(std::memory_order_relaxed);
  const char* kind = op_kind_name(OpKind(ri.entered_kind.load(std::memory_order_relaxed)));
  if (entered == 0) return str(describe_rank(q), ", which has not called any collective yet");
  if (entered < seq_)
    return str(describe_rank(q), ", which has not called it (its last collective was #", entered, " ", kind, ")");
  return str(describe_rank(q), ", which is inside #", entered, " ", kind, " but behind this rank");
}

std::string ShmComm::transport_hint() const {
  // Ranks that use different transports never meet: say so when the other transport's trace is there.
  if (transport_ == Transport::kMemfd) {
    const int fd = shm_open(name_.c_str(), O_RDONLY, 0);
    if (fd >= 0) {
      ::close(fd);
      return str("; a segment of this name exists in /dev/shm: some ranks use ", kTransportVar,
                 "=named, this one memfd; every rank must use the same transport");
    }
    return str("; ranks in another network namespace (a container) cannot reach this rendezvous, which is an "
               "abstract socket: there, set ", kTransportVar, "=named on every rank");
  }
  if (rendezvous_listening(name_))
    return str("; another rank serves this name over the memfd transport while this one uses ", kTransportVar,
               "=named; every rank must use the same transport");
  return "";
}

// ---------------------------------------------------------------- waiting

std::vector<int> ShmComm::awaited(WaitFor kind, int peer) const {
  std::vector<int> out;
  if (kind == WaitFor::kPeer) {
    out.push_back(peer);
  } else if (kind == WaitFor::kSync) {
    for (int q = 0; q < P_; ++q)
      if (q != rank_ && seg_.rank(q).arrived.load(std::memory_order_acquire) < syncs_) out.push_back(q);
  } else {  // kJoin: the ranks already in, which may die or give up while we wait for the rest
    for (int q = 0; q < P_; ++q)
      if (q != rank_ && seg_.rank(q).state.load(std::memory_order_acquire) >= kJoined) out.push_back(q);
  }
  return out;
}

bool ShmComm::find_gone_peer(const std::vector<int>& peers, bool look_at_processes, std::string* reason,
                             std::string* fix) const {
  for (int q : peers) {
    const RankInfo& ri = seg_.rank(q);
    const uint32_t state = ri.state.load(std::memory_order_acquire);
    if (state == kLeft) {
      *reason = str(describe_rank(q), " left (it exited or closed its communicator) while this rank is inside "
                    "this collective");
      *fix = str("if rank ", q, " ended normally (exit code 0), it made fewer collective calls than this rank: "
                 "the number of steps probably differed (uneven data per rank?); give every rank the same number "
                 "of batches, or train inside `with dist_opt.join():`; otherwise look at rank ", q, "'s output");
      return true;
    }
    if (look_at_processes && state == kJoined) {
      const ProcessId id{ri.pid.load(std::memory_order_relaxed), ri.start_time.load(std::memory_order_relaxed),
                         ri.pid_ns.load(std::memory_order_relaxed)};
      if (process_liveness(id, self_) == Liveness::kDead) {
        *reason = str(describe_rank(q), " died");
        *fix = str("look at rank ", q, "'s output and exit status (an exception, a crash, a kill, the "
                   "out-of-memory killer?)");
        return true;
      }
    }
  }
  return false;
}

std::string ShmComm::timeout_reason(const Activity& what, WaitFor kind, int peer, std::string* fix) const {
  const std::string after = str("timed out after ", timeout(), " s");
  const std::string raise = "if it is only slow, raise the timeout (ShmComm.timeout)";
  if (kind == WaitFor::kJoin) {
    std::vector<int> missing;
    for (int q = 0; q < P_; ++q)
      if (seg_.rank(q).state.load(std::memory_order_acquire) < kJoined) missing.push_back(q);
    *fix = str("start all ", P_, " processes with the same segment name '", name_, "' and world size; look at the "
               "output of ", ranks_list(missing), "; ", raise, transport_hint());
    return str(after, ": ", ranks_list(missing), " of ", P_, " did not join segment '", name_, "'");
  }
  if (kind == WaitFor::kPeer) {
    const bool sending = std::string(what.op) == "send";
    *fix = str("check that rank ", peer, (sending ? " calls recv(src=" : " calls send(dst="), rank_, ", tag=", what.tag,
               "); ", raise);
    return str(after, ": ", describe_rank(peer),
               (sending ? " did not receive (the channel to it is full)" : " sent nothing"));
  }
  std::vector<int> late = awaited(kind, peer);
  std::string who;
  for (int q : late) who += (who.empty() ? "" : "; ") + describe_laggard(q);
  *fix = str("look at the output of ", ranks_list(late), " for an error, a hang or a missing ", what.op, " call; ",
             raise);
  return str(after, " waiting for ", who);
}

void ShmComm::wait(const Activity& what, Doorbell& bell, ReadyRef ready, WaitFor kind, int peer,
                   Clock::time_point deadline) {
  const auto start = Clock::now();
  if (deadline == Clock::time_point::max())
    deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout()));
  auto last_look = start;
  const Header& h = seg_.header();
  auto idle = [&] {
    if (h.abort_state.load(std::memory_order_acquire) != 0 && !ready()) throw_aborted(what);
    const auto now = Clock::now();
    const bool look = now - last_look >= kLookEvery;
    if (look) last_look = now;
    if (look && interrupt_check_) {
      try {
        interrupt_check_();
      } catch (...) {
        // This rank gives up in the middle of a call: the others must not wait for it.
        set_abort(seg_.header(), rank_, str("rank ", rank_, " was interrupted (a signal such as Ctrl-C) during ",
                                            what.str()));
        seg_.wake_all();
        throw;
      }
    }
    std::string reason, fix;
    // The peer may have arrived (or sent) and then left or died since ready() was last false: ask again.
    if (find_gone_peer(awaited(kind, peer), look, &reason, &fix) && !ready()) fail(what, reason, fix);
  };
  if (wait_until(bell, ready, idle, deadline)) return;
  std::string fix;
  const std::string reason = timeout_reason(what, kind, peer, &fix);
  fail(what, reason, fix);
}

// ---------------------------------------------------------------- collective plumbing

ShmComm::Op ShmComm::begin(OpKind kind, int32_t dtype, int64_t count, int32_t root, int32_t op) {
  check_usable(op_kind_name(kind));
  ++seq_;
  RankInfo& me = seg_.rank(rank_);
  OpDesc& d = me.desc[seq_ & 1];
  d.kind = uint32_t(kind);
  d.dtype = dtype;
  d.count = count;
  d.root = root;
  d.op = op;
  me.entered_seq.store(seq_, std::memory_order_relaxed);
  me.entered_kind.store(uint32_t(kind), std::memory_order_relaxed);
  return Op{Activity{op_kind_name(kind), seq_}};
}

// A sync after the first of a call waits for peers that are inside the same call, each a chunk's copies and
// adds away (tens of microseconds for a half slot), and wait.h's 5 us spin may put this rank to sleep there,
// where the futex wake-up costs more than the wait. SINGA_LITE_SHM_SPIN_US=N (1 to 100000) makes those syncs
// poll up to N microseconds first, yielding the core between polls after the first 5 us (where ranks outnumber
// cores the peer may need it). Off by default: on a loaded 2-core host the polling cost CPU time that the
// DistOpt step could not spare and gained nothing measurable (docs/benchmarks/distopt.md, "Against the
// communication-free floor"); it is there to measure on hosts with idle cores. The first sync of a call keeps
// the short spin either way: a peer may still be far from the call.
// The environment value, in nanoseconds (0: off), checked once per communicator.
int64_t ShmComm::in_call_spin_from_env() {
  const char* v = std::getenv("SINGA_LITE_SHM_SPIN_US");
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long long us = std::strtoll(v, &end, 10);
  SL_CHECK(*end == '\0' && us >= 0 && us <= 100'000, ValueError, "SINGA_LITE_SHM_SPIN_US must be a whole number of "
           "microseconds from 0 to 100000 (how long a rank polls for its peers inside a collective before it "
           "sleeps; 0 or unset: not at all), got '", v, "'");
  return int64_t(us) * 1000;
}

template <typename Ready>
bool ShmComm::spin_in_call(Ready& ready) {
  if (in_call_spin_ns_ <= 0) return false;
  const auto start = Clock::now();
  for (int i = 1;; ++i) {
    cpu_relax();
    if (ready()) return true;
    if ((i & 63) == 0) {
      const auto waited = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
      if (waited >= in_call_spin_ns_) return false;
      if (waited >= kSpinNs) std::this_thread::yield();
    }
  }
}

void ShmComm::sync(Op& op) {
  ++syncs_;
  Header& h = seg_.header();
  // Per-rank progress first (read by waiters to name laggards), then the shared count. The release on
  // the count publishes everything this rank wrote before (its descriptor, its slot).
  seg_.rank(rank_).arrived.store(syncs_, std::memory_order_release);
  const uint32_t target = uint32_t(syncs_ * uint64_t(P_));  // all ranks have arrived when the count gets here
  const uint32_t prev = h.arrivals.fetch_add(1, std::memory_order_acq_rel);
  if (prev + 1 == target) {
    ring(h.sync_bell);  // the last to arrive wakes the sleepers
  } else {
    // Modular comparison: the count wraps at 2^32, and no rank is ever more than one sync ahead.
    auto ready = [&h, target] { return int32_t(h.arrivals.load(std::memory_order_acquire) - target) >= 0; };
    if (!op.checked || !spin_in_call(ready)) wait(op.what, h.sync_bell, ReadyRef(ready), WaitFor::kSync);
  }
  if (!op.checked) {
    op.checked = true;
    check_descriptors(op);
  }
}

void ShmComm::finish(Op& op) {
  if (op.checked) return;
  next_half();  // a chunk without data, so that every rank's chunk count stays the same
  sync(op);
}

void ShmComm::check_descriptors(const Op& op) const {
  const int parity = int(op.what.number & 1);
  const OpDesc& d0 = seg_.rank(0).desc[parity];
  std::string diffs;
  for (int q = 1; q < P_; ++q) {
    const OpDesc& d = seg_.rank(q).desc[parity];
    if (!(d == d0)) diffs += str(diffs.empty() ? "" : ", ", "rank ", q, " passed ", describe_desc(d));
  }
  if (diffs.empty()) return;
  // Every rank reads the same descriptors, so every rank throws this same error and stays in step.
  throw CollectiveMismatch(str(op.what.op, ": arguments differ across ranks (collective #", op.what.number, "): ", diffs,
                       ", but rank 0 passed ", describe_desc(d0),
                       "; every rank must make the same collective call with the same dtype, element count, "
                       "root and op"));
}

}  // namespace sl::comm
