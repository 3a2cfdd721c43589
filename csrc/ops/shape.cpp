// Front-ends of concat, stack, split and one_hot.
#include <numeric>

#include "ops/dispatch.h"
#include "ops/checks.h"
#include "ops/ops.h"

namespace sl {

Tensor concat(const std::vector<Tensor>& xs, int64_t axis) {
  SL_CHECK(!xs.empty(), ValueError, "concat: needs at least one tensor");
  for (const Tensor& t : xs) check_defined(t, "concat", "an input");
  const Tensor& first = xs[0];
  SL_CHECK(first.ndim() > 0, ValueError, "concat: zero-dimensional tensors cannot be concatenated; use stack");
  int a = normalize_axis(axis, first.ndim(), "concat");
  Shape shape = first.shape();
  shape[a] = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& t = xs[i];
    check_same_dtype("concat", first, t);
    check_same_device("concat", first, t);
    SL_CHECK(t.ndim() == first.ndim(), ValueError, "concat: input ", i, " has ", t.ndim(), " dimensions, input 0 has ",
             first.ndim());
    for (int d = 0; d < t.ndim(); ++d)
      SL_CHECK(d == a || t.shape()[d] == first.shape()[d], ValueError, "concat: input ", i, " has shape ",
               shape_str(t.shape()), ", which differs from input 0's ", shape_str(first.shape()),
               " outside the concatenation axis ", a);
    // Empty inputs can have huge sizes ((2**62, 0) twice): their sum may overflow (found by UBSan).
    SL_CHECK(!__builtin_add_overflow(shape[a], t.shape()[a], &shape[a]), ValueError, "concat: the sizes along axis ",
             a, " add up to more than 2**63 - 1");
  }
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  int64_t offset = 0;
  for (const Tensor& t : xs) {
    copy_(out.slice(a, offset, offset + t.shape()[a], 1), t);
    offset += t.shape()[a];
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& xs, int64_t axis) {
  SL_CHECK(!xs.empty(), ValueError, "stack: needs at least one tensor");
  for (size_t i = 0; i < xs.size(); ++i) {
    check_defined(xs[i], "stack", "an input");
    SL_CHECK(xs[i].shape() == xs[0].shape(), ValueError, "stack: input ", i, " has shape ", shape_str(xs[i].shape()),
             ", input 0 has ", shape_str(xs[0].shape()), "; all inputs must have the same shape");
  }
  int a = normalize_axis(axis, xs[0].ndim() + 1, "stack");
  std::vector<Tensor> expanded;
  for (const Tensor& t : xs) expanded.push_back(t.unsqueeze(a));
  return concat(expanded, a);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis) {
  check_defined(x, "split", "input");
  int a = normalize_axis(axis, x.ndim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    SL_CHECK(s >= 0, ValueError, "split: sizes must be >= 0, got ", shape_str(sizes));
    // A sum that wrapped around could match the axis (found by UBSan): refuse it.
    SL_CHECK(!__builtin_add_overflow(total, s, &total), ValueError, "split: sizes ", shape_str(sizes),
             " add up to more than 2**63 - 1, but axis ", a, " has size ", x.shape()[a]);
  }
  SL_CHECK(total == x.shape()[a], ValueError, "split: sizes ", shape_str(sizes), " add up to ", total,
           " but axis ", a, " has size ", x.shape()[a]);
  std::vector<Tensor> parts;
  int64_t offset = 0;
  for (int64_t s : sizes) {
    parts.push_back(x.slice(a, offset, offset + s, 1));
    offset += s;
  }
  return parts;
}

std::vector<Tensor> split_sections(const Tensor& x, int64_t sections, int64_t axis) {
  check_defined(x, "split", "input");
  int a = normalize_axis(axis, x.ndim(), "split");
  SL_CHECK(sections > 0, ValueError, "split: the number of sections must be > 0, got ", sections);
  SL_CHECK(x.shape()[a] % sections == 0, ValueError, "split: axis ", a, " of size ", x.shape()[a],
           " does not divide into ", sections, " equal sections; pass a list of sizes instead");
  return split(x, std::vector<int64_t>(size_t(sections), x.shape()[a] / sections), a);
}

Tensor one_hot(const Tensor& indices, int64_t depth, DType dtype) {
  check_defined(indices, "one_hot", "indices");
  check_kernel_device("one_hot", indices);
  SL_CHECK(indices.dtype() == DType::kInt32 || indices.dtype() == DType::kInt64, TypeError,
           "one_hot: indices must be int32 or int64, got ", dtype_name(indices.dtype()),
           "; cast labels with as_type(int32)");
  SL_CHECK(depth > 0, ValueError, "one_hot: depth must be > 0, got ", depth);
  Tensor idx = indices.contiguous();
  // Check every index before writing anything. (Only when there are indices: min/max of an empty tensor
  // raise, which made one_hot of an empty batch fail.) On a GPU the kernel checks instead and the error comes at
  // the next wait for the device: reading min / max here would wait for it in every training step.
  if (idx.numel() > 0 && !index_check_deferred(idx)) {
    // min / max are computed where the indices live; the two scalars are read on the host.
    Tensor lo = reduce(ReduceOp::kMin, idx, std::nullopt, false).to(Device::cpu());
    Tensor hi = reduce(ReduceOp::kMax, idx, std::nullopt, false).to(Device::cpu());
    int64_t mn = idx.dtype() == DType::kInt32 ? *lo.data<int32_t>() : *lo.data<int64_t>();
    int64_t mx = idx.dtype() == DType::kInt32 ? *hi.data<int32_t>() : *hi.data<int64_t>();
    SL_CHECK(mn >= 0 && mx < depth, IndexError, "one_hot: indices must lie in [0, ", depth, "), got values in [", mn,
             ", ", mx, "]");
  }
  Shape shape = indices.shape();
  shape.push_back(depth);
  Tensor out = Tensor::empty(shape, dtype, indices.device());
  SL_KERNEL(out.device(), one_hot, out, idx, depth);
  return out;
}

}  // namespace sl
