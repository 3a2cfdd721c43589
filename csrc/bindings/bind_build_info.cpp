// build_info(): what this build compiled in, and what the runtime sees.
#include <omp.h>
#include <pybind11/stl.h>

#include "bindings/binders.h"
#include "core/device.h"
#ifdef SINGA_LITE_WITH_CUDA
#include "cuda/cublas.h"
#include "cuda/cudnn.h"
#include "cuda/runtime.h"
#endif

extern "C" char* scipy_openblas_get_config(void);

namespace py = pybind11;

namespace sl::bindings {

void bind_build_info(py::module_& m) {
  m.def("build_info", [] {
    py::dict info;
    info["compiler"] = SINGA_LITE_CXX_COMPILER;
    info["build_type"] = SINGA_LITE_BUILD_TYPE;
    info["openmp"] = _OPENMP;
    py::dict blas;
    blas["library"] = "OpenBLAS";
    blas["package"] = std::string("scipy-openblas32 ") + SINGA_LITE_OPENBLAS_VERSION;
    blas["config"] = std::string(scipy_openblas_get_config());
    info["blas"] = blas;
    py::dict cuda;
    cuda["compiled"] = cuda_compiled();
#ifdef SINGA_LITE_WITH_CUDA
    cuda["compiler_version"] = SINGA_LITE_CUDA_COMPILER_VERSION;
    cuda["runtime_version"] = cuda::runtime_version();
    cuda["driver_version"] = cuda::driver_version();
    cuda["cublas"] = py::dict(py::arg("version") = cuda::cublas_version(), py::arg("status") = cuda::cublas_status());
#else
    cuda["compiler_version"] = py::none();
    cuda["runtime_version"] = py::none();
    cuda["driver_version"] = py::none();
    cuda["cublas"] = py::none();
#endif
    cuda["device_count"] = cuda_device_count();
    info["cuda"] = cuda;
    // cuDNN: loaded at run time in CUDA builds; "used" says whether the ops take it now. NCCL is reported by
    // singa_lite.build_info.
#ifdef SINGA_LITE_WITH_CUDA
    const int cudnn_v = cuda::cudnn_version();
    const py::object cudnn_version = cudnn_v ? py::object(py::int_(cudnn_v)) : py::object(py::none());
    info["cudnn"] = py::dict(py::arg("compiled") = true, py::arg("version") = cudnn_version,
                             py::arg("status") = cuda::cudnn_status(),
                             py::arg("used") = cuda::cudnn_available(),
                             py::arg("reason") = cuda::cudnn_unavailable_reason());
#else
    info["cudnn"] = py::dict(py::arg("compiled") = false, py::arg("version") = py::none(),
                             py::arg("status") = kCpuOnly, py::arg("used") = false, py::arg("reason") = kCpuOnly);
#endif
    return info;
  });
}

}  // namespace sl::bindings
