#include "core/storage.h"

#include <cstdlib>

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
    constexpr size_t kAlign = 64;  // cache line; lets the vectorised loops use aligned loads
    size_t padded = ((nbytes + kAlign - 1) / kAlign) * kAlign;
    if (padded == 0) padded = kAlign;
    void* p = std::aligned_alloc(kAlign, padded);
    if (!p) throw OutOfMemory(str("cannot allocate ", nbytes, " bytes on the CPU"));
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
