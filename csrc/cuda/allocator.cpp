#include "cuda/allocator.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/storage.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/runtime.h"

namespace sl::cuda {
namespace {

struct DevicePool {
  std::unordered_map<size_t, std::vector<void*>> free_blocks;  // size class -> blocks
  MemoryStats stats;
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
  return p.by_device[device];
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

void free_cached(DevicePool& dp, int device) {
  DeviceGuard guard(device);
  for (auto& [cls, blocks] : dp.free_blocks)
    for (void* b : blocks)
      if (cudaFree(b) != cudaSuccess) cudaGetLastError();  // a failed free must not be blamed on a later launch
  dp.free_blocks.clear();
  dp.stats.cached = 0;
}

}  // namespace

void* allocate(int device, size_t nbytes) {
  check_allocation_size(nbytes, Device::cuda(device));  // workspaces come here without Storage::allocate
  const size_t cls = size_class(nbytes);
  Pools& p = pools();
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    DevicePool& dp = pool(p, device);
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
      free_cached(pool(p, device), device);
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
  std::lock_guard<std::mutex> lock(p.mutex);
  DevicePool& dp = pool(p, device);
  dp.free_blocks[cls].push_back(b);
  dp.stats.in_use -= cls;
  dp.stats.cached += cls;
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
  free_cached(pool(p, device), device);
}

}  // namespace sl::cuda
