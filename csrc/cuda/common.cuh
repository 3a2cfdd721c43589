// What every CUDA kernel file shares: the device type of each DType (float16 is __half, bfloat16 is
// __nv_bfloat16, both computed in
// float32), a dispatch macro binding `scalar_t` to it, strided indexing for views of up to kMaxDims axes,
// and launching on the device's compute stream with a checked launch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/errors.h"
#include "core/tensor.h"
#include "cuda/check.h"
#include "cuda/context.h"

namespace sl::cuda {

// Arithmetic type of a storage type: float for __half and __nv_bfloat16, the type itself otherwise.
template <typename T> struct ComputeOf { using type = T; };
template <> struct ComputeOf<__half> { using type = float; };
template <> struct ComputeOf<__nv_bfloat16> { using type = float; };
template <typename T> using compute_of = typename ComputeOf<T>::type;

template <typename T>
__device__ __forceinline__ compute_of<T> load(const T* p) { return *p; }
template <>
__device__ __forceinline__ float load<__half>(const __half* p) { return __half2float(*p); }
template <>
__device__ __forceinline__ float load<__nv_bfloat16>(const __nv_bfloat16* p) { return __bfloat162float(*p); }

// Converts a computed value to storage type T (float -> __half / __nv_bfloat16 rounds to nearest even;
// to bool: != 0).
template <typename T, typename C>
__device__ __forceinline__ T store_as(C v) {
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(float(v));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(float(v));
  else if constexpr (std::is_same_v<T, bool>) return v != C(0);
  else return T(v);
}

// A view's geometry passed by value to kernels: offset of the i-th element (row-major order) in elements.
struct Strided {
  int ndim = 0;
  int64_t shape[kMaxDims];
  int64_t strides[kMaxDims];

  __host__ __device__ __forceinline__ int64_t offset(int64_t i) const {
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t q = i / shape[d];
      off += (i - q * shape[d]) * strides[d];
      i = q;
    }
    return off;
  }
};

inline Strided strided(const Tensor& t) {
  Strided s;
  s.ndim = t.ndim();
  for (int d = 0; d < t.ndim(); ++d) {
    s.shape[d] = t.shape()[d];
    s.strides[d] = t.strides()[d];
  }
  return s;
}

}  // namespace sl::cuda

// SL_CUDA_DISPATCH_{ALL,NUMERIC,FLOAT}(dtype, op_name, body): body() with `scalar_t` the device type.
#define SL_CUDA_CASE(enum_val, type, ...) \
  case enum_val: {                        \
    using scalar_t = type;                \
    __VA_ARGS__();                        \
    break;                                \
  }
#define SL_CUDA_FLOAT_CASES(...)                                \
  SL_CUDA_CASE(::sl::DType::kFloat16, __half, __VA_ARGS__)      \
  SL_CUDA_CASE(::sl::DType::kFloat32, float, __VA_ARGS__)       \
  SL_CUDA_CASE(::sl::DType::kFloat64, double, __VA_ARGS__)      \
  SL_CUDA_CASE(::sl::DType::kBFloat16, __nv_bfloat16, __VA_ARGS__)
#define SL_CUDA_NUMERIC_CASES(...)                              \
  SL_CUDA_FLOAT_CASES(__VA_ARGS__)                              \
  SL_CUDA_CASE(::sl::DType::kInt32, int32_t, __VA_ARGS__)       \
  SL_CUDA_CASE(::sl::DType::kInt64, int64_t, __VA_ARGS__)
#define SL_CUDA_DISPATCH_ALL(dtype, op_name, ...)                                              \
  switch (dtype) {                                                                             \
    SL_CUDA_NUMERIC_CASES(__VA_ARGS__)                                                         \
    SL_CUDA_CASE(::sl::DType::kBool, bool, __VA_ARGS__)                                        \
    default: throw ::sl::TypeError(::sl::str(op_name, ": unsupported dtype ", int(dtype)));    \
  }
#define SL_CUDA_DISPATCH_NUMERIC(dtype, op_name, ...)                                          \
  switch (dtype) {                                                                             \
    SL_CUDA_NUMERIC_CASES(__VA_ARGS__)                                                         \
    default: throw ::sl::TypeError(::sl::str(op_name, ": unsupported dtype ", int(dtype)));    \
  }
#define SL_CUDA_DISPATCH_FLOAT(dtype, op_name, ...)                                            \
  switch (dtype) {                                                                             \
    SL_CUDA_FLOAT_CASES(__VA_ARGS__)                                                           \
    default: throw ::sl::TypeError(::sl::str(op_name, ": unsupported dtype ", int(dtype)));    \
  }
