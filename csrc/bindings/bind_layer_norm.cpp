// Layer normalisation's fused CPU passes (cpu/layer_norm.h), for singa_lite/ops/transformer.py.
#include <optional>

#include <pybind11/stl.h>

#include "bindings/binders.h"
#include "cpu/layer_norm.h"

namespace py = pybind11;

namespace sl::bindings {

void bind_layer_norm(py::module_& m) {
  m.def("layer_norm_forward", [](const Tensor& x, int64_t cols, const std::optional<Tensor>& gamma,
                                 const std::optional<Tensor>& beta, double eps) {
    cpu::LayerNormForward r;
    {
      py::gil_scoped_release nogil;
      r = cpu::layer_norm_forward(x, cols, gamma ? *gamma : Tensor(), beta ? *beta : Tensor(), eps);
    }
    return py::make_tuple(r.y, r.mean, r.inv_std);
  }, py::arg("x"), py::arg("cols"), py::arg("gamma"), py::arg("beta"), py::arg("eps"),
        "(y, mean, inv_std) of x normalised over rows of `cols` values; float32 / float64 CPU tensors, gamma and "
        "beta (cols values) or None.");
  m.def("layer_norm_backward", [](const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& inv_std,
                                  const std::optional<Tensor>& gamma, bool need_beta) {
    cpu::LayerNormBackward r;
    {
      py::gil_scoped_release nogil;
      r = cpu::layer_norm_backward(x, dy, mean, inv_std, gamma ? *gamma : Tensor(), need_beta);
    }
    return py::make_tuple(r.dx, r.dgamma.defined() ? py::cast(r.dgamma) : py::none(),
                          r.dbeta.defined() ? py::cast(r.dbeta) : py::none());
  }, py::arg("x"), py::arg("dy"), py::arg("mean"), py::arg("inv_std"), py::arg("gamma"), py::arg("need_beta"),
        "(dx, dgamma or None, dbeta or None); dgamma with gamma, dbeta with need_beta.");
}

}  // namespace sl::bindings
