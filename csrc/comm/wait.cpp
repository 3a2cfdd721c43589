// Futex calls behind the wait primitive (wait.h); a nanosleep backoff where there is no futex.
#include "comm/wait.h"

#include <climits>
#include <ctime>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace sl::comm {

namespace {
uint32_t* word_of(std::atomic<uint32_t>& a) { return reinterpret_cast<uint32_t*>(&a); }
}  // namespace

void ring(Doorbell& bell) {
  // seq_cst on both sides of the sleepers handshake (here: bump seq, then read sleepers; in sleep_on:
  // count ourselves in, then re-read seq): at least one side sees the other, so no wake-up is lost.
  bell.seq.fetch_add(1, std::memory_order_seq_cst);
  if (bell.sleepers.load(std::memory_order_seq_cst) == 0) return;
#ifdef __linux__
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  syscall(SYS_futex, word_of(bell.seq), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
#endif
}

void sleep_on(Doorbell& bell, uint32_t seen, int64_t timeout_ns, int attempt) {
  if (timeout_ns <= 0) return;
#ifdef __linux__
  (void)attempt;
  bell.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (bell.seq.load(std::memory_order_seq_cst) == seen) {
    timespec ts{time_t(timeout_ns / 1'000'000'000), long(timeout_ns % 1'000'000'000)};
    // Returns on a wake, on the timeout, on a signal (EINTR) or at once if seq moved (EAGAIN): all
    // of them mean "re-check", so the result is not looked at.
    syscall(SYS_futex, word_of(bell.seq), FUTEX_WAIT, seen, &ts, nullptr, 0);
  }
  bell.sleepers.fetch_sub(1, std::memory_order_seq_cst);
#else
  // No cross-process futex: back off from 20 us to about 1.3 ms, never past the caller's timeout.
  (void)bell;
  (void)seen;
  int64_t ns = int64_t(20'000) << (attempt < 6 ? attempt : 6);
  if (ns > timeout_ns) ns = timeout_ns;
  timespec ts{time_t(ns / 1'000'000'000), long(ns % 1'000'000'000)};
  nanosleep(&ts, nullptr);
#endif
}

}  // namespace sl::comm
