// The thread count the CPU kernels may use. GNU libgomp keeps its thread pool's bookkeeping across fork()
// but not the pool's threads, so in a child forked after the parent ran a parallel region, the child's
// first parallel region waits forever for workers that do not exist (seen: multiprocessing "fork" ranks
// started after the parent had run one GEMM). A fork handler marks such a child, and its kernels then run
// on the calling thread only: slower, never stuck. Processes started with "spawn" or "forkserver", or
// forked before any parallel region, keep their threads.
#include <omp.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "cpu/loop.h"

namespace sl::cpu {
namespace {

std::atomic<bool> pool_used{false};
std::atomic<bool> forked_after_pool{false};

void in_forked_child() {
  if (pool_used.load(std::memory_order_relaxed)) forked_after_pool.store(true, std::memory_order_relaxed);
}

const int fork_handler_registered = pthread_atfork(nullptr, nullptr, in_forked_child);

}  // namespace

int max_threads() {
  if (forked_after_pool.load(std::memory_order_relaxed)) return 1;
  const int n = omp_get_max_threads();
  if (n > 1) pool_used.store(true, std::memory_order_relaxed);  // the caller may start a parallel region now
  return n;
}

}  // namespace sl::cpu

// ---------------------------------------------------------------- the kernels' thread pool (run_chunks)
// One job at a time. Its chunks are claimed through one atomic word holding (job number, next chunk, chunk
// count), so a claim succeeds only for the job it was read from: a worker that wakes up late cannot take a
// chunk of a later job with the earlier job's function. The caller claims chunks like any worker, then waits
// for the claimed ones to finish. Idle workers poll for a while (yielding the core to anyone who wants it),
// then sleep on a condition variable.
namespace sl::cpu {
namespace {

class ChunkPool {
 public:
  void run(int nt, int64_t nchunks, void (*chunk)(void*, int64_t), void* ctx) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock() || nchunks > kMaxChunks) {  // another Python thread's kernel is running: run serially
      for (int64_t c = 0; c < nchunks; ++c) chunk(ctx, c);
      return;
    }
    start_workers(nt - 1);
    helpers_.store(nt - 1, std::memory_order_relaxed);
    fn_ = chunk;
    ctx_ = ctx;
    done_.store(0, std::memory_order_relaxed);
    const uint64_t job = (claim_.load(std::memory_order_relaxed) >> 32) + 1;
    claim_.store(job << 32 | uint64_t(nchunks), std::memory_order_release);  // publishes fn_, ctx_
    {
      std::lock_guard<std::mutex> lock(sleep_mutex_);
      job_seen_ = job;
    }
    if (sleepers_.load(std::memory_order_relaxed) > 0) wake_.notify_all();
    work(job);
    for (int spins = 0; done_.load(std::memory_order_acquire) < nchunks; ++spins)
      if (spins > 64) std::this_thread::yield();  // a worker finishes a chunk; let it have the core
  }

 private:
  static constexpr int64_t kMaxChunks = 0xffff;  // 16 bits each for the next chunk and the count

  // Claims and runs chunks of `job` until none is left.
  void work(uint64_t job) {
    uint64_t c = claim_.load(std::memory_order_acquire);
    while ((c >> 32) == job && ((c >> 16) & 0xffff) < (c & 0xffff)) {
      if (claim_.compare_exchange_weak(c, c + (uint64_t(1) << 16), std::memory_order_acq_rel)) {
        fn_(ctx_, int64_t((c >> 16) & 0xffff));
        done_.fetch_add(1, std::memory_order_release);
        c = claim_.load(std::memory_order_acquire);
      }
    }
  }

  void worker_loop(int index) {
    uint64_t seen = 0;
    for (;;) {
      uint64_t job = claim_.load(std::memory_order_acquire) >> 32;
      // Poll for a new job for 100 us (back-to-back kernels then start at once), yielding the core to any
      // other thread that wants it, then sleep.
      if (job == seen) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
        do {
          std::this_thread::yield();
          job = claim_.load(std::memory_order_acquire) >> 32;
        } while (job == seen && std::chrono::steady_clock::now() < until);
      }
      if (job == seen) {
        std::unique_lock<std::mutex> lock(sleep_mutex_);
        sleepers_.fetch_add(1, std::memory_order_relaxed);
        wake_.wait(lock, [&] { return job_seen_ != seen; });
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
        job = job_seen_;
      }
      seen = job;
      if (index < helpers_.load(std::memory_order_relaxed)) work(job);  // the job may want fewer threads
    }
  }

  void start_workers(int n) {
    while (int(workers_started_) < n) {
      std::thread(&ChunkPool::worker_loop, this, workers_started_).detach();  // lives as long as the process
      ++workers_started_;
    }
  }

  std::mutex busy_;
  std::atomic<uint64_t> claim_{0};  // job << 32 | next chunk << 16 | chunk count
  std::atomic<int64_t> done_{0};
  void (*fn_)(void*, int64_t) = nullptr;
  void* ctx_ = nullptr;
  int workers_started_ = 0;  // under busy_
  std::atomic<int> helpers_{0};  // workers wanted by the current job
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  uint64_t job_seen_ = 0;  // under sleep_mutex_: the latest job, for sleeping workers
  std::atomic<int> sleepers_{0};
};

}  // namespace

void run_chunks(int nt, int64_t nchunks, void (*chunk)(void*, int64_t), void* ctx) {
  // Never destroyed: its detached workers may still be polling it while the process exits.
  static ChunkPool* pool = new ChunkPool;
  if (nt <= 1 || nchunks <= 1) {
    for (int64_t c = 0; c < nchunks; ++c) chunk(ctx, c);
    return;
  }
  pool->run(nt, nchunks, chunk, ctx);
}

}  // namespace sl::cpu
