// CPU kernels. They trust their arguments: the front-ends in ops/ have checked shapes, dtypes and
// devices and have broadcast inputs to the output's shape. Big loops are split across OpenMP threads.
#pragma once
#include "core/tensor.h"
#include "ops/ops.h"

namespace sl::cpu {

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b);
void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& a, double s, bool scalar_first);
void unary(UnaryOp op, const Tensor& out, const Tensor& x);
void clip(const Tensor& out, const Tensor& x, double lo, double hi);
void axpy(double alpha, const Tensor& x, const Tensor& y);
void fill(const Tensor& t, double value);
void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& buf, const SgdStep& s);
void arange(const Tensor& t, double start, double step);
void copy(const Tensor& dst, const Tensor& src);  // same shape, any dtypes

// out: contiguous, one element per kept position; reduced[i] marks x's reduced axes.
void reduce(ReduceOp op, const Tensor& out, const Tensor& x, const std::vector<bool>& reduced);
// x: contiguous [rows, n]; out: int64 [rows].
void arg_reduce(bool is_max, const Tensor& out, const Tensor& x);

// a: [..., M, K], b: [..., K, N] with equal batch shapes (possibly broadcast views); out contiguous [..., M, N].
void matmul(const Tensor& out, const Tensor& a, const Tensor& b);

void one_hot(const Tensor& out, const Tensor& indices, int64_t depth);

// NCHW, contiguous; geometry checked by the front-end (ops/nn.cpp).
void im2col(const Tensor& cols, const Tensor& x, const Conv2dGeometry& g);
void col2im(const Tensor& x, const Tensor& cols, const Conv2dGeometry& g);
void max_pool2d(const Tensor& out, const Tensor& argmax, const Tensor& x, const Pool2dGeometry& g);
void max_pool2d_backward(const Tensor& dx, const Tensor& dy, const Tensor& argmax);
void avg_pool2d(const Tensor& out, const Tensor& x, const Pool2dGeometry& g, bool count_include_pad);
void avg_pool2d_backward(const Tensor& dx, const Tensor& dy, const Pool2dGeometry& g, bool count_include_pad);
void uniform(const Tensor& t, double low, double high, uint64_t seed, uint64_t offset);
void gaussian(const Tensor& t, double mean, double std, uint64_t seed, uint64_t offset);
void bernoulli(const Tensor& t, double p, uint64_t seed, uint64_t offset);

// ----- sparse exchange (DistOpt's sparsification; see ops/sparse.cpp)
// x: contiguous 1-D float. k < 0: the ascending indices of every |x| >= spars; else of the k largest |x|
// (NaN counts as the largest). Returns a new int64 tensor on x's device (its length depends on the data).
Tensor select_significant(const Tensor& x, double spars, int64_t k);
void take(const Tensor& out, const Tensor& x, const Tensor& idx);  // out[i] = x[idx[i]]
void index_add(const Tensor& dense, const Tensor& idx, const Tensor& vals);  // dense[idx[i]] += vals[i], distinct idx

}  // namespace sl::cpu
