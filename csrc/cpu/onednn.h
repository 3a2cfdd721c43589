// float32 convolution on the CPU through oneDNN (the library PyTorch's CPU convolutions run on), opened at run
// time from the onednn-cpu-gomp wheel (Apache-2.0; libdnnl.so.3 built on GNU OpenMP, the runtime our kernels use
// too). No oneDNN header or library is needed to build: the few C functions and values used are declared in
// onednn.cpp (checked against oneDNN's own header by cpu/onednn_api_check.cpp when that header is found).
// Without the library, singa_lite/ops/nn.py keeps im2col + GEMM.
#pragma once
#include <string>
#include <utility>

#include "core/tensor.h"
#include "ops/ops.h"

namespace sl::cpu::onednn {

// Opens libdnnl at path (once per process; later calls with another path are refused). Returns dnnl_version()
// as "3.2.0"; RuntimeError with dlerror()'s text when the library cannot be opened or lacks a function.
std::string load(const std::string& path);
// Loaded, switched on (set_enabled), and this process may start threads (not a child forked after its
// OpenMP pool ran: libgomp's pool does not survive fork, cpu/threads.cpp).
bool available();
// Why available() is false ("" when it is true).
std::string unavailable_reason();
void set_enabled(bool on);
std::string version();

// The three passes of a convolution, NCHW float32 on the CPU; W (OC, C/groups, kh, kw). Results are new
// contiguous tensors. backward_weights returns (dW, db), db undefined unless with_bias.
Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Pair stride, Pair padding, Pair dilation,
                      int64_t groups);
Tensor conv2d_backward_data(const Tensor& w, const Tensor& dy, const Shape& x_shape, Pair stride, Pair padding,
                            Pair dilation, int64_t groups);
std::pair<Tensor, Tensor> conv2d_backward_weights(const Tensor& x, const Tensor& dy, const Shape& w_shape,
                                                  bool with_bias, Pair stride, Pair padding, Pair dilation,
                                                  int64_t groups);

// Primitives cached (one per shape, geometry, pass and thread count): their number, for tests.
size_t cached_primitives();
// Bytes of the workspace every plan's blocked copies share (the largest single call's need so far), for tests.
size_t workspace_bytes();

}  // namespace sl::cpu::onednn
