// Matrix products through OpenBLAS (scipy-openblas32: 32-bit indices, scipy_-prefixed symbols).
// A transposed view is passed to GEMM as a transposition flag, not copied; only operands whose last two
// axes are strided in both directions get packed. float16 and bfloat16 compute in float32; integers use a plain loop.
//
// One thread pool: OpenBLAS runs single-threaded (set when the module loads) and every GEMM is split here
// over our OpenMP threads. With two pools on the same cores, each pool's idle workers spin while the other
// works; in a CNN training step that made every GEMM about twice as slow as alone (docs/benchmarks.md).
#include <cblas.h>
#include <omp.h>

#include <array>
#include <algorithm>
#include <cctype>
#include <climits>
#include <string>
#include <vector>

#include "core/errors.h"
#include "ops/gemm_layout.h"
#include "cpu/kernels.h"
#include "cpu/loop.h"

namespace sl::cpu {
namespace {

// Iterates the batch axes (all but the last two) of out / a / b, calling fn with element offsets.
template <typename Fn>
void for_each_batch(const Tensor& out, const Tensor& a, const Tensor& b, Fn&& fn) {
  const int nb = out.ndim() - 2;
  int64_t batches = 1;
  for (int d = 0; d < nb; ++d) batches *= out.shape()[d];
  std::vector<int64_t> idx(nb, 0);
  for (int64_t i = 0; i < batches; ++i) {
    int64_t oa = 0, ob = 0, oo = 0;
    for (int d = 0; d < nb; ++d) {
      oa += idx[d] * a.strides()[d];
      ob += idx[d] * b.strides()[d];
      oo += idx[d] * out.strides()[d];
    }
    fn(oo, oa, ob);
    for (int d = nb - 1; d >= 0; --d) {
      if (++idx[d] < out.shape()[d]) break;
      idx[d] = 0;
    }
  }
}

template <typename T>
void gemm_call(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
               int64_t ldb, T* C, int64_t ldc) {
  auto t = [](bool x) { return x ? CblasTrans : CblasNoTrans; };
  if constexpr (std::is_same_v<T, float>)
    scipy_cblas_sgemm(CblasRowMajor, t(ta), t(tb), blasint(M), blasint(N), blasint(K), 1.0f, A, blasint(lda), B,
                      blasint(ldb), 0.0f, C, blasint(ldc));
  else
    scipy_cblas_dgemm(CblasRowMajor, t(ta), t(tb), blasint(M), blasint(N), blasint(K), 1.0, A, blasint(lda), B,
                      blasint(ldb), 0.0, C, blasint(ldc));
}

// Work (multiply-adds) below which a GEMM runs on one thread: forking costs a few microseconds.
constexpr int64_t kGemmGrain = int64_t(1) << 18;
// The inner dimension is cut into chunks of this size when the output is too small to share out; the chunk
// size does not depend on the thread count, so neither does the result (partials are summed in order).
constexpr int64_t kSplitK = 8192;

// OpenBLAS's AVX-512 cores compute a product of at most about 100^3 multiply-adds directly, without packing
// its operands into buffers first (its "small matrix" path). The thin GEMMs of a small convolution (20 x 25
// weights against 36864 columns in LeNet's first layer) spend most of their time packing, so they are cut into
// pieces under that size. Other cores (Haswell, Zen's AVX2 kernels) have no such path and pieces only add
// calls, so the pieces are cut only when the core OpenBLAS chose is one of these (the measurements:
// docs/benchmarks/cpu_core.md, "Measurements behind the kernels' design").
constexpr int64_t kDirectWork = 1000000;
constexpr int64_t kDirectMinPiece = 256;  // columns or K: thinner pieces cost more in calls than the direct path saves

bool blas_computes_small_directly() {
  static const bool yes = [] {
    std::string core = scipy_openblas_get_corename();  // "SkylakeX", "Haswell", "Zen", ...
    for (char& ch : core) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    for (const char* avx512 : {"skylakex", "cooperlake", "sapphirerapids"})
      if (core.find(avx512) != std::string::npos) return true;
    return false;
  }();
  return yes;
}

// C = op(A) @ op(B) on up to max_threads() threads, each calling single-threaded BLAS on a block:
// the larger of M / N is split when it gives every thread a reasonable block, otherwise K is split and the
// partial products are summed (a dW GEMM of a small convolution: 20 x 25 outputs over K = 147456). Thin
// products are cut finer, into pieces OpenBLAS computes directly (above), even on one thread.
template <typename T>
void gemm_parallel(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
                   int64_t ldb, T* C, int64_t ldc, int max_threads) {
  const int64_t work = M * N * K;
  const int nt = int(std::clamp<int64_t>(work / kGemmGrain, 1, std::max(max_threads, 1)));
  const bool cut_for_direct = work > kDirectWork && blas_computes_small_directly();
  if (nt <= 1 && !cut_for_direct) return gemm_call<T>(ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
  // Element (i, k) of op(A) and (k, j) of op(B), as pointers.
  auto a_at = [&](int64_t i, int64_t k) { return ta ? A + k * lda + i : A + i * lda + k; };
  auto b_at = [&](int64_t k, int64_t j) { return tb ? B + j * ldb + k : B + k * ldb + j; };
  constexpr int64_t kMinBlock = 32;
  if (std::max(M, N) >= kMinBlock * nt || K < 2 * kSplitK) {
    const bool by_cols = N >= M;
    const int64_t extent = by_cols ? N : M;
    int64_t parts = std::min<int64_t>(nt, (extent + 15) / 16);
    int64_t block = ((extent + parts - 1) / parts + 15) / 16 * 16;  // multiples of 16: whole SIMD tiles
    if (cut_for_direct) {
      const int64_t direct = kDirectWork / ((by_cols ? M : N) * K) / 16 * 16;
      if (direct >= kDirectMinPiece && direct < block) {
        block = direct;
        parts = (extent + block - 1) / block;
      }
    }
    if (parts <= 1) return gemm_call<T>(ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
    auto part = [&](int64_t p) {
      const int64_t lo = p * block, hi = std::min(extent, lo + block);
      if (lo >= hi) return;
      if (by_cols)
        gemm_call<T>(ta, tb, M, hi - lo, K, A, lda, b_at(0, lo), ldb, C + lo, ldc);
      else
        gemm_call<T>(ta, tb, hi - lo, N, K, a_at(lo, 0), lda, B, ldb, C + lo * ldc, ldc);
    };
    run_chunks(nt, parts, [](void* f, int64_t p) { (*static_cast<decltype(part)*>(f))(p); }, &part);
    return;
  }
  int64_t split = kSplitK;  // depends on the shape only, never on the thread count
  const int64_t direct_split =  // 0 when even kDirectMinPiece would not be direct
      kDirectWork / (M * N) / kDirectMinPiece * kDirectMinPiece;
  if (cut_for_direct && direct_split > 0) split = std::min(direct_split, kSplitK);
  const int64_t chunks = (K + split - 1) / split;
  std::vector<T> partial(static_cast<size_t>((chunks - 1) * M * N));
  auto k_chunk = [&](int64_t c) {
    const int64_t k0 = c * split, kc = std::min(K, k0 + split) - k0;
    if (c == 0)
      gemm_call<T>(ta, tb, M, N, kc, a_at(0, k0), lda, b_at(k0, 0), ldb, C, ldc);
    else
      gemm_call<T>(ta, tb, M, N, kc, a_at(0, k0), lda, b_at(k0, 0), ldb, partial.data() + (c - 1) * M * N, N);
  };
  run_chunks(nt, chunks, [](void* f, int64_t c) { (*static_cast<decltype(k_chunk)*>(f))(c); }, &k_chunk);
  for (int64_t c = 1; c < chunks; ++c) {
    const T* p = partial.data() + (c - 1) * M * N;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] += p[i * N + j];
  }
}

template <typename T>
void matmul_blas(const Tensor& out, Tensor a, Tensor b) {
  const int n = out.ndim();
  const int64_t M = out.shape()[n - 2], N = out.shape()[n - 1], K = a.shape()[n - 1];
  check_gemm_dims(M, N, K);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    fill(out, 0.0);
    return;
  }
  const MatLayout la = gemm_operand(a, M, K), lb = gemm_operand(b, K, N);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  int64_t batches = 1;
  for (int d = 0; d < n - 2; ++d) batches *= out.shape()[d];
  const int max_threads = cpu::max_threads();
  if (max_threads > 1 && batches >= max_threads && batches * M * N * K >= 2 * kGemmGrain) {
    // Many small products (attention-style batches): one whole GEMM per task.
    std::vector<std::array<int64_t, 3>> offsets;
    offsets.reserve(static_cast<size_t>(batches));
    for_each_batch(out, a, b, [&](int64_t oo, int64_t oa, int64_t ob) { offsets.push_back({oo, oa, ob}); });
    parallel_range(batches, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const auto& o = offsets[size_t(i)];
        gemm_call<T>(la.trans, lb.trans, M, N, K, pa + o[1], la.ld, pb + o[2], lb.ld, po + o[0], N);
      }
    }, M * N * K);
    return;
  }
  for_each_batch(out, a, b, [&](int64_t oo, int64_t oa, int64_t ob) {
    gemm_parallel<T>(la.trans, lb.trans, M, N, K, pa + oa, la.ld, pb + ob, lb.ld, po + oo, N, max_threads);
  });
}

