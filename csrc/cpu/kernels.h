// CPU kernels: the contract in ops/kernel_contract.inc, plus what only the CPU needs. Big loops are split
// across OpenMP threads.
#pragma once
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"

namespace sl::cpu {

#include "ops/kernel_contract.inc"

void fill(const Tensor& t, double value);
void arange(const Tensor& t, double start, double step);

}  // namespace sl::cpu
