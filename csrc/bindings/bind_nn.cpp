// Convolution and pooling helpers for the autograd operators.
#include <pybind11/stl.h>

#include "bindings/binders.h"
#include "cpu/batch_norm.h"
#include "cpu/onednn.h"
#include "ops/ops.h"

namespace py = pybind11;

namespace sl::bindings {

void bind_nn(py::module_& m) {
  const auto release = py::call_guard<py::gil_scoped_release>();
  m.def("im2col", &im2col, py::arg("x"), py::arg("kernel"), py::arg("stride"), py::arg("padding"),
        py::arg("dilation") = Pair{1, 1}, release, "x [N,C,H,W] -> cols [C*kh*kw, N*OH*OW].");
  m.def("col2im", &col2im, py::arg("cols"), py::arg("x_shape"), py::arg("kernel"), py::arg("stride"),
        py::arg("padding"), py::arg("dilation") = Pair{1, 1}, release, "The adjoint of im2col.");
  m.def("max_pool2d", &max_pool2d, py::arg("x"), py::arg("kernel"), py::arg("stride"), py::arg("padding"), release,
        "Returns (y, argmax); argmax feeds max_pool2d_backward.");
  m.def("max_pool2d_backward", &max_pool2d_backward, py::arg("dy"), py::arg("argmax"), py::arg("x_shape"), release);
  m.def("avg_pool2d", &avg_pool2d, py::arg("x"), py::arg("kernel"), py::arg("stride"), py::arg("padding"),
        py::arg("count_include_pad") = true, release);
  m.def("avg_pool2d_backward", &avg_pool2d_backward, py::arg("dy"), py::arg("x_shape"), py::arg("kernel"),
        py::arg("stride"), py::arg("padding"), py::arg("count_include_pad") = true, release);

  // Batch normalisation's training passes on the CPU, fused per channel (cpu/batch_norm.h).
  m.def("batch_norm_train_forward", [](const Tensor& x, const Tensor& scale, const Tensor& bias, double eps) {
    cpu::BatchNormForward r;
    {
      py::gil_scoped_release nogil;
      r = cpu::batch_norm_train_forward(x, scale, bias, eps);
    }
    return py::make_tuple(r.y, r.mean, r.var, r.inv_std);
  }, py::arg("x"), py::arg("scale"), py::arg("bias"), py::arg("eps"),
        "(y, mean, biased var, inv_std) of x (N, C, H, W) or (N, C); float32 / float64 CPU tensors.");
  m.def("batch_norm_train_backward", [](const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& inv_std,
                                        const Tensor& scale, bool need_dx) {
    cpu::BatchNormBackward r;
    {
      py::gil_scoped_release nogil;
      r = cpu::batch_norm_train_backward(x, dy, mean, inv_std, scale, need_dx);
    }
    return py::make_tuple(need_dx ? py::cast(r.dx) : py::none(), r.dscale, r.dbias);
  }, py::arg("x"), py::arg("dy"), py::arg("mean"), py::arg("inv_std"), py::arg("scale"), py::arg("need_dx"),
        "(dx or None, dscale, dbias); dx only with need_dx.");

  // oneDNN's float32 convolutions (cpu/onednn.h); singa_lite/_runtime/onednn.py finds and loads the library.
  m.def("onednn_load", &cpu::onednn::load, py::arg("path"), release,
        "Opens libdnnl (oneDNN 3.x) at path; returns its version. Once per process.");
  m.def("onednn_available", &cpu::onednn::available, "Loaded, switched on, and usable in this process.");
  m.def("onednn_unavailable_reason", &cpu::onednn::unavailable_reason, "Why onednn_available() is False, or ''.");
  m.def("set_onednn_enabled", &cpu::onednn::set_enabled, py::arg("enabled"),
        "Off: CPU convolutions run as im2col + GEMM even when oneDNN is loaded.");
  m.def("onednn_version", &cpu::onednn::version, "The loaded oneDNN's version, or '' when none is loaded.");
  m.def("onednn_cached_primitives", &cpu::onednn::cached_primitives);
  m.def("onednn_workspace_bytes", &cpu::onednn::workspace_bytes,
        "Bytes of the workspace all cached convolutions share for their blocked copies.");
  m.def("onednn_conv2d_forward", [](const Tensor& x, const Tensor& w, const std::optional<Tensor>& b, Pair stride,
                                    Pair padding, Pair dilation, int64_t groups) {
    return cpu::onednn::conv2d_forward(x, w, b ? *b : Tensor(), stride, padding, dilation, groups);
  }, py::arg("x"), py::arg("w"), py::arg("b"), py::arg("stride"), py::arg("padding"), py::arg("dilation"),
        py::arg("groups"), release);
  m.def("onednn_conv2d_backward_data", &cpu::onednn::conv2d_backward_data, py::arg("w"), py::arg("dy"),
        py::arg("x_shape"), py::arg("stride"), py::arg("padding"), py::arg("dilation"), py::arg("groups"), release);
  m.def("onednn_conv2d_backward_weights", [](const Tensor& x, const Tensor& dy, const Shape& w_shape, bool with_bias,
                                             Pair stride, Pair padding, Pair dilation, int64_t groups) {
    auto [dw, db] = cpu::onednn::conv2d_backward_weights(x, dy, w_shape, with_bias, stride, padding, dilation, groups);
    return std::make_pair(dw, with_bias ? std::optional<Tensor>(db) : std::nullopt);
  }, py::arg("x"), py::arg("dy"), py::arg("w_shape"), py::arg("with_bias"), py::arg("stride"), py::arg("padding"),
        py::arg("dilation"), py::arg("groups"), release, "Returns (dW, db); db is None without with_bias.");
}

}  // namespace sl::bindings
