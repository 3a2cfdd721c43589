// How the ranks of a job get hold of ShmComm's shared-memory segment: the two transports.
//
// memfd (Linux; the default there): the segment is an anonymous memory file (memfd_create). It never has a
// name in /dev/shm, so a job killed at any moment, in the middle of its start-up included, leaves nothing
// behind: the memory goes with the last process that maps it. The segment name the ranks share only names a
// rendezvous, an abstract Unix socket (rendezvous_address(name); no file either, gone with its process).
// The first rank to bind that address creates the memory and serves its descriptor (SCM_RIGHTS) to every
// rank that connects, from a thread (SegmentServer), until every rank has joined; then it closes the socket.
// Both sides check the other's credentials (SO_PEERCRED): the server hands the segment only to processes of
// its own effective uid, and a rank refuses a server of another uid (someone who bound the address first).
// Abstract sockets belong to a network namespace: ranks in different network namespaces cannot meet this
// way (the env rendezvous counts such ranks as different hosts; elsewhere, use the named transport).
//
// named (elsewhere, or SINGA_LITE_SHM_TRANSPORT=named): a POSIX shm_open name in /dev/shm, mode 0600, that
// the last rank to join unlinks (shm_segment.cpp). A job killed before every rank joined leaves the name;
// singa_lite.comm.holder.sweep_stale_segments removes such names of dead creators.
#pragma once
#include <sys/types.h>

#include <functional>
#include <string>

#include "comm/wait.h"

namespace sl::comm {

enum class Transport { kMemfd, kNamed };

constexpr const char* kTransportVar = "SINGA_LITE_SHM_TRANSPORT";
// SINGA_LITE_SHM_TRANSPORT when set ("memfd" or "named"; ValueError otherwise, or for memfd where it is
// not available), else memfd where available (Linux), else named. Every rank of a job must use the same.
Transport default_transport();
const char* transport_name(Transport t);
bool memfd_available();  // compiled for Linux

// The abstract socket address (leading NUL included) of the rendezvous for segment `name`:
// "\0sl_shm<name>", or "\0sl_shm#<128-bit hash of name>" for names too long for a socket address.
std::string rendezvous_address(const std::string& name);

// The creator's side of the memfd transport: hands `memfd` to every process of this uid that connects to
// `listen_fd`, from a thread of its own, until stop(). Takes both descriptors (closed by stop()).
class SegmentServer {
 public:
  SegmentServer(int listen_fd, int memfd, std::string name);
  ~SegmentServer() { stop(); }
  SegmentServer(const SegmentServer&) = delete;
  SegmentServer& operator=(const SegmentServer&) = delete;
  // Stops serving and closes the socket: later connections are refused. Idempotent.
  void stop() noexcept;

 private:
  static void* run(void* self);
  void serve_pending() noexcept;
  int listen_fd_, memfd_, wake_fd_ = -1;
  std::string name_;
  pid_t owner_pid_;  // a forked child has a copy of this object but not the thread
  bool running_ = false;
  unsigned long thread_ = 0;  // pthread_t
};

// What claim() found at the rendezvous address.
struct Claim {
  int listen_fd = -1;  // >= 0: this process bound the address (listening already): it is the creator
  int segment_fd = -1;  // >= 0: the descriptor the creator handed over
};

// Binds the rendezvous address of `name` (then this process creates the segment) or receives the segment's
// descriptor from the process that did, retrying until `deadline` while the address is bound but nobody
// listens yet. The handed-over descriptor is checked to come from a process of this effective uid.
// interrupt_check (may be empty) runs about every 40 ms while waiting. CommError on failure or timeout.
Claim claim(const std::string& name, Clock::time_point deadline, const std::function<void()>& interrupt_check);

// A new anonymous memory file, mode 0600, empty (create_segment sizes it). CommError on failure, naming `name`.
int create_memfd(const std::string& name);
// Seals the file's size once it is sized: no process can shrink it under the others' mappings (their next
// access past the end would be a SIGBUS) or grow it. Best effort (a kernel without seals: nothing happens).
void seal_size(int fd);

// Whether a process listens at the rendezvous address of `name` (for error messages).
bool rendezvous_listening(const std::string& name);

}  // namespace sl::comm
