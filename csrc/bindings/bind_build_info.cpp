// build_info(): what this build compiled in, and what the runtime sees.
#include <omp.h>
#include <pybind11/stl.h>

#include "bindings/binders.h"
#include "core/device.h"
#include "core/errors.h"
#include "cpu/isa.h"
#ifdef SINGA_LITE_WITH_CUDA
#include "cuda/cublas.h"
#include "cuda/cudnn.h"
#include "cuda/runtime.h"
#endif

extern "C" char* scipy_openblas_get_config(void);

namespace py = pybind11;

namespace sl::bindings {

void bind_build_info(py::module_& m) {
  // SINGA_LITE_ISA is applied on import, so that a bad value stops the import with its reason (as a ValueError)
  // instead of being ignored.
  try {
    cpu::set_isa_from_env();
  } catch (const sl::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
    throw py::error_already_set();
  }
  m.def("set_isa", [](const std::string& level) { cpu::set_isa(level); }, py::arg("level"),
        "Chooses the instruction-set level of the CPU kernels: 'baseline', 'avx2', 'avx512' or 'best' (the "
        "highest this CPU supports, the default). Results are the same bits on every level. Raises ValueError "
        "for an unknown name or a level this CPU lacks.");
  m.def("get_isa", [] { return std::string(cpu::isa_name(cpu::active_isa())); },
        "The instruction-set level the CPU kernels use now (see set_isa).");
  m.def("build_info", [] {
    py::dict info;
    info["compiler"] = SINGA_LITE_CXX_COMPILER;
    info["build_type"] = SINGA_LITE_BUILD_TYPE;
    info["openmp"] = _OPENMP;
    // The instruction-set level of the CPU kernels' hot loops (cpu/isa.h): in use, and the best this CPU has.
    info["cpu_isa"] = py::dict(py::arg("active") = cpu::isa_name(cpu::active_isa()),
                               py::arg("best") = cpu::isa_name(cpu::best_isa()));
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
