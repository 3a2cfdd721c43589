#include "cuda/allocator.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/storage.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/runtime.h"

namespace sl::cuda {
namespace {

size_t default_cache_limit() {
  static const size_t limit = [] {
    const char* v = std::getenv("SINGA_LITE_CUDA_CACHE_LIMIT");
    return v && *v ? parse_bytes(v, "SINGA_LITE_CUDA_CACHE_LIMIT") : SIZE_MAX;
  }();
  return limit;
}

struct DevicePool {
  std::unordered_map<size_t, std::vector<void*>> free_blocks;  // size class -> blocks
  MemoryStats stats;
  bool configured = false;  // limits read from the environment
};

struct Pools {
  std::mutex mutex;
  std::vector<DevicePool> by_device;
};

Pools& pools() {
  static Pools* p = new Pools();  // never destroyed: tensors may be released during interpreter exit
  return *p;
}

DevicePool& pool(Pools& p, int device) {
  if (int(p.by_device.size()) <= device) p.by_device.resize(device + 1);
  DevicePool& dp = p.by_device[device];
  if (!dp.configured) {
    dp.stats.cache_limit = default_cache_limit();
    dp.stats.memory_limit = SIZE_MAX;
    dp.configured = true;
  }
  return dp;
}

// 512-byte steps below 1 MiB (small tensors come and go in every step); above, multiples of a quarter of
// the largest power of two not above n (at most 25 % waste), as the CPU cache.
size_t size_class(size_t n) {
  if (n == 0) n = 1;
  if (n < (size_t(1) << 20)) return (n + 511) / 512 * 512;
  size_t p = size_t(1) << (63 - __builtin_clzll(n));
  size_t step = p / 4;
  return (n + step - 1) / step * step;
}

void free_block(void* b) noexcept {
  if (cudaFree(b) != cudaSuccess) cudaGetLastError();  // a failed free must not be blamed on a later launch
}

// cudaFree of cached blocks, largest classes first, until at most `keep` bytes stay cached. The caller has waited
// for the device's stream (cached blocks may still be read by queued kernels) and holds the pools' lock.
void trim(DevicePool& dp, int device, size_t keep) {
  if (dp.stats.cached <= keep) return;
  std::vector<size_t> classes;
  for (const auto& [cls, blocks] : dp.free_blocks)
    if (!blocks.empty()) classes.push_back(cls);
  std::sort(classes.rbegin(), classes.rend());
  DeviceGuard guard(device);
  for (size_t cls : classes) {
    auto& blocks = dp.free_blocks[cls];
    while (!blocks.empty() && dp.stats.cached > keep) {
      free_block(blocks.back());
      blocks.pop_back();
      dp.stats.cached -= cls;
    }
    if (dp.stats.cached <= keep) break;
  }
}

}  // namespace

size_t parse_bytes(const char* text, const char* what) {
  const std::string s(text ? text : "");
  size_t i = 0;
  unsigned long long value = 0;
  bool digits = false, overflow = false;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    digits = true;
    if (value > (ULLONG_MAX - 9) / 10) overflow = true;
    value = value * 10 + unsigned(s[i] - '0');
  }
  int shift = 0;
  if (i < s.size()) {
    const char u = char(s[i] | 0x20);
    shift = u == 'k' ? 10 : u == 'm' ? 20 : u == 'g' ? 30 : u == 't' ? 40 : -1;
    if (shift > 0) ++i;
    if (i < s.size() && (s[i] == 'i')) ++i;
    if (i < s.size() && (s[i] == 'B' || s[i] == 'b')) ++i;
  }
  SL_CHECK(digits && shift >= 0 && i == s.size() && !overflow && (shift == 0 || value <= (SIZE_MAX >> shift)),
           ValueError, what, ": expected a byte count such as 1073741824, 512M or 8G, got '", s, "'");
  return size_t(value) << shift;
}

