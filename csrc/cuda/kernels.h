// CUDA kernels: the contract in ops/kernel_contract.inc. Every kernel is queued on the device's compute stream
// (cuda/context.h) and returns without waiting; a failed launch raises CudaError. float16 is computed in
// float32 and rounded once per result; reductions accumulate float16 in float32. Where each lives:
// element-wise in elementwise.cu, reductions in reduce.cu, GEMM through cuBLAS in matmul.cpp, one-hot /
// convolution / pooling helpers in nn.cu, random numbers in random.cu, the sparse exchange in sparse.cu.
#pragma once
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"

namespace sl::cuda {

#include "ops/kernel_contract.inc"

}  // namespace sl::cuda
