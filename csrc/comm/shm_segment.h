// The shared-memory segment behind ShmComm: its layout, how a rank creates or opens it (through one of the
// transports of shm_rendezvous.h), the shared abort state, and the process-liveness test used to notice
// dead peers.
//
// Layout (offsets from Layout::make; every region starts on a cache line, the data regions on a page):
//   Header                     magic, parameters, join counter, sync counter, abort state
//   RankInfo x P               per-rank state, pid, sync progress, last collective, argument descriptors
//   slot x P                   each rank's staging area for collectives (slot_bytes each, in two halves
//                              used by alternate chunks: see shm_collectives.cpp)
//   result                     one more slot: reduced chunks that every rank copies out (two halves too)
//   channel x P*(P-1)          one per ordered pair (src, dst) for send/recv: two halves, double-buffered
// Everything shared is either a lock-free std::atomic (constructed by the creator) or plain bytes whose
// hand-over is ordered by one of those atomics (release by the writer, acquire by the reader).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/shm_rendezvous.h"
#include "comm/wait.h"

namespace sl::comm {

constexpr uint64_t kMagic = 0x31304d4853534c53ULL;  // "SLSSHM01", written last by the creator
constexpr uint32_t kLayoutVersion = 1;
constexpr int kMaxWorldSize = 128;  // channels grow as P^2; a bigger single-host job should use MPI
constexpr size_t kMinSlotBytes = 8192;
constexpr size_t kMaxSlotBytes = size_t(1) << 30;
constexpr size_t kAbortReasonBytes = 1024;

// Collective kinds, as written into descriptors (0: none yet).
enum class OpKind : uint32_t {
  kNone = 0, kAllReduce, kBroadcast, kAllGather, kReduceScatter, kReduce, kGather, kScatter, kBarrier
};
const char* op_kind_name(OpKind kind);

// What one rank passed to a collective: compared across ranks after the collective's first sync.
struct OpDesc {
  uint32_t kind = 0;  // OpKind
  int32_t dtype = -1;
  int32_t root = -1;  // -1 where the collective has no root
  int32_t op = -1;    // CommOp, -1 where the collective does not reduce
  int64_t count = 0;  // the per-rank element count (see ShmComm::begin for which tensor)
};
inline bool operator==(const OpDesc& a, const OpDesc& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.root == b.root && a.op == b.op && a.count == b.count;
}

enum RankState : uint32_t { kEmpty = 0, kJoining = 1, kJoined = 2, kLeft = 3 };

struct alignas(128) RankInfo {
  std::atomic<uint32_t> state{kEmpty};
  std::atomic<int32_t> pid{0};
  std::atomic<uint64_t> start_time{0};  // /proc/<pid>/stat start time: tells a reused pid apart
  std::atomic<uint64_t> pid_ns{0};      // pid namespace inode: a pid means something only inside it
  std::atomic<uint64_t> arrived{0};     // synchronisation points this rank has reached
  std::atomic<uint64_t> entered_seq{0};  // last collective entered (numbered from 1), for diagnostics
  std::atomic<uint32_t> entered_kind{0};
  // Indexed by the parity of the collective's sequence number: a fast rank writes the next call's
  // descriptor while a slow one may still be comparing this call's.
  OpDesc desc[2];
};

struct Header {
  std::atomic<uint64_t> magic{0};
  uint32_t version = kLayoutVersion;
  int32_t world_size = 0;
  uint64_t slot_bytes = 0;
  uint64_t chan_bytes = 0;
  uint64_t total_bytes = 0;

  alignas(64) std::atomic<uint32_t> joined{0};  // ranks that have joined
  Doorbell join_bell;
  alignas(64) std::atomic<uint32_t> arrivals{0};  // total sync arrivals of all ranks, modulo 2^32
  Doorbell sync_bell;
  alignas(64) std::atomic<uint32_t> abort_state{0};  // 0 running, 1 an aborter is writing, 2 aborted
  std::atomic<int32_t> abort_rank{-1};
  char abort_reason[kAbortReasonBytes] = {};
};

// One per ordered pair of ranks. The counters count chunks; the doorbells only signal.
struct alignas(64) ChannelHeader {
  std::atomic<uint32_t> sent{0};  // written by the sender only
  Doorbell data_bell;             // rung after `sent` moves
  alignas(64) std::atomic<uint32_t> consumed{0};  // written by the receiver only
  Doorbell space_bell;                            // rung after `consumed` moves
};

// Precedes the payload in each channel half.
struct alignas(64) ChunkHeader {
  int64_t tag;
  int64_t total_bytes;  // of the whole message
  int64_t offset;       // of this chunk in the message
  int64_t bytes;        // of this chunk
  int64_t count;        // elements of the whole message
  int32_t dtype;
};

struct Layout {
  int world_size = 0;
  size_t slot_bytes = 0;   // rounded up to two pages
  size_t half_bytes() const { return slot_bytes / 2; }
  size_t chan_bytes = 0;   // per channel, a power of two
  size_t chan_half = 0;    // bytes per half (chunk header + payload)
  size_t ranks_off = 0, slots_off = 0, result_off = 0, chans_off = 0, total = 0;
  // Checks the parameters (ValueError naming `op`) and computes the offsets.
  static Layout make(int world_size, size_t slot_bytes, const char* op);
  size_t chan_payload() const { return chan_half - sizeof(ChunkHeader); }
};

// A mapping of the segment. Move-only; unmaps on destruction.
class Segment {
 public:
  Segment() = default;
  Segment(Segment&& o) noexcept { *this = std::move(o); }
  Segment& operator=(Segment&& o) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment() { unmap(); }

