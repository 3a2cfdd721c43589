// The op front-ends: every op checks its arguments (dtype, device, shape, axes) here, once, allocates
// the output, then hands raw tensors to the kernel of the tensors' device (cpu:: today, cuda:: later).
// Checks throw typed errors from core/errors.h; kernels never see bad input.
#pragma once
#include <array>
#include <optional>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "ops/elementwise_ops.h"  // BinaryOp, UnaryOp: the one list of element-wise ops

namespace sl {

enum class ReduceOp { kSum, kMean, kMax, kMin };

const char* op_name(BinaryOp op);
const char* op_name(UnaryOp op);
const char* op_name(ReduceOp op);
bool is_comparison(BinaryOp op);

// ----- element-wise (numpy broadcasting; `out` may be an input for in-place use)
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor out = Tensor());
// a (op) s, or s (op) a when scalar_first; the scalar takes a's dtype and must be representable in it.
Tensor binary_scalar(BinaryOp op, const Tensor& a, double s, bool scalar_first, Tensor out = Tensor());
Tensor unary(UnaryOp op, const Tensor& x, Tensor out = Tensor());
Tensor clip(const Tensor& x, std::optional<double> lo, std::optional<double> hi, Tensor out = Tensor());
void axpy_(double alpha, const Tensor& x, const Tensor& y);  // y += alpha * x (x broadcast to y)
void fill_(const Tensor& t, double value);

// ----- fused optimizer steps (in place on param and buf; see cpu/optim.cpp for the formula)
struct SgdStep {
  double lr = 0.1, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  bool first = false;  // the buffer is set to the (decayed) gradient instead of being decayed
};
// buf undefined: plain SGD (momentum must be 0). param, grad, buf: same shape, float dtype, device.
void sgd_update_(const Tensor& param, const Tensor& grad, const Tensor& buf, const SgdStep& step);
Tensor arange(double start, double stop, double step, DType dtype, Device device);
void copy_(const Tensor& dst, const Tensor& src);  // src broadcast to dst; casts; crosses devices

// ----- reductions (axes: nullopt = all)
Tensor reduce(ReduceOp op, const Tensor& x, const std::optional<std::vector<int64_t>>& axes, bool keepdims);
Tensor argmax(const Tensor& x, std::optional<int64_t> axis, bool keepdims);
Tensor argmin(const Tensor& x, std::optional<int64_t> axis, bool keepdims);

// ----- linear algebra (numpy matmul semantics: 1-D promotion, broadcast batch dimensions)
Tensor matmul(const Tensor& a, const Tensor& b, Tensor out = Tensor());

// ----- shape ops
Tensor concat(const std::vector<Tensor>& xs, int64_t axis);
Tensor stack(const std::vector<Tensor>& xs, int64_t axis);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis);  // views
std::vector<Tensor> split_sections(const Tensor& x, int64_t sections, int64_t axis);          // views
Tensor one_hot(const Tensor& indices, int64_t depth, DType dtype);

// ----- convolution and pooling helpers (NCHW; see ops/nn.cpp)
using Pair = std::array<int64_t, 2>;  // (height, width)
struct Conv2dGeometry {
  int64_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, out_h, out_w;
};
struct Pool2dGeometry {
  int64_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, out_h, out_w;
};
// x [N, C, H, W] -> cols [C*kh*kw, N*OH*OW] (all images side by side): a convolution of the whole batch
// becomes one GEMM with the weights, W[OC, C*kh*kw] @ cols.
Tensor im2col(const Tensor& x, Pair kernel, Pair stride, Pair padding, Pair dilation);
// The adjoint: cols [C*kh*kw, N*OH*OW] -> x [N, C, H, W], overlapping entries summed.
Tensor col2im(const Tensor& cols, const Shape& x_shape, Pair kernel, Pair stride, Pair padding, Pair dilation);
// Returns (y, argmax): argmax holds the flat h*W+w index of each window's maximum, for the backward.
std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding);
Tensor max_pool2d_backward(const Tensor& dy, const Tensor& argmax, const Shape& x_shape);
Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding, bool count_include_pad);
Tensor avg_pool2d_backward(const Tensor& dy, const Shape& x_shape, Pair kernel, Pair stride, Pair padding,
                           bool count_include_pad);

// ----- sparse exchange (DistOpt's sparsification)
// Ascending int64 indices of the significant entries of 1-D float x: every |x| >= spars, or with top_k the
// ceil(spars * n) largest magnitudes (NaN counts as the largest; among equal magnitudes at the cut, which
// ones are kept is unspecified).
Tensor select_significant(const Tensor& x, double spars, bool top_k);
Tensor take(const Tensor& x, const Tensor& idx);  // x[idx], 1-D
// dense[idx[i]] += vals[i]. The indices of one call must be distinct (each element written once).
void index_add_(const Tensor& dense, const Tensor& idx, const Tensor& vals);

// ----- random (per-device counter-based generator; see core/generator.h)
void uniform_(const Tensor& t, double low, double high);
void gaussian_(const Tensor& t, double mean, double std);
void bernoulli_(const Tensor& t, double p);

}  // namespace sl
