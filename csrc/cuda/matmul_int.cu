// Integer matmul (int32, int64): cuBLAS has no integer GEMM of these types, so a shared-memory tiled kernel.
// Same contract as cuda::matmul (a: [..., M, K], b: [..., K, N], any strides, batch axes possibly broadcast;
// out contiguous [..., M, N]). Products and sums wrap around like the CPU's loop (done in the unsigned type,
// where wrapping is defined; the order of wrapped sums does not change the result, so CPU and GPU agree).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/errors.h"
#include "core/tensor.h"
#include "cuda/check.h"
#include "cuda/context.h"

namespace sl::cuda {
namespace {

constexpr int kTile = 16;
constexpr unsigned kMaxGrid = 65535;  // per grid axis; grid-stride loops cover the rest

// Batch axes of the operands: offsets of the flattened batch index (row-major over `shape`).
struct BatchGeom {
  int nb = 0;
  int64_t shape[kMaxDims];
  int64_t sa[kMaxDims];
  int64_t sb[kMaxDims];
};

template <typename T>
__global__ void __launch_bounds__(kTile* kTile)
    matmul_int_kernel(T* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b, int64_t M, int64_t N,
                      int64_t K, int64_t sam, int64_t sak, int64_t sbk, int64_t sbn, int64_t batches, BatchGeom g) {
  using U = std::make_unsigned_t<T>;
  __shared__ U as[kTile][kTile];      // as[row][k]
  __shared__ U bs[kTile][kTile + 1];  // bs[k][col]
  const int tx = threadIdx.x, ty = threadIdx.y;
  // Every loop bound below depends on the block only, so all threads reach each __syncthreads().
  for (int64_t batch = blockIdx.z; batch < batches; batch += gridDim.z) {
    int64_t oa = 0, ob = 0;
    for (int64_t d = g.nb - 1, rest = batch; d >= 0; --d) {
      const int64_t q = rest / g.shape[d], i = rest - q * g.shape[d];
      oa += i * g.sa[d];
      ob += i * g.sb[d];
      rest = q;
    }
    const T* pa = a + oa;
    const T* pb = b + ob;
    T* po = out + batch * M * N;
    for (int64_t i0 = int64_t(blockIdx.y) * kTile; i0 < M; i0 += int64_t(gridDim.y) * kTile) {
      for (int64_t j0 = int64_t(blockIdx.x) * kTile; j0 < N; j0 += int64_t(gridDim.x) * kTile) {
        const int64_t i = i0 + ty, j = j0 + tx;
        U acc = 0;
        for (int64_t k0 = 0; k0 < K; k0 += kTile) {
          const int64_t ka = k0 + tx, kb = k0 + ty;
          as[ty][tx] = (i < M && ka < K) ? U(pa[i * sam + ka * sak]) : U(0);
          bs[ty][tx] = (kb < K && j < N) ? U(pb[kb * sbk + j * sbn]) : U(0);
          __syncthreads();
#pragma unroll
          for (int kk = 0; kk < kTile; ++kk) acc += as[ty][kk] * bs[kk][tx];
          __syncthreads();
        }
        if (i < M && j < N) po[i * N + j] = T(acc);
      }
    }
  }
}

unsigned grid_extent(int64_t n) { return unsigned(std::min<int64_t>(std::max<int64_t>(n, 1), kMaxGrid)); }

template <typename T>
void launch(const Tensor& out, const Tensor& a, const Tensor& b, int device) {
  const int n = out.ndim();
  const int64_t M = out.shape()[n - 2], N = out.shape()[n - 1], K = a.shape()[n - 1];
  BatchGeom g;
  g.nb = n - 2;
  int64_t batches = 1;
  for (int d = 0; d < g.nb; ++d) {
    g.shape[d] = out.shape()[d];
    g.sa[d] = a.strides()[d];
    g.sb[d] = b.strides()[d];
    batches *= out.shape()[d];
  }
  const dim3 block(kTile, kTile);
  const dim3 grid(grid_extent((N + kTile - 1) / kTile), grid_extent((M + kTile - 1) / kTile), grid_extent(batches));
  matmul_int_kernel<T><<<grid, block, 0, stream(device)>>>(
      out.data<T>(), a.data<T>(), b.data<T>(), M, N, K, a.strides()[n - 2], a.strides()[n - 1], b.strides()[n - 2],
      b.strides()[n - 1], batches, g);
  SL_CUDA_LAUNCHED("matmul (integer)");
}

}  // namespace

// Called by cuda::matmul (matmul.cpp) once shapes are checked and M, N, K > 0; the device is current.
void matmul_int(const Tensor& out, const Tensor& a, const Tensor& b) {
  const int device = out.device().index;
  switch (a.dtype()) {
    case DType::kInt32: return launch<int32_t>(out, a, b, device);
    case DType::kInt64: return launch<int64_t>(out, a, b, device);
    default: throw TypeError(str("matmul (integer kernel): unsupported dtype ", dtype_name(a.dtype())));
  }
}

}  // namespace sl::cuda
