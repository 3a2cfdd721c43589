// Creating / opening the shared-memory segment, the abort state and peer liveness (see shm_segment.h).
#include "comm/shm_segment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>

#include "comm/shm_rendezvous.h"
#include "core/errors.h"

namespace sl::comm {

static_assert(sizeof(Header) <= 4096, "the header must fit the first page an opener maps");
static_assert(sizeof(ChunkHeader) == 64, "a chunk header is one cache line");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared atomics must be lock-free");

namespace {

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

std::string errno_str(int err) { return std::strerror(err); }

// Channel size: 256 KiB per channel for small jobs, shrinking so that all P*(P-1) channels together stay
// near 16 MiB, but never below 4 KiB.
size_t channel_bytes(int P) {
  if (P < 2) return 0;
  const size_t budget = size_t(16) << 20;
  size_t per = budget / (size_t(P) * size_t(P - 1));
  size_t pow2 = 4096;
  while (pow2 * 2 <= per && pow2 < (size_t(256) << 10)) pow2 *= 2;
  return pow2;
}

void sleep_us(int us) { std::this_thread::sleep_for(std::chrono::microseconds(us)); }

}  // namespace

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kNone: return "none";
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kReduce: return "reduce";
    case OpKind::kGather: return "gather";
    case OpKind::kScatter: return "scatter";
    case OpKind::kBarrier: return "barrier";
  }
  return "?";
}

Layout Layout::make(int P, size_t slot_bytes, const char* op) {
  SL_CHECK(P >= 1 && P <= kMaxWorldSize, ValueError, op, ": world_size must be in [1, ", kMaxWorldSize, "], got ", P,
           (P > kMaxWorldSize ? "; use the mpi backend for bigger jobs" : ""));
  SL_CHECK(slot_bytes >= kMinSlotBytes && slot_bytes <= kMaxSlotBytes, ValueError, op, ": slot_bytes must be in [",
           kMinSlotBytes, ", ", kMaxSlotBytes, "], got ", slot_bytes);
  Layout L;
  L.world_size = P;
  L.slot_bytes = round_up(slot_bytes, 8192);
  L.chan_bytes = channel_bytes(P);
  L.chan_half = L.chan_bytes ? (L.chan_bytes - sizeof(ChannelHeader)) / 2 / 64 * 64 : 0;
  L.ranks_off = round_up(sizeof(Header), 128);
  L.slots_off = round_up(L.ranks_off + size_t(P) * sizeof(RankInfo), 4096);
  L.result_off = L.slots_off + size_t(P) * L.slot_bytes;
  L.chans_off = L.result_off + L.slot_bytes;
  L.total = L.chans_off + size_t(P) * size_t(P - 1) * L.chan_bytes;
  return L;
}

// ---------------------------------------------------------------- Segment

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    unmap();
    base_ = o.base_;
    layout_ = o.layout_;
    created_ = o.created_;
    transport_ = o.transport_;
    name_ = std::move(o.name_);
    server_ = std::move(o.server_);
    o.base_ = nullptr;
  }
  return *this;
}

void Segment::unmap() noexcept {
  server_.reset();  // (normally stopped by release_name already)
  if (base_) munmap(base_, layout_.total);
  base_ = nullptr;
}

void Segment::release_name() noexcept {
  if (transport_ == Transport::kNamed) {
    if (!name_.empty()) shm_unlink(name_.c_str());
  } else if (server_) {
    server_->stop();
    server_.reset();
  }
}

namespace {

char* map_fd(int fd, size_t bytes, const std::string& name) {
  int flags = MAP_SHARED;
#ifdef MAP_POPULATE
  flags |= MAP_POPULATE;  // fault the pages in now rather than on the first collectives
#endif
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    throw CommError(str("ShmComm: mmap of shared-memory segment '", name, "' (", bytes, " bytes) failed: ",
                        errno_str(err), "; fix: lower slot_bytes or the number of ranks"));
  }
  return static_cast<char*>(p);
}

