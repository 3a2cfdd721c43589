// The one wait primitive of the shared-memory communicator: spin briefly, then sleep on a futex.
//
// Ranks may outnumber cores, so a waiter must give its core away quickly: it spins for a few
// microseconds (the common case when every rank has a core: the peer arrives within that time), then
// sleeps on a Doorbell, a 32-bit word in shared memory that FUTEX_WAIT can sleep on across processes.
// Whoever makes a waiter's condition true rings the bell: it bumps the word and wakes the sleepers.
// Sleeps are cut into slices of at most kSliceNs so that a waiter re-checks, at least that often,
// whether the job was aborted or the peers it waits for are still alive (a dead process rings nothing).
// Off Linux there is no cross-process futex: the sleep becomes a nanosleep with exponential backoff.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>

namespace sl::comm {

using Clock = std::chrono::steady_clock;

// Spin this long before sleeping: a futex sleep and wake-up costs more than a small all_reduce, and a peer
// usually arrives within a few microseconds; a longer spin gains nothing (docs/benchmarks/communication.md,
// "Measurements behind the code's choices").
constexpr int64_t kSpinNs = 5'000;
constexpr int64_t kSliceNs = 50'000'000;  // longest sleep between checks of abort and liveness

// Lives in shared memory. Both words are lock-free atomics, which are address-free, so processes that
// map the segment at different addresses can use them; the futex sleeps on `seq`.
struct Doorbell {
  std::atomic<uint32_t> seq{0};       // bumped by every ring; waiters sleep while it is unchanged
  std::atomic<uint32_t> sleepers{0};  // processes inside FUTEX_WAIT: a ring makes a syscall only when > 0
};
static_assert(std::atomic<uint32_t>::is_always_lock_free && sizeof(std::atomic<uint32_t>) == 4,
              "the futex needs a plain 32-bit word");

// A pause instruction: tells the core (and its hyper-thread sibling) that this is a spin loop.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Bumps bell.seq and wakes every process sleeping on it.
void ring(Doorbell& bell);

// Sleeps while bell.seq == seen, at most timeout_ns (0 or less: returns at once). May return early
// (spurious wake-ups); callers re-check their condition. `attempt` counts the sleeps of this wait, for
// the backoff of the non-Linux fallback.
void sleep_on(Doorbell& bell, uint32_t seen, int64_t timeout_ns, int attempt);

// Waits until ready() holds; returns false when `deadline` passes first. ready() is called often and
// must be cheap (a few atomic loads). idle() runs before every sleep, i.e. at least every kSliceNs,
// and may throw to end the wait (abort flag set, peer dead): it is where liveness is checked.
template <typename Ready, typename Idle>
bool wait_until(Doorbell& bell, Ready&& ready, Idle&& idle, Clock::time_point deadline) {
  if (ready()) return true;
  const auto spin_end = Clock::now() + std::chrono::nanoseconds(kSpinNs);
  for (int i = 1;; ++i) {
    cpu_relax();
    if (ready()) return true;
    if ((i & 63) == 0 && Clock::now() >= spin_end) break;
  }
  for (int attempt = 0;; ++attempt) {
    // Read the bell before the condition: a ring between the two makes sleep_on return at once.
    const uint32_t seen = bell.seq.load(std::memory_order_acquire);
    if (ready()) return true;
    idle();
    const auto now = Clock::now();
    if (now >= deadline) return ready();
    const int64_t left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
    sleep_on(bell, seen, left < kSliceNs ? left : kSliceNs, attempt);
  }
}

}  // namespace sl::comm
