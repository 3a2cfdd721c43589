// Front-ends of the sparse-exchange ops behind DistOpt's sparsification (parallel/dist_opt.py): checks, then
// the device's kernel. Index tensors are int64; an index from a peer must never read or write out of bounds. On
// the CPU their range is checked here, before any kernel runs; on a GPU the kernels check each index, skip a bad
// one and report it at the next wait for the device (cuda/index_faults.h), which saves two host syncs per call.
#include <cmath>

#include "ops/checks.h"
#include "ops/dispatch.h"
#include "ops/ops.h"

namespace sl {
namespace {

void check_flat(const char* op, const Tensor& t, const char* what) {
  check_defined(t, op, what);
  SL_CHECK(t.ndim() == 1, ValueError, op, ": ", what, " must be 1-D, got shape ", shape_str(t.shape()));
  check_kernel_device(op, t);
}

void check_indices(const char* op, const Tensor& idx, int64_t n) {
  check_flat(op, idx, "indices");
  SL_CHECK(idx.dtype() == DType::kInt64, TypeError, op, ": indices must be int64, got ", dtype_name(idx.dtype()));
  if (idx.numel() == 0 || index_check_deferred(idx)) return;
  Tensor lo = reduce(ReduceOp::kMin, idx, std::nullopt, false).to(Device::cpu());
  Tensor hi = reduce(ReduceOp::kMax, idx, std::nullopt, false).to(Device::cpu());
  SL_CHECK(*lo.data<int64_t>() >= 0 && *hi.data<int64_t>() < n, IndexError, op, ": indices must lie in [0, ", n,
           "), got values in [", *lo.data<int64_t>(), ", ", *hi.data<int64_t>(), "]");
}

}  // namespace

Tensor select_significant(const Tensor& x, double spars, bool top_k) {
  check_flat("select_significant", x, "input");
  check_floating("select_significant", x);
  SL_CHECK(std::isfinite(spars), ValueError, "select_significant: spars must be finite, got ", spars);
  int64_t k = -1;
  if (top_k) {
    SL_CHECK(spars > 0 && spars <= 1, ValueError, "select_significant: with top_k, spars is the fraction of ",
             "entries kept, in (0, 1]; got ", spars);
    k = std::min<int64_t>(x.numel(), int64_t(std::ceil(spars * double(x.numel()))));
  } else {
    SL_CHECK(spars >= 0, ValueError, "select_significant: the magnitude threshold must be >= 0, got ", spars);
  }
  Tensor packed = x.contiguous();
  return SL_KERNEL(packed.device(), select_significant, packed, spars, k);
}

Tensor take(const Tensor& x, const Tensor& idx) {
  check_flat("take", x, "input");
  check_same_device("take", x, idx);
  check_indices("take", idx, x.numel());
  Tensor out = Tensor::empty({idx.numel()}, x.dtype(), x.device());
  SL_KERNEL(out.device(), take, out, x.contiguous(), idx.contiguous());
  return out;
}

void index_add_(const Tensor& dense, const Tensor& idx, const Tensor& vals) {
  check_flat("index_add", dense, "destination");
  check_flat("index_add", vals, "values");
  check_same_device("index_add", dense, idx);
  check_same_device("index_add", dense, vals);
  check_same_dtype("index_add", dense, vals);
  SL_CHECK(dense.dtype() != DType::kBool, TypeError, "index_add: not defined for bool tensors");
  SL_CHECK(dense.is_contiguous(), ValueError, "index_add: the destination must be contiguous");
  SL_CHECK(idx.numel() == vals.numel(), ValueError, "index_add: ", idx.numel(), " indices but ", vals.numel(),
           " values");
  check_indices("index_add", idx, dense.numel());
  SL_KERNEL(dense.device(), index_add, dense, idx.contiguous(), vals.contiguous());
}

}  // namespace sl