// The creator's half of attach(): reserve the space, map, construct the shared objects, publish.
char* create_segment(int fd, const std::string& name, const Layout& L) {
  // Reserve the memory now: tmpfs allocates lazily, and running out later would be a SIGBUS in the
  // middle of a collective instead of an error here. Some file systems lack fallocate: size it instead.
#ifdef __linux__
  int rc = posix_fallocate(fd, 0, off_t(L.total));
  if (rc == EINVAL || rc == EOPNOTSUPP) rc = ftruncate(fd, off_t(L.total)) == 0 ? 0 : errno;
#else
  int rc = ftruncate(fd, off_t(L.total)) == 0 ? 0 : errno;
#endif
  if (rc != 0)
    throw CommError(str("ShmComm: cannot reserve ", L.total, " bytes for shared-memory segment '", name,
                        "': ", errno_str(rc),
                        (rc == ENOSPC ? "; fix: free space in /dev/shm, enlarge it (docker run --shm-size=1g) "
                                        "or lower slot_bytes"
                                      : "")));
  char* base = map_fd(fd, L.total, name);
  auto* h = new (base) Header();
  h->world_size = L.world_size;
  h->slot_bytes = L.slot_bytes;
  h->chan_bytes = L.chan_bytes;
  h->total_bytes = L.total;
  for (int q = 0; q < L.world_size; ++q) new (base + L.ranks_off + size_t(q) * sizeof(RankInfo)) RankInfo();
  for (size_t c = 0; c < size_t(L.world_size) * size_t(L.world_size - 1); ++c)
    new (base + L.chans_off + c * L.chan_bytes) ChannelHeader();
  h->magic.store(kMagic, std::memory_order_release);  // openers may look at the rest from now on
  return base;
}

// The opener's half of attach(): wait for the creator to size and initialise the segment, then check
// that it was created with the same parameters before mapping all of it.
char* open_segment(int fd, const std::string& name, const Layout& L, Clock::time_point deadline) {
  for (;;) {
    struct stat st;
    if (fstat(fd, &st) != 0) {
      const int err = errno;
      throw CommError(str("ShmComm: fstat of shared-memory segment '", name, "' failed: ", errno_str(err)));
    }
    if (st.st_size >= 4096) {
      char* first = map_fd(fd, 4096, name);
      auto* h = reinterpret_cast<Header*>(first);
      while (h->magic.load(std::memory_order_acquire) != kMagic && Clock::now() < deadline) sleep_us(100);
      const bool ready = h->magic.load(std::memory_order_acquire) == kMagic;
      struct {
        uint32_t version;
        int32_t world_size;
        uint64_t slot_bytes, total_bytes;
      } const copy_params{h->version, h->world_size, h->slot_bytes, h->total_bytes};
      munmap(first, 4096);
      if (!ready) break;
      SL_CHECK(copy_params.version == kLayoutVersion, ValueError, "ShmComm: segment '", name,
               "' was created by another singa_lite version (layout ", copy_params.version, ", this one reads ",
               kLayoutVersion, "); run every rank with the same installation");
      SL_CHECK(copy_params.world_size == L.world_size && copy_params.slot_bytes == L.slot_bytes, ValueError,
               "ShmComm: segment '", name, "' was created for world_size ", copy_params.world_size,
               " and slot_bytes ", copy_params.slot_bytes, ", but this rank passed world_size ", L.world_size,
               " and slot_bytes ", L.slot_bytes, "; every rank must pass the same values");
      SL_ASSERT(copy_params.total_bytes == L.total && size_t(st.st_size) >= L.total);
      return map_fd(fd, L.total, name);
    }
    if (Clock::now() >= deadline) break;
    sleep_us(100);
  }
  throw CommError(str("ShmComm: shared-memory segment '", name, "' exists but its creator did not initialise it "
                      "before the timeout (did it die?); fix: remove it with singa_lite._core.shm_unlink('",
                      name, "') and use a fresh name"));
}

// A segment this rank did not create must be one that our own user created the way attach() does: owned by
// our effective uid, mode 0600. Anything else is someone else's name (or a name re-created by another user
// after our job unlinked it, readable and writable by all): joining it would hand them our data.
void check_owner(int fd, const std::string& name, bool named) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    throw CommError(str("ShmComm: fstat of shared-memory segment '", name, "' failed: ", errno_str(err)));
  }
  const unsigned mode = unsigned(st.st_mode) & 07777u;
  if (st.st_uid != geteuid() || mode != 0600u || !S_ISREG(st.st_mode)) {
    char octal[8];
    std::snprintf(octal, sizeof octal, "%04o", mode);
    throw CommError(str("ShmComm: refusing to join shared-memory segment '", name, "': it belongs to uid ",
                        st.st_uid, " with mode ", octal, ", but a segment of this job is created by uid ", geteuid(),
                        " with mode 0600; another user may have created it to join the job. Fix: give every job "
                        "a fresh name (a new NcclIdHolder)", named ? ", and remove this one if it is yours" : ""));
  }
}

}  // namespace