void* allocate(int device, size_t nbytes) {
  check_allocation_size(nbytes, Device::cuda(device));  // workspaces come here without Storage::allocate
  const size_t cls = size_class(nbytes);
  Pools& p = pools();
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    DevicePool& dp = pool(p, device);
    const size_t limit = dp.stats.memory_limit;
    if (limit != SIZE_MAX && (dp.stats.in_use > limit || cls > limit - dp.stats.in_use))
      throw OutOfMemory(str("cannot allocate ", nbytes, " bytes on cuda:", device, ": the memory limit of this "
                            "device (set_memory_limit) is ", dp.stats.memory_limit, " bytes and ", dp.stats.in_use,
                            " are in use. Free tensors you no longer need, use a smaller batch, or raise the limit"));
    auto it = dp.free_blocks.find(cls);
    if (it != dp.free_blocks.end() && !it->second.empty()) {
      void* b = it->second.back();
      it->second.pop_back();
      dp.stats.cached -= cls;
      dp.stats.in_use += cls;
      dp.stats.peak_in_use = std::max(dp.stats.peak_in_use, dp.stats.in_use);
      return b;
    }
  }
  void* b = nullptr;
  try {
    b = malloc_on(device, cls);
  } catch (const OutOfMemory&) {
    {
      std::lock_guard<std::mutex> lock(p.mutex);
      sync(device);  // cached blocks may still be read by queued kernels
      trim(pool(p, device), device, 0);
    }
    try {
      b = malloc_on(device, cls);
    } catch (const OutOfMemory&) {
      MemoryStats s = memory_stats(device);
      throw OutOfMemory(str("cannot allocate ", nbytes, " bytes on cuda:", device, " (out of GPU memory; ",
                            s.in_use, " bytes are held by live tensors). Free tensors you no longer need, or "
                            "use a smaller batch"));
    }
  }
  std::lock_guard<std::mutex> lock(p.mutex);
  DevicePool& dp = pool(p, device);
  dp.stats.device_allocs += 1;
  dp.stats.in_use += cls;
  dp.stats.peak_in_use = std::max(dp.stats.peak_in_use, dp.stats.in_use);
  return b;
}

void release(int device, void* b, size_t nbytes) noexcept {
  const size_t cls = size_class(nbytes);
  Pools& p = pools();
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    DevicePool& dp = pool(p, device);
    dp.stats.in_use -= cls;
    if (dp.stats.cached + cls <= dp.stats.cache_limit) {
      dp.free_blocks[cls].push_back(b);
      dp.stats.cached += cls;
      return;
    }
  }
  // Past the cap: back to the driver, once the work queued on the stream (which may still use it) is done. Outside
  // the lock, so that other threads keep allocating meanwhile.
  try {
    DeviceGuard guard(device);
    if (cudaStreamSynchronize(stream(device)) != cudaSuccess) cudaGetLastError();
    free_block(b);
  } catch (...) {
    // no context to make current (interpreter exit): the memory goes with the process
  }
}

MemoryStats memory_stats(int device) {
  Pools& p = pools();
  std::lock_guard<std::mutex> lock(p.mutex);
  return pool(p, device).stats;
}

void reset_peak(int device) {
  Pools& p = pools();
  std::lock_guard<std::mutex> lock(p.mutex);
  DevicePool& dp = pool(p, device);
  dp.stats.peak_in_use = dp.stats.in_use;
}

void empty_cache(int device) {
  Pools& p = pools();
  std::lock_guard<std::mutex> lock(p.mutex);
  sync(device);
  trim(pool(p, device), device, 0);
}

void set_cache_limit(int device, size_t bytes) {
  Pools& p = pools();
  std::lock_guard<std::mutex> lock(p.mutex);
  DevicePool& dp = pool(p, device);
  dp.stats.cache_limit = bytes;
  if (dp.stats.cached > bytes) {
    sync(device);
    trim(dp, device, bytes);
  }
}

void set_memory_limit(int device, size_t bytes) {
  Pools& p = pools();
  std::lock_guard<std::mutex> lock(p.mutex);
  pool(p, device).stats.memory_limit = bytes;
}

}  // namespace sl::cuda
