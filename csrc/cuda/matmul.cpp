// Matrix products on the GPU through cuBLAS (loaded at run time, cuda/cublas.h); int32/int64 through a tiled
// kernel (cuda/matmul_int.cu). Contract of cuda/kernels.h: a [..., M, K], b [..., K, N] with out's batch
// shape (possibly broadcast views: stride 0 on batch axes, or transposed views); out contiguous [..., M, N].
//
// cuBLAS is column-major. A row-major [M, N] buffer read column-major is out^T, and out^T = b^T a^T, so
// cuBLAS computes C = op(B) op(A) with m = N, n = M, k = K and ldc = N: no transposition of the output.
// A row-major operand with unit column stride, read column-major, is its own transpose (OP_N); one with
// unit row stride (a transposed view) is itself (OP_T). Operands with neither unit stride are packed first.
// Batches go through the strided-batched entry points: the innermost batch axes whose offsets are one
// stride times the batch index (contiguous, or all-zero strides when broadcast) form one call; any outer
// axes that do not collapse are looped over.
// Precision: float32 keeps FP32 (default math, no TF32); float64 DGEMM; float16 and bfloat16 in and out with
// float32 compute, as on the CPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/errors.h"
#include "ops/gemm_layout.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/cublas.h"
#include "cuda/kernels.h"

