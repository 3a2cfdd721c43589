// The memfd transport's rendezvous: an abstract Unix socket that hands the segment's descriptor over
// (see shm_rendezvous.h).
#include "comm/shm_rendezvous.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#ifdef __linux__
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#endif

#include "core/errors.h"

namespace sl::comm {

namespace {

uint64_t fnv1a(const std::string& s, uint64_t h) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

}  // namespace

bool memfd_available() {
#ifdef __linux__
  return true;
#else
  return false;
#endif
}

const char* transport_name(Transport t) { return t == Transport::kMemfd ? "memfd" : "named"; }

Transport default_transport() {
  const char* v = std::getenv(kTransportVar);
  const std::string want = v ? v : "";
  if (want.empty()) return memfd_available() ? Transport::kMemfd : Transport::kNamed;
  if (want == "named") return Transport::kNamed;
  SL_CHECK(want == "memfd", ValueError, "ShmComm: ", kTransportVar, " must be 'memfd' or 'named', got '", want,
           "'; unset it for the default (memfd on Linux)");
  SL_CHECK(memfd_available(), ValueError, "ShmComm: ", kTransportVar,
           "=memfd needs Linux (memfd_create, abstract Unix sockets); unset it or set 'named'");
  return Transport::kMemfd;
}

std::string rendezvous_address(const std::string& name) {
  static const std::string prefix = std::string(1, '\0') + "sl_shm";
#ifdef __linux__
  constexpr size_t kMax = sizeof(sockaddr_un::sun_path);
#else
  constexpr size_t kMax = 104;
#endif
  if (prefix.size() + name.size() <= kMax) return prefix + name;
  // Too long for a socket address: a digest. Distinct names of one host must not share an address (two jobs
  // would meet); 128 bits of FNV-1a make that as unlikely as two random names colliding. Secrecy is not its
  // job: the address is listed in /proc/net/unix anyway, and the credentials checks keep strangers out.
  char hex[40];
  std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(fnv1a(name, 0xcbf29ce484222325ULL)),
                static_cast<unsigned long long>(fnv1a(name, 0x84222325cbf29ce4ULL)));
  return prefix + "#" + hex;
}

#ifdef __linux__

namespace {

std::string errno_str(int err) { return std::strerror(err); }

// Closes a descriptor when it goes out of scope, unless released.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) close(fd);
  }
  int release() {
    const int f = fd;
    fd = -1;
    return f;
  }
};

socklen_t socket_address(const std::string& name, sockaddr_un* sa) {
  const std::string addr = rendezvous_address(name);
  std::memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  std::memcpy(sa->sun_path, addr.data(), addr.size());
  return socklen_t(offsetof(sockaddr_un, sun_path) + addr.size());
}

bool peer_credentials(int s, ucred* cred) {
  socklen_t n = sizeof *cred;
  return getsockopt(s, SOL_SOCKET, SO_PEERCRED, cred, &n) == 0 && n == sizeof *cred;
}

// The server must run as our effective uid: otherwise someone else bound the address (it is listed in
// /proc/net/unix while a rendezvous runs) to hand us memory they can read and change.
void check_server(int s, const std::string& name) {
  ucred cred{};
  if (!peer_credentials(s, &cred)) {
    const int err = errno;
    throw CommError(str("ShmComm: cannot read the credentials of the process serving segment '", name, "': ",
                        errno_str(err)));
  }
  if (cred.uid != geteuid())
    throw CommError(str("ShmComm: refusing to join shared-memory segment '", name, "': the process serving it "
                        "belongs to uid ", cred.uid, " (pid ", cred.pid, "), but a segment of this job is created by "
                        "uid ", geteuid(), "; another user may have bound its rendezvous address to join the "
                        "job. Fix: give every job a fresh name (a new NcclIdHolder)"));
}

