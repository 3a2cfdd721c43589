// One binder per area; module.cpp calls them in order.
#pragma once
#include <pybind11/pybind11.h>

namespace sl::bindings {

// What a CPU-only build says of its GPU libraries (cuDNN, NCCL): one wording everywhere, so reasons compare.
inline constexpr const char* kCpuOnly = "not built (CPU-only build)";

// Releases the GIL for a blocking call, as py::gil_scoped_release, for calls that daemon threads make
// (DistOpt's communication thread waits in collectives). Such a call may return while the interpreter shuts
// down (its rank is exiting: an uncaught exception, sys.exit); CPython then ends the thread, when it takes the
// GIL back, by pthread_exit: a forced unwind. py::gil_scoped_release takes it back in a noexcept destructor,
// so that unwind became std::terminate() (SIGABRT, "terminate called without an active exception", in place
// of the rank's real exit status). This destructor lets the unwind through (pybind11 rethrows it and the
// thread ends quietly). While an exception from the call is already unwinding, a second one cannot pass:
// then, if the interpreter is finalizing, the thread is parked until the process exits, as CPython 3.14
// does itself.
class ReleaseGilForDaemon {
 public:
  ReleaseGilForDaemon();
  ~ReleaseGilForDaemon() noexcept(false);
  ReleaseGilForDaemon(const ReleaseGilForDaemon&) = delete;
  ReleaseGilForDaemon& operator=(const ReleaseGilForDaemon&) = delete;

 private:
  PyThreadState* state_;
  int unwinding_at_start_;
};

// True on the thread Python runs signal handlers on (threading.main_thread()); callable without the GIL.
bool on_python_main_thread();

// Called (without the GIL) about every 40 ms by a waiting communicator call: runs Python's signal handlers,
// so Ctrl-C ends a stuck collective with KeyboardInterrupt at once instead of after the timeout. Other
// threads (DistOpt's communication thread) return at once: they run no handlers, and must not take the GIL
// while the interpreter shuts down (see ReleaseGilForDaemon).
void check_python_signals();

void bind_errors(pybind11::module_& m);
void bind_device(pybind11::module_& m);
void bind_tensor(pybind11::module_& m);
void bind_ops(pybind11::module_& m);
void bind_nn(pybind11::module_& m);
void bind_layer_norm(pybind11::module_& m);  // bind_layer_norm.cpp: the fused CPU layer norm
void bind_cudnn(pybind11::module_& m);  // cuDNN ops (CUDA builds) and availability (every build)
void bind_build_info(pybind11::module_& m);
void bind_comm(pybind11::module_& m);
#ifdef SINGA_LITE_WITH_CUDA
void bind_nccl(pybind11::module_& m);  // bind_nccl.cpp, compiled in CUDA builds only
#endif
}  // namespace sl::bindings
