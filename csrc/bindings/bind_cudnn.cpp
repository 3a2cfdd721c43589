// cuDNN: whether it can be used (and why not), where it was loaded from, and the ops singa_lite/nn_ops.py calls on
// CUDA tensors when it can. In a CPU-only build only the questions exist, and they say so.
#include <pybind11/stl.h>

#include "bindings/binders.h"
#include "core/errors.h"
#ifdef SINGA_LITE_WITH_CUDA
#include "cuda/cudnn.h"
#include "cuda/cudnn_ops.h"
#endif

namespace py = pybind11;

namespace sl::bindings {

#ifdef SINGA_LITE_WITH_CUDA
namespace {

cuda::PoolMode pool_mode(const std::string& mode) {
  if (mode == "max") return cuda::PoolMode::kMax;
  if (mode == "avg_include_pad") return cuda::PoolMode::kAvgIncludePad;
  if (mode == "avg_exclude_pad") return cuda::PoolMode::kAvgExcludePad;
  throw ValueError(str("cudnn pooling: mode must be 'max', 'avg_include_pad' or 'avg_exclude_pad', got '", mode, "'"));
}

}  // namespace
#endif

void bind_cudnn(py::module_& m) {
#ifdef SINGA_LITE_WITH_CUDA
  const auto release = py::call_guard<py::gil_scoped_release>();
  m.def("cudnn_available", &cuda::cudnn_available, release,
        "True when the ops of CUDA tensors run through cuDNN now (loaded, a GPU visible, not switched off).");
  m.def("cudnn_unavailable_reason", &cuda::cudnn_unavailable_reason, release,
        "Why cuDNN is not used, or '' when it is.");
  m.def("cudnn_status", &cuda::cudnn_status, release, "Where cuDNN was loaded from, or why it cannot be.");
  m.def("cudnn_version", &cuda::cudnn_version, release, "cudnnGetVersion() (e.g. 92800), or 0 when not loadable.");
  m.def("set_cudnn_dir", &cuda::set_cudnn_library_dir, py::arg("dir"),
        "Folder to load cuDNN from first (the nvidia-cudnn wheel's lib folder; singa_lite sets it on import).");
  m.def("set_cudnn_enabled", &cuda::set_cudnn_enabled, py::arg("enabled"),
        "Switches cuDNN off (the own kernels run) or back on; starts as SINGA_LITE_CUDNN says. For tests and "
        "benchmarks.");
  m.def("cudnn_enabled", &cuda::cudnn_enabled);
  m.def("_cudnn_provoke_error", &cuda::cudnn_provoke_error,
        "Tests only: one invalid cuDNN call, which raises CudaError (or CudaError saying why cuDNN cannot load).");

  m.def("cudnn_conv2d_forward", &cuda::cudnn_conv2d_forward, py::arg("x"), py::arg("w"), py::arg("stride"),
        py::arg("padding"), py::arg("dilation"), py::arg("groups"), release,
        "x [N,C,H,W], w [OC,C/groups,kh,kw] -> y [N,OC,OH,OW] (no bias).");
  m.def("cudnn_conv2d_backward_data", &cuda::cudnn_conv2d_backward_data, py::arg("w"), py::arg("dy"),
        py::arg("x_shape"), py::arg("stride"), py::arg("padding"), py::arg("dilation"), py::arg("groups"), release);
  m.def("cudnn_conv2d_backward_filter", &cuda::cudnn_conv2d_backward_filter, py::arg("x"), py::arg("dy"),
        py::arg("w_shape"), py::arg("stride"), py::arg("padding"), py::arg("dilation"), py::arg("groups"), release);
  m.def("cudnn_pool2d_forward", [](const Tensor& x, const std::string& mode, Pair k, Pair s, Pair p) {
    const cuda::PoolMode pm = pool_mode(mode);
    py::gil_scoped_release unlocked;
    return cuda::cudnn_pool2d_forward(x, pm, k, s, p);
  }, py::arg("x"), py::arg("mode"), py::arg("kernel"), py::arg("stride"), py::arg("padding"),
        "mode: 'max', 'avg_include_pad' or 'avg_exclude_pad'.");
  m.def("cudnn_pool2d_backward", [](const Tensor& x, const Tensor& y, const Tensor& dy, const std::string& mode,
                                    Pair k, Pair s, Pair p) {
    const cuda::PoolMode pm = pool_mode(mode);
    py::gil_scoped_release unlocked;
    return cuda::cudnn_pool2d_backward(x, y, dy, pm, k, s, p);
  }, py::arg("x"), py::arg("y"), py::arg("dy"), py::arg("mode"), py::arg("kernel"), py::arg("stride"),
        py::arg("padding"));
  m.def("cudnn_batch_norm_forward_training", &cuda::cudnn_batch_norm_forward_training, py::arg("x"),
        py::arg("scale"), py::arg("bias"), py::arg("running_mean"), py::arg("running_var"), py::arg("momentum"),
        py::arg("eps"), release, "Returns (y, saved_mean, saved_inv_std); updates the running statistics in place.");
  m.def("cudnn_batch_norm_forward_inference", &cuda::cudnn_batch_norm_forward_inference, py::arg("x"),
        py::arg("scale"), py::arg("bias"), py::arg("running_mean"), py::arg("running_var"), py::arg("eps"), release);
  m.def("cudnn_batch_norm_backward", &cuda::cudnn_batch_norm_backward, py::arg("x"), py::arg("dy"), py::arg("scale"),
        py::arg("saved_mean"), py::arg("saved_inv_std"), py::arg("eps"), release, "Returns (dx, dscale, dbias).");
#else
  m.def("cudnn_available", [] { return false; });
  m.def("cudnn_unavailable_reason", [] { return std::string(kCpuOnly); });
  m.def("cudnn_status", [] { return std::string(kCpuOnly); });
  m.def("cudnn_version", [] { return 0; });
  m.def("set_cudnn_enabled", [](bool) {}, py::arg("enabled"));
  m.def("cudnn_enabled", [] { return false; });
#endif
}

}  // namespace sl::bindings
