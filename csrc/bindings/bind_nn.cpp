// Convolution and pooling helpers for the autograd operators.
#include <pybind11/stl.h>

#include "bindings/binders.h"
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
}

}  // namespace sl::bindings
