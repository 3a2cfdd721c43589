#include "core/storage.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "core/errors.h"
#ifdef SINGA_LITE_WITH_CUDA
#include "cuda/allocator.h"
#endif

namespace sl {

Storage::Storage(void* data, size_t nbytes, Device device, Deleter deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (deleter_) deleter_(data_);
}

namespace {

// CPU block cache. Training allocates the same large shapes every step; getting them fresh from the kernel costs a
// page fault per 4 KiB, several times the work of the op that writes them (docs/benchmarks/cpu_core.md,
// "Measurements behind the kernels' design"). Blocks of at least kCacheFrom bytes are rounded to a size class and
// kept after release, up to kCacheLimit bytes in all; smaller ones go straight to malloc.
constexpr size_t kLine = 64, kHugePage = size_t(2) << 20, kHugeFrom = size_t(4) << 20;
constexpr size_t kCacheFrom = size_t(256) << 10;
constexpr size_t kCacheLimit = size_t(1) << 30;

struct CpuCache {
  std::mutex mutex;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;  // size class -> blocks
  size_t cached_bytes = 0;
};

CpuCache& cpu_cache() {
  static CpuCache* cache = new CpuCache();  // never destroyed: deleters may run during interpreter exit
  return *cache;
}

// Size classes: multiples of a quarter of the largest power of two not above n (at most 25% waste).
size_t size_class(size_t n) {
  size_t p = size_t(1) << (63 - __builtin_clzll(n));
  size_t step = std::max(p / 4, kLine);
  return (n + step - 1) / step * step;
}

void* cpu_alloc_fresh(size_t bytes) {
  // Large blocks: 2 MiB aligned and marked for transparent huge pages (numpy does the same).
  const size_t align = bytes >= kHugeFrom ? kHugePage : kLine;
  size_t padded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, padded == 0 ? align : padded);
  if (!p) throw OutOfMemory(str("cannot allocate ", bytes, " bytes on the CPU"));
#ifdef MADV_HUGEPAGE
  if (align == kHugePage) madvise(p, padded, MADV_HUGEPAGE);  // advisory: failure only costs speed
#endif
  return p;
}

void cpu_release(void* p, size_t cls) {
  CpuCache& c = cpu_cache();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    if (c.cached_bytes + cls <= kCacheLimit) {
      c.free_blocks[cls].push_back(p);
      c.cached_bytes += cls;
      return;
    }
  }
  std::free(p);
}

}  // namespace

size_t cpu_cache_bytes() {
  std::lock_guard<std::mutex> lock(cpu_cache().mutex);
  return cpu_cache().cached_bytes;
}

void empty_cpu_cache() {
  CpuCache& c = cpu_cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (auto& [cls, blocks] : c.free_blocks)
    for (void* p : blocks) std::free(p);
  c.free_blocks.clear();
  c.cached_bytes = 0;
}

void check_allocation_size(size_t nbytes, const Device& device) {
  if (nbytes > kMaxAllocation)
    throw OutOfMemory(str("cannot allocate ", nbytes, " bytes on ", device.str(), ": more than any machine has ",
                          "(at most 2**62 bytes per tensor); check the shape"));
}

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device) {
  check_allocation_size(nbytes, device);
  if (device.is_cpu()) {
    if (nbytes < kCacheFrom) {
      void* p = cpu_alloc_fresh(nbytes);
      return std::make_shared<Storage>(p, nbytes, device, [](void* q) { std::free(q); });
    }
    const size_t cls = size_class(nbytes);
    void* p = nullptr;
    {
      CpuCache& c = cpu_cache();
      std::lock_guard<std::mutex> lock(c.mutex);
      auto it = c.free_blocks.find(cls);
      if (it != c.free_blocks.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        c.cached_bytes -= cls;
      }
    }
    if (!p) {
      try {
        p = cpu_alloc_fresh(cls);
      } catch (const OutOfMemory&) {
        empty_cpu_cache();  // cached blocks of other sizes may be what the system is missing
        p = cpu_alloc_fresh(cls);
      }
    }
    return std::make_shared<Storage>(p, nbytes, device, [cls](void* q) { cpu_release(q, cls); });
  }
#ifdef SINGA_LITE_WITH_CUDA
  void* p = cuda::allocate(device.index, nbytes);
  int index = device.index;
  return std::make_shared<Storage>(p, nbytes, device, [index, nbytes](void* q) { cuda::release(index, q, nbytes); });
#else
  throw ValueError(str("cannot allocate on ", device.str(), ": ", cuda_unavailable_reason()));
#endif
}

}  // namespace sl
