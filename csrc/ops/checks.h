// Argument checks shared by the op front-ends. Each throws with the op's name, what was expected,
// what was given and, where there is one, the fix.
#pragma once
#include "core/errors.h"
#include "core/tensor.h"

namespace sl {

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b);
void check_same_device(const char* op, const Tensor& a, const Tensor& b);
void check_floating(const char* op, const Tensor& t);
// Kernels for this device exist in this build? (CPU always; CUDA in CUDA builds.)
void check_kernel_device(const char* op, const Tensor& t);
// `out` must have exactly this shape, dtype and device.
void check_out(const char* op, const Tensor& out, const Shape& shape, DType dtype, Device device);
// a * b and a + b of sizes taken from the user (shapes, kernel geometry): a ValueError naming the op when the
// result does not fit in int64, instead of a signed overflow that wraps to a small, wrong size.
int64_t checked_mul(const char* op, int64_t a, int64_t b);
int64_t checked_add(const char* op, int64_t a, int64_t b);
// True when out overlaps `in` in any way other than being the very same view (then a temporary is used).
bool partial_overlap(const Tensor& out, const Tensor& in);
// Whether the kernel that uses these indices checks their range itself, on the device, and reports a bad one at
// the next wait for it (CUDA tensors, cuda/index_faults.h). Otherwise the front-end checks before the kernel.
bool index_check_deferred(const Tensor& indices);

}  // namespace sl
