// How a matrix view is handed to a BLAS GEMM (OpenBLAS on the CPU, cuBLAS on the GPU): both take a matrix
// with unit stride along one axis plus a leading dimension, and a transposition flag for the other case.
// Shared so that both devices pack exactly the same operands and refuse the same sizes.
#pragma once
#include <algorithm>
#include <climits>
#include <cstdint>

#include "core/errors.h"
#include "core/tensor.h"

namespace sl {

struct MatLayout {
  bool ok = false;
  bool trans = false;  // unit stride on the row axis (a transposed view): pass the transposition flag
  int64_t ld = 0;      // the leading dimension
};

// A rows x cols row-major view with these element strides: trans = false needs a unit column stride
// (ld = row stride), trans = true a unit row stride (ld = column stride). The leading dimension must
// cover the other extent, as BLAS requires, and fit the 32-bit int both libraries take.
inline MatLayout blas_layout(int64_t rows, int64_t cols, int64_t stride_r, int64_t stride_c) {
  int64_t sr = rows == 1 ? std::max<int64_t>(cols, 1) : stride_r;
  int64_t sc = cols == 1 ? 1 : stride_c;
  if (sc == 1 && sr >= std::max<int64_t>(cols, 1) && sr <= INT_MAX) return {true, false, sr};
  sr = rows == 1 ? 1 : stride_r;
  sc = cols == 1 ? std::max<int64_t>(rows, 1) : stride_c;
  if (sr == 1 && sc >= std::max<int64_t>(rows, 1) && sc <= INT_MAX) return {true, true, sc};
  return {};
}

// The layout of t's last two axes (rows x cols); t is first packed when no layout fits (strided both ways).
inline MatLayout gemm_operand(Tensor& t, int64_t rows, int64_t cols) {
  const int n = t.ndim();
  MatLayout l = blas_layout(rows, cols, t.strides()[n - 2], t.strides()[n - 1]);
  if (!l.ok) {
    t = t.contiguous();
    l = blas_layout(rows, cols, t.strides()[n - 2], t.strides()[n - 1]);
  }
  SL_ASSERT(l.ok);
  return l;
}

inline void check_gemm_dims(int64_t M, int64_t N, int64_t K) {
  SL_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX, ValueError, "matmul: dimensions (", M, ", ", K, ", ", N,
           ") exceed the 32-bit BLAS limit of ", INT_MAX);
}

}  // namespace sl
