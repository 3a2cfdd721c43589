// Sparse-exchange kernels on the GPU (DistOpt's sparsification): selection through CUB (part of the CUDA
// toolkit): a stream compaction for threshold mode, a radix sort of magnitudes for exact top-K; then a
// gather, and an add of (index, value) pairs whose indices are distinct, so it needs no atomics and gives
// the same result in any thread order.
#include <cub/cub.cuh>

#include <cmath>

#include "cuda/common.cuh"
#include "cuda/index_faults.h"
#include "cuda/kernels.h"

namespace sl::cuda {
namespace {

// |v| in the compute type, NaN mapped to +inf (always selected; the finiteness vote then sees it). fabs clears the
// sign of -0.0 too (a compare-and-negate kept it): every zero is the same key, so the top-K cut among zeros follows
// the index rule below, as on the CPU (cpu/sparse.cpp), whatever a radix sort does with negative zeros.
template <typename T>
__device__ __forceinline__ compute_of<T> magnitude(T v) {
  using C = compute_of<T>;
  const C c = load(&v);
  return isnan(c) ? C(INFINITY) : C(fabs(c));
}

template <typename T>
struct AtLeast {
  const T* x;
  double spars;
  __device__ __forceinline__ bool operator()(int64_t i) const { return double(magnitude(x[i])) >= spars; }
};

template <typename T>
__global__ void magnitudes_kernel(compute_of<T>* keys, int64_t* ids, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    keys[i] = magnitude(x[i]);
    ids[i] = i;
  }
}

// An index outside [0, faults.bound) reads nothing (its entry becomes 0) and is reported (index_faults.h).
template <typename T>
__global__ void take_kernel(T* out, const T* x, const int64_t* idx, int64_t n, IndexFaultSlot faults) {
  const T zero = store_as<T>(compute_of<T>(0));
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = idx[i];
    out[i] = index_in_range(faults, j) ? x[j] : zero;
  }
}

// An index outside [0, faults.bound) writes nothing and is reported: an index from a peer must never write out of
// bounds.
template <typename T>
__global__ void index_add_kernel(T* dense, const int64_t* idx, const T* vals, int64_t n, IndexFaultSlot faults) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = idx[i];
    if (index_in_range(faults, j)) dense[j] = store_as<T>(load(dense + j) + load(vals + i));
  }
}

// Scratch memory from the caching allocator, as an int64 tensor of at least `bytes` bytes.
Tensor scratch(size_t bytes, Device device) {
  return Tensor::empty({int64_t((bytes + 7) / 8) + 1}, DType::kInt64, device);
}

}  // namespace