  // Creates the segment (space reserved up front, mode 0600) and initialises its header, or maps the one
  // another rank created, through `transport` (shm_rendezvous.h): memfd: the first rank to claim the
  // rendezvous of `name` creates it and serves it until release_name(); named: shm_open O_CREAT|O_EXCL,
  // and an opener waits until the creator has initialised it.
  // Throws CommError on failure or when `deadline` passes; ValueError when the parameters differ from
  // the creator's. A creator that fails removes the name (or closes the rendezvous) again. A segment is
  // joined only when it belongs to this process's effective uid and has mode 0600 (CommError naming it
  // otherwise); under memfd its server must run as this uid too. interrupt_check (may be empty) runs about
  // every 40 ms while waiting for another rank.
  static Segment attach(const std::string& name, const Layout& layout, Clock::time_point deadline,
                        Transport transport, const std::function<void()>& interrupt_check);

  bool mapped() const { return base_ != nullptr; }
  bool created() const { return created_; }
  Transport transport() const { return transport_; }
  const Layout& layout() const { return layout_; }
  // Ends the rendezvous: the name is not needed once every rank has mapped the segment. named: unlinks it
  // (any rank may); memfd: the creator stops serving and closes the socket (a no-op on other ranks).
  void release_name() noexcept;
  void unmap() noexcept;

  Header& header() const { return *reinterpret_cast<Header*>(base_); }
  RankInfo& rank(int q) const { return reinterpret_cast<RankInfo*>(base_ + layout_.ranks_off)[q]; }
  // Half h (0 or 1) of rank q's slot, and of the result area.
  char* slot(int q, uint32_t h) const {
    return base_ + layout_.slots_off + size_t(q) * layout_.slot_bytes + size_t(h & 1u) * layout_.half_bytes();
  }
  char* result(uint32_t h) const { return base_ + layout_.result_off + size_t(h & 1u) * layout_.half_bytes(); }
  ChannelHeader& channel(int src, int dst) const { return *reinterpret_cast<ChannelHeader*>(channel_base(src, dst)); }
  // Half `h` (0 or 1) of channel src -> dst: a ChunkHeader followed by chan_payload() bytes.
  char* channel_half(int src, int dst, uint32_t h) const {
    return channel_base(src, dst) + sizeof(ChannelHeader) + size_t(h & 1u) * layout_.chan_half;
  }

  // Rings every doorbell in the segment, so that every sleeping rank re-checks its condition.
  void wake_all() const;

 private:
  char* channel_base(int src, int dst) const {
    const int P = layout_.world_size;
    const size_t index = size_t(src) * size_t(P - 1) + size_t(dst < src ? dst : dst - 1);
    return base_ + layout_.chans_off + index * layout_.chan_bytes;
  }

  static Segment attach_named(const std::string& name, const Layout& layout, Clock::time_point deadline);
  static Segment attach_memfd(const std::string& name, const Layout& layout, Clock::time_point deadline,
                              const std::function<void()>& interrupt_check);

  char* base_ = nullptr;
  Layout layout_;
  bool created_ = false;
  Transport transport_ = Transport::kNamed;
  std::string name_;
  std::unique_ptr<SegmentServer> server_;  // memfd, on the creator, until release_name()
};

// Segment names: '/' followed by 1..199 characters, none of them '/' or NUL. ValueError otherwise.
void validate_name(const std::string& name, const char* op);
// shm_unlink; a name that does not exist is fine. CommError on other failures.
void unlink_name(const std::string& name);

// ---------------------------------------------------------------- shared abort state
// Records the first abort (later ones keep the first reason); returns whether this call was first.
bool set_abort(Header& h, int rank, const std::string& reason);
// Whether the job was aborted; if so, fills the aborting rank and its reason.
bool read_abort(const Header& h, int* rank, std::string* reason);

// ---------------------------------------------------------------- liveness of peer processes
struct ProcessId {
  int32_t pid = 0;
  uint64_t start_time = 0;
  uint64_t pid_ns = 0;
};
ProcessId self_process();
enum class Liveness { kAlive, kDead, kUnknown };
// kDead when the process is gone, a zombie, or its pid now names another process; kUnknown when it is
// in another pid namespace (its pid cannot be looked up from here).
Liveness process_liveness(const ProcessId& peer, const ProcessId& self);

}  // namespace sl::comm
