// Front-ends of sum / mean / max / min over any axes, and argmax / argmin.
#include <algorithm>

#include "ops/dispatch.h"
#include "ops/checks.h"
#include "ops/ops.h"

namespace sl {

const char* op_name(ReduceOp op) {
  static const char* names[] = {"sum", "mean", "max", "min"};
  return names[int(op)];
}

Tensor reduce(ReduceOp op, const Tensor& x_in, const std::optional<std::vector<int64_t>>& axes, bool keepdims) {
  const char* name = op_name(op);
  check_defined(x_in, name, "input");
  check_kernel_device(name, x_in);
  Tensor x = x_in;
  // Booleans sum as integers (as numpy); an integer mean is computed in float32 (numpy: float64).
  if (x.dtype() == DType::kBool) x = x.cast(op == ReduceOp::kMean ? DType::kFloat32 : DType::kInt64);
  if (op == ReduceOp::kMean && !is_floating(x.dtype())) x = x.cast(DType::kFloat32);
  const int n = x.ndim();
  std::vector<bool> reduced(n, !axes.has_value());
  if (axes) {
    for (int64_t ax : *axes) {
      int a = normalize_axis(ax, n, name);
      SL_CHECK(!reduced[a], ValueError, name, ": axis ", ax, " repeated");
      reduced[a] = true;
    }
  }
  Shape out_shape, kept_shape;
  for (int i = 0; i < n; ++i) {
    if (reduced[i]) {
      if (keepdims) out_shape.push_back(1);
      SL_CHECK(x.shape()[i] > 0 || op == ReduceOp::kSum || op == ReduceOp::kMean, ValueError, name,
               ": cannot reduce over the empty axis ", i, " (there is no identity for ", name, ")");
    } else {
      out_shape.push_back(x.shape()[i]);
      kept_shape.push_back(x.shape()[i]);
    }
  }
  Tensor out = Tensor::empty(kept_shape, x.dtype(), x.device());
  SL_KERNEL(out.device(), reduce, op, out, x, reduced);
  return out.view(out_shape);
}

static Tensor arg_reduce(bool is_max, const Tensor& x, std::optional<int64_t> axis, bool keepdims) {
  const char* name = is_max ? "argmax" : "argmin";
  check_defined(x, name, "input");
  check_kernel_device(name, x);
  SL_CHECK(x.dtype() != DType::kBool, TypeError, name, ": not defined for bool tensors; cast with as_type() first");
  Shape out_shape;
  Tensor rows;
  if (!axis) {
    SL_CHECK(x.numel() > 0, ValueError, name, ": the tensor is empty");
    rows = x.contiguous().view({1, x.numel()});
    if (keepdims) out_shape.assign(x.ndim(), 1);
  } else {
    int a = normalize_axis(*axis, x.ndim(), name);
    SL_CHECK(x.shape()[a] > 0, ValueError, name, ": axis ", *axis, " is empty");
    std::vector<int64_t> perm;
    for (int i = 0; i < x.ndim(); ++i)
      if (i != a) {
        perm.push_back(i);
        out_shape.push_back(x.shape()[i]);
      } else if (keepdims) {
        out_shape.push_back(1);
      }
    perm.push_back(a);
    rows = x.transpose(perm).contiguous();
    rows = rows.view({x.numel() / x.shape()[a], x.shape()[a]});
  }
  Tensor out = Tensor::empty({rows.shape()[0]}, DType::kInt64, x.device());
  SL_KERNEL(out.device(), arg_reduce, is_max, out, rows);
  return out.view(out_shape);
}

Tensor argmax(const Tensor& x, std::optional<int64_t> axis, bool keepdims) { return arg_reduce(true, x, axis, keepdims); }
Tensor argmin(const Tensor& x, std::optional<int64_t> axis, bool keepdims) { return arg_reduce(false, x, axis, keepdims); }

}  // namespace sl