Segment Segment::attach(const std::string& name, const Layout& L, Clock::time_point deadline, Transport transport,
                        const std::function<void()>& interrupt_check) {
  Segment seg = transport == Transport::kMemfd ? attach_memfd(name, L, deadline, interrupt_check)
                                               : attach_named(name, L, deadline);
  seg.transport_ = transport;
  seg.name_ = name;
  return seg;
}

Segment Segment::attach_memfd(const std::string& name, const Layout& L, Clock::time_point deadline,
                              const std::function<void()>& interrupt_check) {
  Segment seg;
  seg.layout_ = L;
  const Claim c = claim(name, deadline, interrupt_check);
  if (c.listen_fd >= 0) {
    int fd = -1;
    try {
      fd = create_memfd(name);
      seg.base_ = create_segment(fd, name, L);
      seal_size(fd);
    } catch (...) {
      if (fd >= 0) close(fd);
      close(c.listen_fd);  // the others' connections end: they read end-of-file, and bind again
      throw;
    }
    seg.created_ = true;
    seg.server_ = std::make_unique<SegmentServer>(c.listen_fd, fd, name);  // owns both descriptors now
    return seg;
  }
  try {
    check_owner(c.segment_fd, name, false);
    seg.base_ = open_segment(c.segment_fd, name, L, deadline);
  } catch (...) {
    close(c.segment_fd);
    throw;
  }
  close(c.segment_fd);  // the mapping keeps the memory
  return seg;
}

Segment Segment::attach_named(const std::string& name, const Layout& L, Clock::time_point deadline) {
  Segment seg;
  seg.layout_ = L;
  for (;;) {
    int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) {
      // 0600 regardless of the umask: only this user's processes may join (or read the data).
      fchmod(fd, 0600);
      try {
        seg.base_ = create_segment(fd, name, L);
      } catch (...) {
        close(fd);
        shm_unlink(name.c_str());
        throw;
      }
      close(fd);  // the mapping keeps the memory
      seg.created_ = true;
      return seg;
    }
    int err = errno;
    if (err != EEXIST)
      throw CommError(str("ShmComm: shm_open('", name, "') failed: ", errno_str(err),
                          (err == EACCES ? "; the name exists and belongs to another user: pick another name" : "")));
    fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) {
      err = errno;
      // The creator unlinked it between our two calls (a failed rendezvous): try creating again.
      if (err == ENOENT && Clock::now() < deadline) continue;
      throw CommError(str("ShmComm: shm_open('", name, "') of an existing segment failed: ", errno_str(err),
                          (err == EACCES ? "; it belongs to another user: pick another name" : "")));
    }
    try {
      check_owner(fd, name, true);
      seg.base_ = open_segment(fd, name, L, deadline);
    } catch (...) {
      close(fd);
      throw;
    }
    close(fd);
    return seg;
  }
}

void Segment::wake_all() const {
  if (!base_) return;
  Header& h = header();
  ring(h.join_bell);
  ring(h.sync_bell);
  const int P = layout_.world_size;
  for (int s = 0; s < P; ++s)
    for (int d = 0; d < P; ++d)
      if (s != d) {
        ring(channel(s, d).data_bell);
        ring(channel(s, d).space_bell);
      }
}

void validate_name(const std::string& name, const char* op) {
  SL_CHECK(!name.empty() && name[0] == '/' && name.size() >= 2 && name.size() <= 200, ValueError, op,
           ": segment name must be '/' followed by 1 to 199 characters, got '", name, "'");
  SL_CHECK(name.find('/', 1) == std::string::npos && name.find('\0') == std::string::npos, ValueError, op,
           ": segment name may contain no '/' after the first character (nor NUL), got '", name, "'");
}

