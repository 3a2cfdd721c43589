// The thread count the CPU kernels may use. GNU libgomp keeps its thread pool's bookkeeping across fork()
// but not the pool's threads, so in a child forked after the parent ran a parallel region, the child's
// first parallel region waits forever for workers that do not exist (seen: multiprocessing "fork" ranks
// started after the parent had run one GEMM). A fork handler marks such a child, and its kernels then run
// on the calling thread only: slower, never stuck. Processes started with "spawn" or "forkserver", or
// forked before any parallel region, keep their threads.
#include <omp.h>
#include <pthread.h>

#include <atomic>

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
