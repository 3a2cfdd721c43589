// CUDA kernels: the same contract as cpu/kernels.h (the front-ends in ops/ have checked everything and
// broadcast inputs to the output's shape; inputs may be strided views, outputs are as the CPU kernels get
// them). Every kernel is queued on the device's compute stream (cuda/context.h) and returns without waiting;
// a failed launch raises CudaError. float16 is computed in float32 and rounded once per result; reductions
// accumulate float16 in float32.
#pragma once
#include "core/tensor.h"
#include "ops/ops.h"

namespace sl::cuda {

// ----- element-wise (cuda/elementwise.cu)
void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b);
void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& a, double s, bool scalar_first);
void unary(UnaryOp op, const Tensor& out, const Tensor& x);
void clip(const Tensor& out, const Tensor& x, double lo, double hi);
void axpy(double alpha, const Tensor& x, const Tensor& y);
void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& buf, const SgdStep& s);
void copy(const Tensor& dst, const Tensor& src);  // both on this GPU, same shape, any dtypes and strides

// ----- reductions (cuda/reduce.cu)
void reduce(ReduceOp op, const Tensor& out, const Tensor& x, const std::vector<bool>& reduced);
void arg_reduce(bool is_max, const Tensor& out, const Tensor& x);

// ----- GEMM through cuBLAS (cuda/matmul.cpp)
void matmul(const Tensor& out, const Tensor& a, const Tensor& b);

// ----- convolution / pooling helpers and one-hot (cuda/nn.cu)
void one_hot(const Tensor& out, const Tensor& indices, int64_t depth);
void im2col(const Tensor& cols, const Tensor& x, const Conv2dGeometry& g);
void col2im(const Tensor& x, const Tensor& cols, const Conv2dGeometry& g);
void max_pool2d(const Tensor& out, const Tensor& argmax, const Tensor& x, const Pool2dGeometry& g);
void max_pool2d_backward(const Tensor& dx, const Tensor& dy, const Tensor& argmax);
void avg_pool2d(const Tensor& out, const Tensor& x, const Pool2dGeometry& g, bool count_include_pad);
void avg_pool2d_backward(const Tensor& dx, const Tensor& dy, const Pool2dGeometry& g, bool count_include_pad);

// ----- random numbers: the CPU's Philox streams, element for element (cuda/random.cu)
void uniform(const Tensor& t, double low, double high, uint64_t seed, uint64_t offset);
void gaussian(const Tensor& t, double mean, double std, uint64_t seed, uint64_t offset);
void bernoulli(const Tensor& t, double p, uint64_t seed, uint64_t offset);

// ----- sparse exchange (DistOpt's sparsification; see ops/sparse.cpp)
// x: contiguous 1-D float. k < 0: the ascending indices of every |x| >= spars; else of the k largest |x|
// (NaN counts as the largest). Returns a new int64 tensor on x's device (its length depends on the data).
Tensor select_significant(const Tensor& x, double spars, int64_t k);
void take(const Tensor& out, const Tensor& x, const Tensor& idx);  // out[i] = x[idx[i]]
void index_add(const Tensor& dense, const Tensor& idx, const Tensor& vals);  // dense[idx[i]] += vals[i], distinct idx

}  // namespace sl::cuda
