// cuBLAS, loaded at run time with dlopen. A CUDA build of singa_lite must import and run its CPU paths on
// machines without a GPU, a driver or the cuBLAS wheel, and must compile without cuBLAS headers (they ship
// only in the large nvidia-cublas wheel). So the few types and functions used here are declared below with
// the numeric values of NVIDIA's cuBLAS API (cublas_api.h, stable since cuBLAS 11), and the functions are
// resolved on first use from, in order:
//   1. <dir>/libcublas.so.<major>, where <dir> was given to set_library_dir() (the Python package passes
//      the nvidia/cu13/lib or nvidia/cublas/lib folder of the installed wheel);
//   2. the plain soname libcublas.so.<major> (LD_LIBRARY_PATH, ld.so.cache, an already loaded copy).
// <major> is the CUDA runtime major this build used (CUDART_VERSION / 1000).
// Failing to load raises sl::CudaError saying what to install; every cuBLAS call is checked (SL_CUBLAS).
// Nothing here aborts or exits.
#pragma once
#include <cuda_runtime.h>  // cudaStream_t; library_types.h (cudaDataType: CUDA_R_16F, ...)

#include <string>

#include "cuda/allocator.h"

namespace sl::cuda {

// ----- the subset of cublas_api.h used by singa_lite (values as NVIDIA documents them)
struct CublasContext;  // opaque, never dereferenced
using cublasHandle_t = CublasContext*;

enum cublasStatus_t : int {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16,
};

enum cublasOperation_t : int { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };

enum cublasMath_t : int {
  CUBLAS_DEFAULT_MATH = 0,         // full precision for Sgemm/Dgemm (no TF32, no emulation)
  CUBLAS_PEDANTIC_MATH = 2,
  CUBLAS_TF32_TENSOR_OP_MATH = 3,  // not used: float32 keeps full FP32 precision
  // Flag: mixed-precision reductions (split-K of float16 GEMMs) accumulate in the compute type.
  CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16,
};

enum cublasComputeType_t : int {
  CUBLAS_COMPUTE_16F = 64,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_PEDANTIC = 69,
  CUBLAS_COMPUTE_64F = 70,
};

enum cublasGemmAlgo_t : int { CUBLAS_GEMM_DEFAULT = -1 };

// cudaDataType comes with the CUDA runtime headers (library_types.h); these are the values cuBLAS expects.
static_assert(CUDA_R_32F == 0 && CUDA_R_64F == 1 && CUDA_R_16F == 2, "unexpected cudaDataType values");

// Entry points, resolved with dlsym. Those marked optional may be null (older libraries).
struct CublasApi {
  cublasStatus_t (*cublasCreate_v2)(cublasHandle_t* handle);
  cublasStatus_t (*cublasDestroy_v2)(cublasHandle_t handle);
  cublasStatus_t (*cublasSetStream_v2)(cublasHandle_t handle, cudaStream_t stream);
  cublasStatus_t (*cublasSetMathMode)(cublasHandle_t handle, cublasMath_t mode);  // optional
  cublasStatus_t (*cublasGetVersion_v2)(cublasHandle_t handle, int* version);
  const char* (*cublasGetStatusString)(cublasStatus_t status);  // optional
  cublasStatus_t (*cublasSgemmStridedBatched)(cublasHandle_t handle, cublasOperation_t transa,
                                              cublasOperation_t transb, int m, int n, int k, const float* alpha,
                                              const float* A, int lda, long long strideA, const float* B, int ldb,
                                              long long strideB, const float* beta, float* C, int ldc,
                                              long long strideC, int batchCount);
  cublasStatus_t (*cublasDgemmStridedBatched)(cublasHandle_t handle, cublasOperation_t transa,
                                              cublasOperation_t transb, int m, int n, int k, const double* alpha,
                                              const double* A, int lda, long long strideA, const double* B,
                                              int ldb, long long strideB, const double* beta, double* C, int ldc,
                                              long long strideC, int batchCount);
  cublasStatus_t (*cublasGemmStridedBatchedEx)(cublasHandle_t handle, cublasOperation_t transa,
                                               cublasOperation_t transb, int m, int n, int k, const void* alpha,
                                               const void* A, cudaDataType Atype, int lda, long long strideA,
                                               const void* B, cudaDataType Btype, int ldb, long long strideB,
                                               const void* beta, void* C, cudaDataType Ctype, int ldc,
                                               long long strideC, int batchCount, cublasComputeType_t computeType,
                                               cublasGemmAlgo_t algo);
};

// ----- loading
// The folder holding libcublas.so.<major>, tried before the plain soname. Takes effect at the next load
// attempt: after a failed attempt the library is looked for again; once loaded it stays loaded.
void set_library_dir(const std::string& dir);
// Loads cuBLAS on first use (thread-safe) and returns its entry points; throws CudaError when it cannot.
const CublasApi& cublas_api();
// For build info; never throw. cublas_version(): 0 when cuBLAS cannot be loaded, else cublasGetVersion_v2's
// value (major * 10000 + minor * 100 + patch). cublas_status(): "loaded <path>" or "not found: <why>" /
// "unusable: <why>" (attempts the load).
int cublas_version();
std::string cublas_status();

// The device's cuBLAS handle: created on first use with the device current, bound to the device's compute
// stream (cuda/context.h), default (full-precision) math. Handles live until the process exits.
cublasHandle_t cublas_handle(int device);

// Throws CudaError naming the call, the status (name, number, cuBLAS's description) and file:line.
void cublas_check(cublasStatus_t status, const char* call, const char* file, int line);
const char* cublas_status_name(cublasStatus_t status);

}  // namespace sl::cuda

// SL_CUBLAS(cublasXxx, args...): calls the loaded entry point and checks its status.
#define SL_CUBLAS(fn, ...) \
  ::sl::cuda::cublas_check(::sl::cuda::cublas_api().fn(__VA_ARGS__), #fn, __FILE__, __LINE__)
// SL_CUBLAS_ON(device, cublasXxx, args...): the same, for calls that only write their output (beta = 0) and may
// allocate (cuBLAS takes its workspace with cudaMalloc, and a kernel's code is loaded at its first launch):
// CUBLAS_STATUS_ALLOC_FAILED or _EXECUTION_FAILED returns the device's cached blocks to the driver and calls once
// more (allocator.h). A failure with another cause fails again and is reported then.
#define SL_CUBLAS_ON(device, fn, ...)                                                                          \
  ::sl::cuda::cublas_check(                                                                                    \
      ::sl::cuda::retry_if_out_of_memory(                                                                      \
          device, [&] { return ::sl::cuda::cublas_api().fn(__VA_ARGS__); },                                    \
          [](::sl::cuda::cublasStatus_t s) {                                                                   \
            return s == ::sl::cuda::CUBLAS_STATUS_ALLOC_FAILED || s == ::sl::cuda::CUBLAS_STATUS_EXECUTION_FAILED; \
          }),                                                                                                  \
      #fn, __FILE__, __LINE__)