template <typename T>
void matmul_loop(const Tensor& out, const Tensor& a, const Tensor& b) {
  const int n = out.ndim();
  const int64_t M = out.shape()[n - 2], N = out.shape()[n - 1], K = a.shape()[n - 1];
  const int64_t sam = a.strides()[n - 2], sak = a.strides()[n - 1];
  const int64_t sbk = b.strides()[n - 2], sbn = b.strides()[n - 1];
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  for_each_batch(out, a, b, [&](int64_t oo, int64_t oa, int64_t ob) {
    for (int64_t i = 0; i < M; ++i) {
      T* row = po + oo + i * N;
      for (int64_t j = 0; j < N; ++j) row[j] = 0;
      for (int64_t k = 0; k < K; ++k) {
        const T av = pa[oa + i * sam + k * sak];
        const T* brow = pb + ob + k * sbk;
        for (int64_t j = 0; j < N; ++j) row[j] += av * brow[j * sbn];
      }
    }
  });
}

}  // namespace

void matmul(const Tensor& out, const Tensor& a, const Tensor& b) {
  switch (a.dtype()) {
    case DType::kFloat32: return matmul_blas<float>(out, a, b);
    case DType::kFloat64: return matmul_blas<double>(out, a, b);
    case DType::kFloat16:
    case DType::kBFloat16: {
      Tensor o32 = Tensor::empty(out.shape(), DType::kFloat32, out.device());
      matmul_blas<float>(o32, a.cast(DType::kFloat32), b.cast(DType::kFloat32));
      return copy(out, o32);
    }
    case DType::kInt32: return matmul_loop<int32_t>(out, a, b);
    case DType::kInt64: return matmul_loop<int64_t>(out, a, b);
    default:
      throw TypeError(str("matmul: expected a numeric dtype, got ", dtype_name(a.dtype())));
  }
}

}  // namespace sl::cpu
