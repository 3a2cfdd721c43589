// NCCL's C ABI as singa_lite uses it, and the run-time loaded function table: the internal half of the
// nccl backend, shared by nccl_api.cpp (which opens libnccl with dlopen and implements the library functions
// of nccl.h) and nccl.cpp (the communicator, which calls NCCL through api()).
//
// Why this header exists: libnccl is opened at run time, never linked, and builds need no NCCL headers (see
// nccl.h), so NCCL's types, values and function signatures are declared here instead of included. They live
// in namespace detail because they are not part of singa_lite's interface: nothing outside csrc/comm/nccl*.cpp
// includes this file (the bindings use nccl.h).
#pragma once
#include <cuda_runtime.h>  // cudaStream_t

#include <cstddef>

namespace sl::cuda::nccl::detail {

// ---------------------------------------------------------------- NCCL's ABI, as far as we use it
// Declared here rather than included: builds need no NCCL headers and the library is optional at run time.
// The numbers are those of NCCL's nccl.h (checked against NCCL 2.32.3); NCCL keeps them stable across 2.x.
// Its enums are C enums of int size; enums with an int underlying type have the same calling convention.
using ncclComm_t = struct ncclComm*;  // opaque
struct ncclUniqueId {
  char internal[128];  // NCCL_UNIQUE_ID_BYTES; passed by value to ncclCommInitRankConfig
};
static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId is 128 bytes");

enum ncclResult_t : int {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,  // non-blocking communicators: the call goes on; poll ncclCommGetAsyncError
};
enum ncclDataType_t : int {
  ncclInt32 = 2,
  ncclInt64 = 4,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,  // NCCL 2.10 and later
};
enum ncclRedOp_t : int { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };

// ncclConfig_t as NCCL 2.14 defined it (the first version with a config): size, magic, version, blocking.
// NCCL reads `size` bytes of it and takes every field that is not there (and every field newer than
// `version`) at its default, so this older, shorter layout stays valid for every later NCCL.
struct ncclConfig_v21400 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
};
constexpr unsigned kConfigMagic = 0xcafebeef;  // NCCL_API_MAGIC
constexpr unsigned kConfigVersion = 21400;     // NCCL_VERSION(2, 14, 0)
constexpr int kMinVersion = 21400;             // non-blocking communicators and ncclCommFinalize

struct Api {
  ncclResult_t (*GetVersion)(int*);
  ncclResult_t (*GetUniqueId)(ncclUniqueId*);
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_v21400*);
  ncclResult_t (*CommFinalize)(ncclComm_t);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*);
  const char* (*GetErrorString)(ncclResult_t);
  const char* (*GetLastError)(ncclComm_t);  // optional (NCCL 2.13+)
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*Reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*GroupStart)();
  ncclResult_t (*GroupEnd)();
};

// ---------------------------------------------------------------- the loaded library (nccl_api.cpp)
// The loaded API; throws CommError saying how to install NCCL when it cannot be loaded.
const Api& api();
// NCCL's text for a result ("unknown NCCL error" when it has none); loads NCCL like api().
const char* error_string(ncclResult_t r);

}  // namespace sl::cuda::nccl::detail
