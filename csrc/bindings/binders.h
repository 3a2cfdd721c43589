// One binder per area; module.cpp calls them in order.
#pragma once
#include <pybind11/pybind11.h>

namespace sl::bindings {
void bind_errors(pybind11::module_& m);
void bind_device(pybind11::module_& m);
void bind_tensor(pybind11::module_& m);
void bind_ops(pybind11::module_& m);
void bind_nn(pybind11::module_& m);
void bind_cudnn(pybind11::module_& m);  // cuDNN ops (CUDA builds) and availability (every build)
void bind_build_info(pybind11::module_& m);
void bind_comm(pybind11::module_& m);
#ifdef SINGA_LITE_WITH_CUDA
void bind_nccl(pybind11::module_& m);  // bind_nccl.cpp, compiled in CUDA builds only
#endif
}  // namespace sl::bindings