namespace sl::cuda {

void matmul_int(const Tensor& out, const Tensor& a, const Tensor& b);  // cuda/matmul_int.cu

namespace {

cublasOperation_t op_of(const MatLayout& l) { return l.trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

// Do batch axes [first, nb) of t collapse to a single stride, i.e. is the offset of their flattened
// (row-major) index i equal to i * stride? Axes of size 1 do not matter.
bool collapses(const Tensor& t, const Shape& batch, int first, int nb, int64_t* stride) {
  int64_t s = 0, inner = 1;
  bool have = false;
  for (int d = nb - 1; d >= first; --d) {
    if (batch[size_t(d)] == 1) continue;
    const int64_t sd = t.strides()[size_t(d)];
    if (!have) {
      s = sd;
      have = true;
    } else if (sd != s * inner) {
      return false;
    }
    inner *= batch[size_t(d)];
  }
  *stride = s;
  return true;
}

// bfloat16's 16-bit storage, a type of its own so that gemm_batched can tell it from float16's uint16_t.
struct BFloat16Bits {
  uint16_t bits;
};

// C (m x n, column-major, ldc) = op(A) op(B) for `count` matrices spaced by the given strides.
// beta = 0: C is only written, so a call repeated after an allocation failure (SL_CUBLAS_ON) gives the same result.
template <typename T>
void gemm_batched(int device, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                  const T* A, int lda, long long stride_a, const T* B, int ldb, long long stride_b, T* C, int ldc,
                  long long stride_c, int count) {
  if constexpr (std::is_same_v<T, float>) {
    const float alpha = 1.0f, beta = 0.0f;
    SL_CUBLAS_ON(device, cublasSgemmStridedBatched, h, ta, tb, m, n, k, &alpha, A, lda, stride_a, B, ldb, stride_b,
                 &beta, C, ldc, stride_c, count);
  } else if constexpr (std::is_same_v<T, double>) {
    const double alpha = 1.0, beta = 0.0;
    SL_CUBLAS_ON(device, cublasDgemmStridedBatched, h, ta, tb, m, n, k, &alpha, A, lda, stride_a, B, ldb, stride_b,
                 &beta, C, ldc, stride_c, count);
  } else {
    static_assert(std::is_same_v<T, uint16_t> || std::is_same_v<T, BFloat16Bits>,
                  "float16 and bfloat16 are passed as their 16-bit storage");
    const cudaDataType_t dt = std::is_same_v<T, uint16_t> ? CUDA_R_16F : CUDA_R_16BF;
    // CUBLAS_COMPUTE_32F: accumulate in float32, scale factors are float.
    const float alpha = 1.0f, beta = 0.0f;
    SL_CUBLAS_ON(device, cublasGemmStridedBatchedEx, h, ta, tb, m, n, k, &alpha, A, dt, lda, stride_a, B, dt,
                 ldb, stride_b, &beta, C, dt, ldc, stride_c, count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }
}

template <typename T>
void matmul_cublas(const Tensor& out, Tensor a, Tensor b, int device) {
  const int n = out.ndim(), nb = n - 2;
  const int64_t M = out.shape()[n - 2], N = out.shape()[n - 1], K = a.shape()[n - 1];
  check_gemm_dims(M, N, K);
  const MatLayout la = gemm_operand(a, M, K), lb = gemm_operand(b, K, N);

  // The innermost batch axes [first, nb) that collapse to one stride in both operands (out is contiguous).
  const Shape batch(out.shape().begin(), out.shape().begin() + nb);
  int first = nb;
  int64_t stride_a = 0, stride_b = 0;
  while (first > 0) {
    int64_t sa = 0, sb = 0;
    if (!collapses(a, batch, first - 1, nb, &sa) || !collapses(b, batch, first - 1, nb, &sb)) break;
    --first;
    stride_a = sa;
    stride_b = sb;
  }
  int64_t inner = 1, outer = 1;
  for (int d = 0; d < nb; ++d) (d < first ? outer : inner) *= batch[size_t(d)];
  const int64_t out_matrix = M * N;

  cublasHandle_t handle = cublas_handle(device);
  DeviceGuard guard(device);
  const T* pa = static_cast<const T*>(a.data_ptr());
  const T* pb = static_cast<const T*>(b.data_ptr());
  T* po = static_cast<T*>(out.data_ptr());
  std::vector<int64_t> idx(size_t(first), 0);  // odometer over the outer axes [0, first)
  for (int64_t o = 0; o < outer; ++o) {
    int64_t oa = 0, ob = 0;
    for (int d = 0; d < first; ++d) {
      oa += idx[size_t(d)] * a.strides()[size_t(d)];
      ob += idx[size_t(d)] * b.strides()[size_t(d)];
    }
    const int64_t oo = o * inner * out_matrix;
    // batchCount is an int: more matrices than that go in several calls.
    for (int64_t start = 0; start < inner; start += INT_MAX) {
      const int count = int(std::min<int64_t>(INT_MAX, inner - start));
      // Swapped operands: C^T = B^T A^T (file comment).
      gemm_batched<T>(device, handle, op_of(lb), op_of(la), int(N), int(M), int(K), pb + ob + start * stride_b,
                      int(lb.ld), stride_b, pa + oa + start * stride_a, int(la.ld), stride_a,
                      po + oo + start * out_matrix, int(N), out_matrix, count);
    }
    for (int d = first - 1; d >= 0; --d) {
      if (++idx[size_t(d)] < batch[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
  }
}

}  // namespace

void matmul(const Tensor& out, const Tensor& a, const Tensor& b) {
  const int n = out.ndim();
  SL_ASSERT(n >= 2 && a.ndim() == n && b.ndim() == n && out.is_contiguous());
  SL_ASSERT(a.dtype() == out.dtype() && b.dtype() == out.dtype());
  const int64_t K = a.shape()[n - 1];
  SL_ASSERT(b.shape()[n - 2] == K && a.shape()[n - 2] == out.shape()[n - 2] && b.shape()[n - 1] == out.shape()[n - 1]);
  for (int d = 0; d < n - 2; ++d) SL_ASSERT(a.shape()[d] == out.shape()[d] && b.shape()[d] == out.shape()[d]);
  if (out.numel() == 0) return;  // M, N or a batch axis is 0: nothing to write
  const int device = out.device().index;
  if (K == 0) {  // empty sums: zeros (all-zero bits is 0 in every dtype)
    cudaStream_t st = stream(device);
    DeviceGuard guard(device);
    SL_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), st));
    return;
  }
  switch (out.dtype()) {
    case DType::kFloat32: return matmul_cublas<float>(out, a, b, device);
    case DType::kFloat64: return matmul_cublas<double>(out, a, b, device);
    case DType::kFloat16: return matmul_cublas<uint16_t>(out, a, b, device);
    case DType::kBFloat16: return matmul_cublas<BFloat16Bits>(out, a, b, device);
    case DType::kInt32:
    case DType::kInt64: {
      DeviceGuard guard(device);
      return matmul_int(out, a, b);
    }
    default:
      throw TypeError(str("matmul: expected a numeric dtype, got ", dtype_name(out.dtype())));
  }
}

}  // namespace sl::cuda
