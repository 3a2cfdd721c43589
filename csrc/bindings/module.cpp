// singa_lite._core: the C++ tensor library. Thin: each area binds itself.
#include "bindings/binders.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "singa_lite's C++ tensor core (CPU kernels through OpenBLAS; CUDA when compiled in)";
  sl::bindings::bind_errors(m);
  sl::bindings::bind_device(m);
  sl::bindings::bind_tensor(m);
  sl::bindings::bind_ops(m);
  sl::bindings::bind_nn(m);
  sl::bindings::bind_layer_norm(m);
  sl::bindings::bind_cudnn(m);  // cuDNN is loaded at run time as well
  sl::bindings::bind_comm(m);
#ifdef SINGA_LITE_WITH_CUDA
  sl::bindings::bind_nccl(m);  // NCCL is loaded at run time: a CUDA build imports without it
#endif
  sl::bindings::bind_build_info(m);
}