// Waits (polling, so that interrupt_check runs) for the server's one message and takes the descriptor it
// carries.
int receive_fd(int s, const std::string& name, Clock::time_point deadline,
               const std::function<void()>& interrupt_check) {
  ucred cred{};
  peer_credentials(s, &cred);
  for (;;) {
    const auto now = Clock::now();
    if (now >= deadline)
      throw CommError(str("ShmComm: the process serving segment '", name, "' (pid ", cred.pid, ") did not hand it "
                          "over before the timeout (is it stopped, or stuck?)"));
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
    pollfd p{s, POLLIN, 0};
    const int r = poll(&p, 1, int(left < 40 ? left : 40));
    if (r < 0 && errno != EINTR) {
      const int err = errno;
      throw CommError(str("ShmComm: waiting for segment '", name, "' from its creator failed: ", errno_str(err)));
    }
    if (r > 0) break;
    if (interrupt_check) interrupt_check();
  }
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  int fd = -1;
  if (n > 0)
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
        std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  if (fd < 0 || (m.msg_flags & MSG_CTRUNC)) {
    if (fd >= 0) close(fd);
    throw CommError(str("ShmComm: the process serving segment '", name, "' (pid ", cred.pid, ") closed the "
                        "connection without handing the segment over: its rendezvous had ended (every rank had "
                        "joined, or it failed). Fix: start every rank of the job with a fresh name, each rank once"));
  }
  return fd;
}

}  // namespace

Claim claim(const std::string& name, Clock::time_point deadline, const std::function<void()>& interrupt_check) {
  sockaddr_un sa;
  const socklen_t len = socket_address(name, &sa);
  auto last_check = Clock::now();
  int nap_us = 50;
  for (;;) {
    Fd s(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (s.fd < 0) {
      const int err = errno;
      throw CommError(str("ShmComm: socket() for the rendezvous of segment '", name, "' failed: ", errno_str(err)));
    }
    if (bind(s.fd, reinterpret_cast<sockaddr*>(&sa), len) == 0) {
      // Listening at once: the others' connections wait in the backlog while this rank builds the segment.
      if (listen(s.fd, SOMAXCONN) != 0) {
        const int err = errno;
        throw CommError(str("ShmComm: listen() on the rendezvous of segment '", name, "' failed: ", errno_str(err)));
      }
      return Claim{s.release(), -1};
    }
    int err = errno;
    if (err != EADDRINUSE)
      throw CommError(str("ShmComm: cannot bind the rendezvous socket of segment '", name, "': ", errno_str(err)));
    if (connect(s.fd, reinterpret_cast<sockaddr*>(&sa), len) == 0) {
      check_server(s.fd, name);
      return Claim{-1, receive_fd(s.fd, name, deadline, interrupt_check)};
    }
    err = errno;
    // ECONNREFUSED: the address is bound but nobody listens: its creator is between bind and listen, or has
    // just closed it (its rendezvous failed, or it ended: then this rank creates a new one). EAGAIN: the
    // backlog is full. Either way, try again shortly.
    if (err != ECONNREFUSED && err != EAGAIN)
      throw CommError(str("ShmComm: cannot connect to the rendezvous of segment '", name, "': ", errno_str(err)));
    const auto now = Clock::now();
    if (now >= deadline)
      throw CommError(str("ShmComm: the rendezvous address of segment '", name, "' stayed bound without anyone "
                          "accepting connections until the timeout; fix: give the job a fresh name"));
    if (interrupt_check && now - last_check >= std::chrono::milliseconds(40)) {
      last_check = now;
      interrupt_check();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(nap_us));
    nap_us = nap_us < 5000 ? nap_us * 2 : nap_us;
  }
}

int create_memfd(const std::string& name) {
  const std::string label = "sl_shm" + name.substr(0, 200);  // shown in /proc/<pid>/maps and fd links
  const int fd = memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    const int err = errno;
    throw CommError(str("ShmComm: memfd_create for segment '", name, "' failed: ", errno_str(err),
                        "; fix: set ", kTransportVar, "=named on every rank (a named segment in /dev/shm)"));
  }
  fchmod(fd, 0600);  // only our uid may open it again through /proc/<pid>/fd
  return fd;
}

void seal_size(int fd) { fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL); }

