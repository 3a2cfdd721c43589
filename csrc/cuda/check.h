// Checked CUDA calls. A failure becomes sl::CudaError naming the call, the runtime's message and file:line;
// nothing aborts. Kernel launches are checked with SL_CUDA_LAUNCHED() right after the <<<...>>>.
#pragma once
#include <cuda_runtime.h>

#include "core/errors.h"

#define SL_CUDA_CHECK(call)                                                                              \
  do {                                                                                                   \
    cudaError_t err_ = (call);                                                                           \
    if (err_ != cudaSuccess) {                                                                           \
      cudaGetLastError(); /* clear it: the next launch check must not report this failure as its own */  \
      throw ::sl::CudaError(::sl::str(#call, " failed: ", cudaGetErrorString(err_), " (", __FILE__, ":",   \
                                      __LINE__, ")"));                                                   \
    }                                                                                                    \
  } while (0)

// A launch that failed for lack of memory (a kernel's code is loaded at its first launch, which needs device memory)
// is a MemoryError, as an allocation would be.
#define SL_CUDA_LAUNCHED(kernel_name)                                                                   \
  do {                                                                                                  \
    cudaError_t err_ = cudaGetLastError();                                                              \
    if (err_ == cudaErrorMemoryAllocation)                                                              \
      throw ::sl::OutOfMemory(::sl::str("launch of ", kernel_name, " failed: out of GPU memory (a kernel's "   \
                                        "code is loaded at its first launch). Free tensors, call "           \
                                        "Device.empty_cache(), or set CUDA_MODULE_LOADING=EAGER (",          \
                                        __FILE__, ":", __LINE__, ")"));                                      \
    if (err_ != cudaSuccess)                                                                            \
      throw ::sl::CudaError(::sl::str("launch of ", kernel_name, " failed: ", cudaGetErrorString(err_), \
                                      " (", __FILE__, ":", __LINE__, ")"));                             \
  } while (0)
