// The CUDA caching allocator. Blocks are rounded to a size class and, when released, kept per device for
// reuse instead of going back through cudaFree (which synchronises the device). Reuse needs no event:
// every kernel and copy of a device runs on its one compute stream (cuda/context.h), so work queued after
// a block is handed out again runs after the work that used it before. Work on another stream (NCCL's)
// must hold its tensors until the compute stream has waited for it.
#pragma once
#include <cstddef>

namespace sl::cuda {

void* allocate(int device, size_t nbytes);  // throws OutOfMemory (after emptying the cache and retrying)
void release(int device, void* p, size_t nbytes) noexcept;

struct MemoryStats {
  size_t in_use = 0;       // bytes handed out to live tensors (size classes)
  size_t peak_in_use = 0;  // the most in_use has been since the last reset
  size_t cached = 0;       // bytes kept for reuse
  size_t device_allocs = 0;  // cudaMalloc calls so far
};
MemoryStats memory_stats(int device);
void reset_peak(int device);
void empty_cache(int device);  // cudaFree of every cached block of the device

}  // namespace sl::cuda