bool rendezvous_listening(const std::string& name) {
  sockaddr_un sa;
  const socklen_t len = socket_address(name, &sa);
  Fd s(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  return s.fd >= 0 && connect(s.fd, reinterpret_cast<sockaddr*>(&sa), len) == 0;
}

// ---------------------------------------------------------------- SegmentServer

SegmentServer::SegmentServer(int listen_fd, int memfd, std::string name)
    : listen_fd_(listen_fd), memfd_(memfd), name_(std::move(name)), owner_pid_(getpid()) {
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    const int err = errno;
    stop();
    throw CommError(str("ShmComm: eventfd for the rendezvous of segment '", name_, "' failed: ", errno_str(err)));
  }
  // The thread takes no signals (they are the main thread's business, Ctrl-C included): it starts with all
  // of them blocked.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t t;
  const int rc = pthread_create(&t, nullptr, &SegmentServer::run, this);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) {
    stop();
    throw CommError(str("ShmComm: cannot start the thread serving segment '", name_, "': ", errno_str(rc)));
  }
  thread_ = static_cast<unsigned long>(t);
  running_ = true;
}

void* SegmentServer::run(void* self) {
  auto* me = static_cast<SegmentServer*>(self);
  pollfd fds[2] = {{me->listen_fd_, POLLIN, 0}, {me->wake_fd_, POLLIN, 0}};
  for (;;) {
    const int r = poll(fds, 2, -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents) break;
    if (fds[0].revents & POLLIN) me->serve_pending();
    if (fds[0].revents & (POLLERR | POLLHUP | POLLNVAL)) break;
  }
  return nullptr;
}

void SegmentServer::serve_pending() noexcept {
  for (;;) {
    const int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN: nobody else waiting (the listening socket is non-blocking)
    }
    ucred cred{};
    // Another user's process gets nothing: the connection closes, and it reads end-of-file.
    if (peer_credentials(c, &cred) && cred.uid == geteuid()) {
      char byte = 'S';
      iovec iov{&byte, 1};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
      msghdr m{};
      m.msg_iov = &iov;
      m.msg_iovlen = 1;
      m.msg_control = control;
      m.msg_controllen = sizeof control;
      cmsghdr* h = CMSG_FIRSTHDR(&m);
      h->cmsg_level = SOL_SOCKET;
      h->cmsg_type = SCM_RIGHTS;
      h->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(h), &memfd_, sizeof memfd_);
      // A fresh connection's buffer is empty: one byte never blocks. MSG_NOSIGNAL: a client that went away
      // must not SIGPIPE this process.
      sendmsg(c, &m, MSG_NOSIGNAL);
    }
    close(c);
  }
}

void SegmentServer::stop() noexcept {
  const bool owner = getpid() == owner_pid_;
  if (running_ && owner) {
    const uint64_t one = 1;
    while (write(wake_fd_, &one, sizeof one) < 0 && errno == EINTR) {
    }
    pthread_join(static_cast<pthread_t>(thread_), nullptr);
  }
  running_ = false;  // (in a forked child there is no thread to stop: only the descriptors are its own)
  for (int* fd : {&listen_fd_, &memfd_, &wake_fd_})
    if (*fd >= 0) {
      close(*fd);
      *fd = -1;
    }
}

#else  // not Linux: only the named transport exists

Claim claim(const std::string& name, Clock::time_point, const std::function<void()>&) {
  throw CommError(str("ShmComm: the memfd transport (segment '", name, "') needs Linux"));
}
int create_memfd(const std::string& name) {
  throw CommError(str("ShmComm: the memfd transport (segment '", name, "') needs Linux"));
}
void seal_size(int) {}
bool rendezvous_listening(const std::string&) { return false; }
SegmentServer::SegmentServer(int listen_fd, int memfd, std::string name)
    : listen_fd_(listen_fd), memfd_(memfd), name_(std::move(name)), owner_pid_(getpid()) {}
void* SegmentServer::run(void*) { return nullptr; }
void SegmentServer::serve_pending() noexcept {}
void SegmentServer::stop() noexcept {
  for (int* fd : {&listen_fd_, &memfd_, &wake_fd_})
    if (*fd >= 0) {
      close(*fd);
      *fd = -1;
    }
}

#endif

}  // namespace sl::comm
