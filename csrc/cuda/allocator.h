// The CUDA caching allocator. Blocks are rounded to a size class and, when released, kept per device for
// reuse instead of going back through cudaFree (which synchronises the device). Reuse needs no event:
// every kernel and copy of a device runs on its one compute stream (cuda/context.h), so work queued after
// a block is handed out again runs after the work that used it before. Work on another stream (NCCL's, a DLPack
// consumer's) must make the compute stream wait for it before its tensors go back.
//
// The cache holds memory that cuBLAS, cuDNN and NCCL, which allocate with cudaMalloc themselves, cannot have. So:
// our own allocations empty the cache and retry before reporting out-of-memory; library calls that fail for lack
// of memory do the same through retry_if_out_of_memory (cuBLAS, cuDNN), and NCCL gets the cache emptied before it
// creates a communicator; and the cache can be capped (set_cache_limit, SINGA_LITE_CUDA_CACHE_LIMIT), which keeps
// that much less memory idle at the cost of more cudaMalloc / cudaFree.
#pragma once
#include <cstddef>
#include <cstdint>

namespace sl::cuda {

void* allocate(int device, size_t nbytes);  // throws OutOfMemory (after emptying the cache and retrying)
void release(int device, void* p, size_t nbytes) noexcept;

struct MemoryStats {
  size_t in_use = 0;       // bytes handed out to live tensors (size classes)
  size_t peak_in_use = 0;  // the most in_use has been since the last reset
  size_t cached = 0;       // bytes kept for reuse
  size_t device_allocs = 0;  // cudaMalloc calls so far
  size_t cache_limit = 0;    // the most `cached` may be (SIZE_MAX: no cap)
  size_t memory_limit = 0;   // the most `in_use` may be (SIZE_MAX: no limit)
};
MemoryStats memory_stats(int device);
void reset_peak(int device);
void empty_cache(int device);  // cudaFree of every cached block of the device (after waiting for its stream)

// Caps the bytes kept in the cache of `device` (SIZE_MAX: no cap, the default; SINGA_LITE_CUDA_CACHE_LIMIT sets the
// default of every device, in bytes, with an optional K / M / G suffix). A released block that would take the cache
// past the cap is returned to the driver instead; lowering the cap trims the cache at once.
void set_cache_limit(int device, size_t bytes);
// Limits the bytes of live allocations on `device` (SIZE_MAX: none, the default): an allocation past it raises
// OutOfMemory as a full GPU would. For sharing a GPU, and for tests of out-of-memory handling.
void set_memory_limit(int device, size_t bytes);

// Parses a byte count such as "2147483648", "512M" or "8G" (binary units); throws ValueError naming `what`.
size_t parse_bytes(const char* text, const char* what);

// Runs call() (a library call returning a status); when out_of_memory(status) says the library could not allocate,
// returns the cached blocks of `device` to the driver and runs it once more. Only for calls that change nothing
// when they fail that way (the library allocates before it launches anything).
template <typename Call, typename OutOfMemoryStatus>
auto retry_if_out_of_memory(int device, Call&& call, OutOfMemoryStatus&& out_of_memory) {
  auto status = call();
  if (out_of_memory(status)) {
    empty_cache(device);
    status = call();
  }
  return status;
}

}  // namespace sl::cuda
