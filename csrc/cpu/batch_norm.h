// Batch normalisation in training mode on the CPU, fused per channel (cpu/batch_norm.cpp), for float32 and
// float64 x of shape (N, C, H, W) or (N, C); scale, bias and the statistics are (C,).
#pragma once
#include "core/tensor.h"

namespace sl::cpu {

struct BatchNormForward {
  Tensor y, mean, var, inv_std;  // var: biased (normalising); inv_std = 1 / sqrt(var + eps)
};
struct BatchNormBackward {
  Tensor dx, dscale, dbias;  // dx undefined unless asked for
};

BatchNormForward batch_norm_train_forward(const Tensor& x, const Tensor& scale, const Tensor& bias, double eps);
BatchNormBackward batch_norm_train_backward(const Tensor& x, const Tensor& dy, const Tensor& mean,
                                            const Tensor& inv_std, const Tensor& scale, bool need_dx);

}  // namespace sl::cpu
