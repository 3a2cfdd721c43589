// Convolution, pooling and batch normalisation through cuDNN, for CUDA tensors (NCHW, float16 / float32 / float64).
// singa_lite/ops/nn.py calls these when the input is on a GPU and cudnn_available() (cuda/cudnn.h); otherwise it
// runs im2col + GEMM and the own pooling kernels. Each function checks its arguments first (ValueError / TypeError,
// before any cuDNN call), and gives the same results as the CPU ops up to rounding:
//  - convolution is cross-correlation with zero padding, stride, dilation and groups. float32 uses CUDNN_FMA_MATH (no
//    TF32); float16 data is computed in float32 (CUDNN_DATA_FLOAT compute type, tensor cores allowed). The algorithm
//    comes from cuDNN's heuristic (cudnnGetConvolution*Algorithm_v7, no timing runs), only its deterministic choices,
//    so that two runs give the same bits; for float32 and float64 its tensor-core variants are skipped. The choice is
//    asked once per device, dtype, direction, shapes and geometry and cached (cuda/conv_plan.h) with the rest of the
//    heuristic's list and the fallback (IMPLICIT_PRECOMP_GEMM / BWD_DATA_ALGO_1 / BWD_FILTER_ALGO_1) behind it: a
//    call whose workspace does not fit in GPU memory runs the next candidate instead of failing.
//  - max pooling uses CUDNN_POOLING_MAX_DETERMINISTIC with NaN propagation (a NaN wins, like the CPU kernel; padded
//    positions never win); average pooling COUNT_INCLUDE_PADDING or COUNT_EXCLUDE_PADDING.
//  - batch norm is CUDNN_BATCHNORM_SPATIAL (per channel over N, H, W). Scale, bias and the statistics are float
//    (double for float64 input), as cuDNN requires; float16 parameters are converted on the way in and out.
//    momentum is cuDNN's exponentialAverageFactor: running = (1 - momentum) * running + momentum * batch, the
//    variance unbiased; that is singa_lite's (and SINGA's) convention, see ops/nn.py.
// Descriptors are created per call: they are host-side structs that cost microseconds; the heuristic's answer, which
// costs about a millisecond, is what is cached. Workspaces come from the caching allocator and go back to it right
// after the call is queued (stream-ordered reuse, allocator.h). A call that fails inside cuDNN for lack of memory is
// repeated once with the allocator's cache emptied (convolutions and pooling, which only write their outputs).
#pragma once
#include <tuple>
#include <vector>

#include "core/tensor.h"
#include "cuda/conv_plan.h"
#include "ops/ops.h"

namespace sl::cuda {

// x [N, C, H, W], w [OC, C/groups, kh, kw] -> y [N, OC, OH, OW] (no bias: the caller adds it).
Tensor cudnn_conv2d_forward(const Tensor& x, const Tensor& w, Pair stride, Pair padding, Pair dilation,
                            int64_t groups);
// dx [x_shape] from w and dy.
Tensor cudnn_conv2d_backward_data(const Tensor& w, const Tensor& dy, const Shape& x_shape, Pair stride, Pair padding,
                                  Pair dilation, int64_t groups);
// dw [w_shape] from x and dy.
Tensor cudnn_conv2d_backward_filter(const Tensor& x, const Tensor& dy, const Shape& w_shape, Pair stride,
                                    Pair padding, Pair dilation, int64_t groups);

enum class PoolMode { kMax, kAvgIncludePad, kAvgExcludePad };
Tensor cudnn_pool2d_forward(const Tensor& x, PoolMode mode, Pair kernel, Pair stride, Pair padding);
// The backward needs the forward's x and y (cuDNN finds each window's maximum again from them).
Tensor cudnn_pool2d_backward(const Tensor& x, const Tensor& y, const Tensor& dy, PoolMode mode, Pair kernel,
                             Pair stride, Pair padding);

// x [N, C, H, W]; scale, bias, running_mean, running_var [C] of x's dtype. Updates the running statistics in place
// and returns (y, saved_mean, saved_inv_std), the latter two [C] float (double for float64 x), for the backward.
std::tuple<Tensor, Tensor, Tensor> cudnn_batch_norm_forward_training(const Tensor& x, const Tensor& scale,
                                                                     const Tensor& bias, const Tensor& running_mean,
                                                                     const Tensor& running_var, double momentum,
                                                                     double eps);
Tensor cudnn_batch_norm_forward_inference(const Tensor& x, const Tensor& scale, const Tensor& bias,
                                          const Tensor& running_mean, const Tensor& running_var, double eps);
// Returns (dx, dscale, dbias), each of x's dtype.
std::tuple<Tensor, Tensor, Tensor> cudnn_batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& scale,
                                                             const Tensor& saved_mean, const Tensor& saved_inv_std,
                                                             double eps);

// The convolution plan cache's counters (conv_plan.h): entries, hits, misses, over every device.
ConvPlanCache::Stats conv_plan_stats();
// The candidates a convolution of these shapes runs with, best first, the fallback last (from the cache, else asked
// and cached): for tests and for looking at what cuDNN chose.
std::vector<AlgoChoice> cudnn_conv2d_plans(ConvDirection direction, const Shape& x_shape, const Shape& w_shape,
                                           Pair stride, Pair padding, Pair dilation, int64_t groups, DType dtype,
                                           Device device);

// For tests: makes one real, invalid cuDNN call (a tensor descriptor with a negative size), so that the error path
// (CudaError naming cudnnSetTensor4dDescriptorEx, cuDNN's message, file:line) is exercised against the library.
void cudnn_provoke_error();

}  // namespace sl::cuda
