// Errors (the typed C++ errors as Python exceptions), Device, CUDA availability, seeds and thread counts.
#include <omp.h>

#include <climits>
#include <cstdint>
#include <optional>
#include <pybind11/operators.h>
#include <pybind11/stl.h>

#include "bindings/binders.h"
#include "core/device.h"
#include "core/errors.h"
#include "core/generator.h"
#include "core/storage.h"
#include "cpu/loop.h"
#ifdef SINGA_LITE_WITH_CUDA
#include "cuda/allocator.h"
#include "cuda/cublas.h"
#include "cuda/context.h"
#include "cuda/index_faults.h"
#include "cuda/runtime.h"
#endif

extern "C" void scipy_openblas_set_num_threads(int);

namespace py = pybind11;

namespace sl::bindings {

void bind_cuda_device(py::module_& m);

void bind_errors(py::module_& m) {
  // CudaError is a RuntimeError subclass so generic handlers still catch it.
  static py::handle cuda_error(PyErr_NewExceptionWithDoc(
      "singa_lite._core.CudaError", "A CUDA runtime call failed; the message names the call.", PyExc_RuntimeError,
      nullptr));
  m.attr("CudaError") = cuda_error;
  // CommError likewise: a failed, timed-out or aborted collective of a communicator.
  static py::handle comm_error(PyErr_NewExceptionWithDoc(
      "singa_lite._core.CommError",
      "A communicator failed: a peer died, left or timed out, the job was aborted, or the communicator is "
      "closed. The message names the operation, the ranks involved and what to do.",
      PyExc_RuntimeError, nullptr));
  m.attr("CommError") = comm_error;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what());
    } catch (const OutOfMemory& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    } catch (const CudaError& e) {
      PyErr_SetString(cuda_error.ptr(), e.what());
    } catch (const CommError& e) {
      PyErr_SetString(comm_error.ptr(), e.what());
    } catch (const InternalError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
}

void bind_device(py::module_& m) {
  py::class_<Device>(m, "Device", "A device: kind ('cpu' or 'cuda') and index.")
      .def(py::init([](const std::string& s) { return Device::parse(s); }), py::arg("spec") = "cpu")
      .def_property_readonly("kind", [](const Device& d) { return d.is_cpu() ? "cpu" : "cuda"; })
      .def_readonly("index", &Device::index)
      .def("is_cpu", &Device::is_cpu)
      .def("is_cuda", &Device::is_cuda)
      .def(py::self == py::self)
      .def(py::self != py::self)
      // SINGA's C++ tensor has a device() method where ours has a `device` property: a Device returns itself
      // when called, so SINGA's `t.device()` gives the same Device as `t.device`.
      .def("__call__", [](const Device& d) { return d; })
      .def("__hash__", [](const Device& d) { return py::hash(py::make_tuple(int(d.kind), d.index)); })
      .def("__str__", &Device::str)
      .def("__repr__", [](const Device& d) { return "Device('" + d.str() + "')"; })
      .def(py::pickle([](const Device& d) { return d.str(); }, [](const std::string& s) { return Device::parse(s); }));

  m.def("cuda_compiled", &cuda_compiled, "Was singa_lite built with its CUDA sources?");
  m.def("cuda_device_count", &cuda_device_count, "Number of usable CUDA GPUs (0 without a driver or a CUDA build).");
  m.def("cuda_unavailable_reason", &cuda_unavailable_reason, "Why no GPU can be used, or '' when one can.");
  m.def("cuda_absent_reason", &cuda_absent_reason,
        "Why there is certainly no usable GPU, or '' when there may be one, decided without initialising CUDA or "
        "loading the driver (the build, CUDA_VISIBLE_DEVICES, /dev/nvidia*): safe in a parent before it forks "
        "children that use the GPU.");
  m.def("manual_seed", &manual_seed, py::arg("device"), py::arg("seed"),
        "Seeds the device's random generator and restarts its stream.");
  m.def("current_seed", &current_seed, py::arg("device"));
  m.def("generator_state", &generator_state, py::arg("device"),
        "(seed, counter) of the device's random generator: the next draw starts at `counter`.");
  m.def("set_generator_state", &set_generator_state, py::arg("device"), py::arg("seed"), py::arg("counter"),
        "Restores what generator_state returned (both unsigned 64-bit integers).");
  // One pool: GEMMs are split over our OpenMP threads (cpu/matmul.cpp), each calling OpenBLAS on one thread.
  scipy_openblas_set_num_threads(1);
  m.def("set_num_threads", [](int n) {
    SL_CHECK(n >= 1, ValueError, "set_num_threads: expected n >= 1, got ", n);
    omp_set_num_threads(n);
  }, py::arg("n"), "Threads used by the CPU kernels, GEMMs included (OpenBLAS itself runs on one thread).");
  m.def("get_num_threads", [] { return cpu::max_threads(); },
        "Threads the CPU kernels use (1 in a child forked after its parent used them: see cpu/threads.cpp).");
  m.def("cpu_cache_bytes", &cpu_cache_bytes, "Bytes of released CPU blocks kept for reuse.");
  m.def("empty_cache", &empty_cpu_cache, "Returns the cached CPU blocks to the system.");
  bind_cuda_device(m);
}