void unlink_name(const std::string& name) {
  validate_name(name, "shm_unlink");
  if (shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
    const int err = errno;
    throw CommError(str("shm_unlink('", name, "') failed: ", errno_str(err)));
  }
}

// ---------------------------------------------------------------- abort state

bool set_abort(Header& h, int rank, const std::string& reason) {
  uint32_t expected = 0;
  if (!h.abort_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return false;
  h.abort_rank.store(rank, std::memory_order_relaxed);
  const size_t n = std::min(reason.size(), kAbortReasonBytes - 1);
  std::memcpy(h.abort_reason, reason.data(), n);
  h.abort_reason[n] = '\0';
  h.abort_state.store(2, std::memory_order_release);
  return true;
}

bool read_abort(const Header& h, int* rank, std::string* reason) {
  uint32_t s = h.abort_state.load(std::memory_order_acquire);
  if (s == 0) return false;
  // An aborter is between claiming and publishing: a few stores away, unless it died right there.
  for (int i = 0; s == 1 && i < 2000; ++i) {
    sleep_us(5);
    s = h.abort_state.load(std::memory_order_acquire);
  }
  if (s == 1) {
    *rank = h.abort_rank.load(std::memory_order_relaxed);
    *reason = "(the aborting rank did not finish writing its reason)";
    return true;
  }
  *rank = h.abort_rank.load(std::memory_order_relaxed);
  *reason = std::string(h.abort_reason, strnlen(h.abort_reason, kAbortReasonBytes));
  return true;
}

// ---------------------------------------------------------------- liveness

namespace {

// Parses /proc/<pid>/stat (pid 0: this process): the state letter and the start time (field 22, clock ticks
// after boot). Returns false when the file cannot be read.
// Opened as "<pid>/stat" relative to /proc, for ourselves too: qemu-user (which runs the aarch64 wheel's tests on
// x86-64, tools/aarch64_check.sh) answers an open of "/proc/self/stat" or "/proc/<own pid>/stat" with a text of
// its own whose start time is ~0.1 s off the kernel's, so every peer, reading the kernel's, took us for a
// reused pid, i.e. dead. A relative path reaches the kernel's file, the same one the peers read.
bool read_proc_stat(int pid, char* state, uint64_t* start_time) {
  char path[32];
  std::snprintf(path, sizeof path, "%d/stat", pid > 0 ? pid : int(getpid()));
  const int proc_dir = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (proc_dir < 0) return false;
  const int fd = openat(proc_dir, path, O_RDONLY | O_CLOEXEC);
  close(proc_dir);
  if (fd < 0) return false;
  FILE* f = fdopen(fd, "r");
  if (!f) {
    close(fd);
    return false;
  }
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // The command name (field 2) is in parentheses and may itself contain spaces or ')': skip to the last.
  const char* p = std::strrchr(buf, ')');
  if (!p || p[1] != ' ') return false;
  p += 2;
  *state = *p;
  for (int field = 3; field < 22; ++field) {  // p points at field `field`
    p = std::strchr(p, ' ');
    if (!p) return false;
    ++p;
  }
  *start_time = std::strtoull(p, nullptr, 10);
  return true;
}

uint64_t pid_namespace() {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? uint64_t(st.st_ino) : 0;
}

}  // namespace

ProcessId self_process() {
  ProcessId id;
  id.pid = int32_t(getpid());
  char state;
  if (!read_proc_stat(0, &state, &id.start_time)) id.start_time = 0;
  id.pid_ns = pid_namespace();
  return id;
}

Liveness process_liveness(const ProcessId& peer, const ProcessId& self) {
  if (peer.pid <= 0) return Liveness::kUnknown;
  if (peer.pid_ns != self.pid_ns) return Liveness::kUnknown;
  char state;
  uint64_t start = 0;
  if (read_proc_stat(peer.pid, &state, &start)) {
    // A zombie has exited but is not reaped yet (its parent has not waited): kill() still finds it.
    if (state == 'Z' || state == 'X') return Liveness::kDead;
    if (peer.start_time != 0 && start != peer.start_time) return Liveness::kDead;  // pid reused
    return Liveness::kAlive;
  }
  if (kill(peer.pid, 0) == 0 || errno == EPERM) return Liveness::kAlive;
  return errno == ESRCH ? Liveness::kDead : Liveness::kUnknown;
}

}  // namespace sl::comm
