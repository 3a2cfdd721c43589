#include "core/storage.h"

#include <cstdlib>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "core/errors.h"
#ifdef SINGA_LITE_WITH_CUDA
#include "cuda/runtime.h"
#endif

namespace sl {

Storage::Storage(void* data, size_t nbytes, Device device, Deleter deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (deleter_) deleter_(data_);
}

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device) {
  if (device.is_cpu()) {
    // Small blocks: cache-line aligned. Large ones: 2 MiB aligned and marked for transparent huge pages,
    // so a fresh output costs a few page faults instead of one per 4 KiB (numpy does the same).
    constexpr size_t kLine = 64, kHugePage = size_t(2) << 20, kHugeFrom = size_t(4) << 20;
    const size_t align = nbytes >= kHugeFrom ? kHugePage : kLine;
    size_t padded = ((nbytes + align - 1) / align) * align;
    if (padded == 0) padded = align;
    void* p = std::aligned_alloc(align, padded);
    if (!p) throw OutOfMemory(str("cannot allocate ", nbytes, " bytes on the CPU"));
#ifdef MADV_HUGEPAGE
    if (align == kHugePage) madvise(p, padded, MADV_HUGEPAGE);  // advisory: failure only costs speed
#endif
    return std::make_shared<Storage>(p, nbytes, device, [](void* q) { std::free(q); });
  }
#ifdef SINGA_LITE_WITH_CUDA
  void* p = cuda::malloc_on(device.index, nbytes);
  int index = device.index;
  return std::make_shared<Storage>(p, nbytes, device, [index](void* q) { cuda::free_on(index, q); });
#else
  throw ValueError(str("cannot allocate on ", device.str(), ": ", cuda_unavailable_reason()));
#endif
}

}  // namespace sl
