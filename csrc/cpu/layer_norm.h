// Layer normalisation on the CPU, fused per row (cpu/layer_norm.cpp), for float32 and float64 x seen as (R, C):
// every row of C values normalised on its own; gamma and beta, when defined, are (C,).
#pragma once
#include "core/tensor.h"

namespace sl::cpu {

struct LayerNormForward {
  Tensor y, mean, inv_std;  // mean, inv_std = 1 / sqrt(biased var + eps): (R,)
};
struct LayerNormBackward {
  Tensor dx, dgamma, dbeta;  // dgamma / dbeta undefined without gamma / beta
};

LayerNormForward layer_norm_forward(const Tensor& x, int64_t cols, const Tensor& gamma, const Tensor& beta,
                                    double eps);
LayerNormBackward layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& inv_std,
                                      const Tensor& gamma, bool need_beta);

}  // namespace sl::cpu
