// Front-end of matmul, with numpy's rules: 1-D operands are promoted (and the added axis removed
// afterwards), batch axes broadcast.
#include "ops/dispatch.h"
#include "ops/checks.h"
#include "ops/ops.h"

namespace sl {

Tensor matmul(const Tensor& a_in, const Tensor& b_in, Tensor out) {
  check_defined(a_in, "matmul", "lhs");
  check_defined(b_in, "matmul", "rhs");
  check_same_dtype("matmul", a_in, b_in);
  check_same_device("matmul", a_in, b_in);
  check_kernel_device("matmul", a_in);
  SL_CHECK(a_in.ndim() >= 1 && b_in.ndim() >= 1, ValueError, "matmul: operands must have at least 1 dimension, got ",
           shape_str(a_in.shape()), " and ", shape_str(b_in.shape()));
  SL_CHECK(a_in.dtype() != DType::kBool, TypeError, "matmul: not defined for bool tensors");
  Tensor a = a_in.ndim() == 1 ? a_in.unsqueeze(0) : a_in;
  Tensor b = b_in.ndim() == 1 ? b_in.unsqueeze(1) : b_in;
  const int64_t M = a.shape()[a.ndim() - 2], K = a.shape()[a.ndim() - 1];
  const int64_t K2 = b.shape()[b.ndim() - 2], N = b.shape()[b.ndim() - 1];
  SL_CHECK(K == K2, ValueError, "matmul: inner dimensions differ: ", shape_str(a_in.shape()), " @ ",
           shape_str(b_in.shape()), " (", K, " vs ", K2, ")");
  Shape batch_a(a.shape().begin(), a.shape().end() - 2), batch_b(b.shape().begin(), b.shape().end() - 2);
  Shape batch = broadcast_shapes(batch_a, batch_b, "matmul");
  Shape full = batch;
  full.push_back(M);
  full.push_back(N);
  Shape a_full = batch, b_full = batch;
  a_full.insert(a_full.end(), {M, K});
  b_full.insert(b_full.end(), {K, N});
  // The user-visible shape drops the axes that 1-D promotion added.
  Shape result = batch;
  if (a_in.ndim() > 1) result.push_back(M);
  if (b_in.ndim() > 1) result.push_back(N);

  if (out.defined()) check_out("matmul", out, result, a.dtype(), a.device());  // before any work
  // GEMM writes a packed result; a given `out` (possibly an operand, possibly strided) is filled from it.
  Tensor target = Tensor::empty(full, a.dtype(), a.device());
  SL_KERNEL(target.device(), matmul, target, a.broadcast_to(a_full), b.broadcast_to(b_full));
  Tensor r = target.view(result);
  if (!out.defined()) return r;
  SL_KERNEL(out.device(), copy, out, r);
  return out;
}

}  // namespace sl