namespace {

__global__ void iota_kernel(int64_t* ids, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    ids[i] = i;
}

template <typename T>
Tensor select_impl(const Tensor& x, double spars, int64_t k) {
  using C = compute_of<T>;
  const int dev = x.device().index;
  cudaStream_t st = stream(dev);
  const int64_t n = x.numel();
  const T* p = static_cast<const T*>(x.data_ptr());
  const Launch l = launch_for(n, dev);
  Tensor ids = Tensor::empty({n}, DType::kInt64, x.device());
  Tensor chosen = Tensor::empty({n}, DType::kInt64, x.device());
  if (k < 0) {  // threshold mode: compact the indices i with |x[i]| >= spars, keeping their order
    if (n == 0) return chosen;
    iota_kernel<<<l.blocks, l.threads, 0, st>>>(ids.data<int64_t>(), n);
    SL_CUDA_LAUNCHED("select_significant (indices)");
    Tensor count = Tensor::empty({1}, DType::kInt64, x.device());
    AtLeast<T> pred{p, spars};
    size_t bytes = 0;
    SL_CUDA_CHECK(cub::DeviceSelect::If(nullptr, bytes, ids.data<int64_t>(), chosen.data<int64_t>(),
                                        count.data<int64_t>(), n, pred, st));
    Tensor tmp = scratch(bytes, x.device());
    SL_CUDA_CHECK(cub::DeviceSelect::If(tmp.data_ptr(), bytes, ids.data<int64_t>(), chosen.data<int64_t>(),
                                        count.data<int64_t>(), n, pred, st));
    int64_t m = 0;
    SL_CUDA_CHECK(cudaMemcpyAsync(&m, count.data_ptr(), sizeof(m), cudaMemcpyDeviceToHost, st));
    SL_CUDA_CHECK(cudaStreamSynchronize(st));  // the result's length is data: the host must know it
    raise_index_faults(dev);  // the host waited: report what earlier take / index_add found (index_faults.h)
    return chosen.slice(0, 0, m, 1).clone();
  }
  // top-K: sort (magnitude, index) pairs by magnitude, descending; keep the first k indices, ascending. The radix
  // sort is stable and the pairs enter in index order, so among equal magnitudes the lower index wins: the CPU's
  // rule (cpu/sparse.cpp), hence the same selection on both devices.
  Tensor top = Tensor::empty({k}, DType::kInt64, x.device());
  if (k == 0) return top;
  Tensor keys = Tensor::empty({n}, dtype_of<C>::value, x.device());
  Tensor keys_sorted = Tensor::empty({n}, dtype_of<C>::value, x.device());
  magnitudes_kernel<T><<<l.blocks, l.threads, 0, st>>>(keys.template data<C>(), ids.data<int64_t>(), p, n);
  SL_CUDA_LAUNCHED("select_significant (magnitudes)");
  const int key_bits = int(sizeof(C) * 8);
  size_t bytes = 0;
  SL_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(nullptr, bytes, keys.template data<C>(),
                                                          keys_sorted.template data<C>(), ids.data<int64_t>(),
                                                          chosen.data<int64_t>(), n, 0, key_bits, st));
  Tensor tmp = scratch(bytes, x.device());
  SL_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(tmp.data_ptr(), bytes, keys.template data<C>(),
                                                          keys_sorted.template data<C>(), ids.data<int64_t>(),
                                                          chosen.data<int64_t>(), n, 0, key_bits, st));
  size_t bytes2 = 0;
  SL_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, bytes2, chosen.data<int64_t>(), top.data<int64_t>(), k, 0, 64,
                                               st));
  Tensor tmp2 = scratch(bytes2, x.device());
  SL_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(tmp2.data_ptr(), bytes2, chosen.data<int64_t>(), top.data<int64_t>(),
                                               k, 0, 64, st));
  return top;
}

}  // namespace

Tensor select_significant(const Tensor& x, double spars, int64_t k) {
  DeviceGuard guard(x.device().index);
  switch (x.dtype()) {
    case DType::kFloat16: return select_impl<__half>(x, spars, k);
    case DType::kBFloat16: return select_impl<__nv_bfloat16>(x, spars, k);
    case DType::kFloat32: return select_impl<float>(x, spars, k);
    case DType::kFloat64: return select_impl<double>(x, spars, k);
    default: throw TypeError(str("select_significant: expected a floating dtype, got ", dtype_name(x.dtype())));
  }
}

void take(const Tensor& out, const Tensor& x, const Tensor& idx) {
  const int64_t n = idx.numel();
  if (n == 0) return;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  const IndexFaultSlot faults = index_fault_slot(dev, kTake, x.numel());
  SL_CUDA_DISPATCH_ALL(x.dtype(), "take", [&] {
    const Launch l = launch_for(n, dev);
    take_kernel<scalar_t><<<l.blocks, l.threads, 0, stream(dev)>>>(
        static_cast<scalar_t*>(out.data_ptr()), static_cast<const scalar_t*>(x.data_ptr()), idx.data<int64_t>(), n,
        faults);
    SL_CUDA_LAUNCHED("take");
  });
}

void index_add(const Tensor& dense, const Tensor& idx, const Tensor& vals) {
  const int64_t n = idx.numel();
  if (n == 0) return;
  const int dev = dense.device().index;
  DeviceGuard guard(dev);
  const IndexFaultSlot faults = index_fault_slot(dev, kIndexAdd, dense.numel());
  SL_CUDA_DISPATCH_NUMERIC(dense.dtype(), "index_add", [&] {
    const Launch l = launch_for(n, dev);
    index_add_kernel<scalar_t><<<l.blocks, l.threads, 0, stream(dev)>>>(
        static_cast<scalar_t*>(dense.data_ptr()), idx.data<int64_t>(), static_cast<const scalar_t*>(vals.data_ptr()),
        n, faults);
    SL_CUDA_LAUNCHED("index_add");
  });
}

}  // namespace sl::cuda
