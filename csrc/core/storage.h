// Storage: a block of bytes on one device, owned through shared_ptr (views share it; no manual counts).
// The deleter knows how to free the bytes: our allocator, or a release of a foreign owner (numpy array).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>

#include "core/device.h"

namespace sl {

// The largest block the allocators hand out (4 EiB, beyond any machine). Below it, rounding a size up to
// its size class cannot wrap around; above it, a wrapped size class once gave a 16 EiB tensor a tiny block.
constexpr size_t kMaxAllocation = size_t(1) << 62;
// Throws OutOfMemory naming the size and the device when nbytes > kMaxAllocation.
void check_allocation_size(size_t nbytes, const Device& device);

class Storage {
 public:
  using Deleter = std::function<void(void*)>;
  Storage(void* data, size_t nbytes, Device device, Deleter deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // Allocates nbytes on device (64-byte aligned on the CPU); throws OutOfMemory / CudaError.
  static std::shared_ptr<Storage> allocate(size_t nbytes, Device device);

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  size_t nbytes_;
  Device device_;
  Deleter deleter_;
};

// The CPU block cache behind Storage::allocate (see storage.cpp): bytes held for reuse, and a release
// of all of them back to the system.
size_t cpu_cache_bytes();
void empty_cpu_cache();

}  // namespace sl