// GPU services of a device: Sync, the caching allocator's statistics and cache. In a CPU-only build they
// raise the reason no GPU can be used. All release the GIL (Sync waits for the GPU).
void bind_cuda_device(py::module_& m) {
  const auto release = py::call_guard<py::gil_scoped_release>();
#ifdef SINGA_LITE_WITH_CUDA
  auto checked = [](int index) {
    const int n = cuda::device_count();
    SL_CHECK(index >= 0 && index < n, ValueError, "cuda:", index, " does not exist: ",
             n == 0 ? cuda::unavailable_reason() : str("this machine has ", n, " GPU(s)"));
    return index;
  };
  m.def("cuda_sync", [checked](int index) {
    cuda::sync(checked(index));
    cuda::raise_index_faults(index);
  }, py::arg("index"), release,
        "Waits for the work queued on the GPU's compute stream; raises IndexError when a kernel found an index out "
        "of range since the last such wait (checked on the GPU, reported here).");
  m.def("cuda_set_deferred_index_checks", &cuda::set_deferred_index_checks, py::arg("enabled"),
        "True (default unless SINGA_LITE_SYNC_INDEX_CHECKS=1): one_hot / take / index_add check indices on the GPU "
        "and report at the next wait for the device. False: they check on the host at the call (a sync each).");
  m.def("cuda_deferred_index_checks", &cuda::deferred_index_checks_enabled);
  m.def("cuda_memory_stats", [checked](int index) {
    const cuda::MemoryStats s = cuda::memory_stats(checked(index));
    auto limit = [](size_t v) { return v == SIZE_MAX ? py::object(py::none()) : py::object(py::int_(v)); };
    py::dict d;
    d["in_use"] = s.in_use;
    d["peak_in_use"] = s.peak_in_use;
    d["cached"] = s.cached;
    d["device_allocs"] = s.device_allocs;
    d["cache_limit"] = limit(s.cache_limit);
    d["memory_limit"] = limit(s.memory_limit);
    return d;
  }, py::arg("index"), "Bytes held by live tensors, their peak, bytes cached for reuse, cudaMalloc calls, and the "
     "cache cap and memory limit (None: none).");
  m.def("cuda_set_cache_limit", [checked](int index, std::optional<size_t> bytes) {
    cuda::set_cache_limit(checked(index), bytes.value_or(SIZE_MAX));
  }, py::arg("index"), py::arg("bytes"), release,
        "Caps the bytes of freed blocks kept for reuse on this GPU (None: no cap, the default unless "
        "SINGA_LITE_CUDA_CACHE_LIMIT is set). Memory over the cap goes back to the driver, where cuBLAS, cuDNN and "
        "NCCL can allocate it. Lowering the cap trims the cache at once.");
  m.def("cuda_set_memory_limit", [checked](int index, std::optional<size_t> bytes) {
    cuda::set_memory_limit(checked(index), bytes.value_or(SIZE_MAX));
  }, py::arg("index"), py::arg("bytes"),
        "Limits the bytes live tensors may hold on this GPU (None: no limit): past it an allocation raises "
        "MemoryError as a full GPU would.");
  m.def("_parse_bytes", &cuda::parse_bytes, py::arg("text"), py::arg("what"),
        "How SINGA_LITE_CUDA_CACHE_LIMIT is read: digits with an optional K / M / G / T (binary) suffix.");
  m.def("cuda_reset_peak", [checked](int index) { cuda::reset_peak(checked(index)); }, py::arg("index"));
  m.def("cuda_empty_cache", [checked](int index) { cuda::empty_cache(checked(index)); }, py::arg("index"),
        release, "Returns the GPU's cached blocks to the driver (cudaFree).");
  m.def("set_cublas_dir", &cuda::set_library_dir, py::arg("dir"),
        "Folder to load cuBLAS from first (the nvidia-cublas wheel's lib folder; singa_lite sets it on import).");
  m.def("cublas_status", &cuda::cublas_status, release, "Where cuBLAS was loaded from, or why it cannot be.");
  m.def("cuda_set_copy_staging", &cuda::set_copy_staging, py::arg("enabled"),
        "Host<->device copies of 1 MiB or more go through a pinned double buffer (default) or, when False, straight "
        "through cudaMemcpy. For benchmarks; results are the same either way.");
  m.def("cuda_copy_staging", &cuda::copy_staging);
  m.def("cuda_staged_copy_count", &cuda::staged_copy_count,
        "How many host<->device copies took the pinned staging path so far (the rest went straight through).");
#else
  m.def("cuda_set_copy_staging", [](bool) {}, py::arg("enabled"), "No effect in a CPU-only build.");
  m.def("cuda_set_deferred_index_checks", [](bool) {}, py::arg("enabled"), "No effect in a CPU-only build.");
  m.def("cuda_deferred_index_checks", [] { return false; });
  m.def("cuda_copy_staging", [] { return false; });
  m.def("cuda_staged_copy_count", [] { return uint64_t(0); });
  auto unavailable = [](int index) -> void {
    throw ValueError(str("cuda:", index, " is not available: ", cuda_unavailable_reason()));
  };
  for (const char* name : {"cuda_sync", "cuda_reset_peak", "cuda_empty_cache"}) m.def(name, unavailable, py::arg("index"));
  m.def("cuda_memory_stats", [](int index) -> py::dict {
    throw ValueError(str("cuda:", index, " is not available: ", cuda_unavailable_reason()));
  }, py::arg("index"));
  for (const char* name : {"cuda_set_cache_limit", "cuda_set_memory_limit"})
    m.def(name, [unavailable](int index, std::optional<size_t>) { unavailable(index); }, py::arg("index"),
          py::arg("bytes"));
#endif
}

}  // namespace sl::bindings
