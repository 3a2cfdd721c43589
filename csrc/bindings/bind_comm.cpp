// The shared-memory communicator as singa_lite._core.ShmComm, shm_unlink and its transport's helpers. Every
// call that may block releases the GIL, so other Python threads (and the rank's own abort()) keep running.
#include <pybind11/stl.h>
#include <unistd.h>  // pause

#include <exception>  // std::uncaught_exceptions

#include "bindings/binders.h"
#include "comm/mismatch.h"
#include "comm/mpi_hot.h"
#include "comm/shm_comm.h"
#include "core/errors.h"

namespace py = pybind11;

namespace sl::bindings {
namespace {

using comm::CommOp;
using comm::ShmComm;
using OptTensor = std::optional<Tensor>;
const auto release = py::call_guard<ReleaseGilForDaemon>();
unsigned long main_thread_ident = 0;  // threading.main_thread().ident, read when the module is imported

CommOp parse_op(const std::string& s, const char* op) {
  for (CommOp c : {CommOp::kSum, CommOp::kAvg, CommOp::kMax, CommOp::kMin, CommOp::kProd})
    if (s == comm::comm_op_name(c)) return c;
  throw ValueError(str(op, ": op must be one of 'sum', 'avg', 'max', 'min', 'prod', got '", s, "'"));
}

Tensor or_undefined(const OptTensor& t) { return t ? *t : Tensor(); }

}  // namespace

void check_python_signals() {
  if (!on_python_main_thread()) return;  // only the main thread runs signal handlers: nothing to check
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

ReleaseGilForDaemon::ReleaseGilForDaemon()
    : state_(PyEval_SaveThread()), unwinding_at_start_(std::uncaught_exceptions()) {}

ReleaseGilForDaemon::~ReleaseGilForDaemon() noexcept(false) {
  if (std::uncaught_exceptions() > unwinding_at_start_ && !on_python_main_thread() && interpreter_finalizing()) {
    for (;;) pause();  // parked: the process is exiting (see binders.h)
  }
  PyEval_RestoreThread(state_);  // may end this thread by a forced unwind (see binders.h)
}

bool on_python_main_thread() { return PyThread_get_thread_ident() == main_thread_ident; }

void bind_comm(py::module_& m) {
  // CollectiveMismatch: a ValueError subclass, so that `except ValueError` still catches it. Translators run
  // in the reverse order of registration: this one comes before bind_errors' ValueError.
  static py::handle mismatch(PyErr_NewExceptionWithDoc(
      "singa_lite._core.CollectiveMismatch",
      "The ranks called a collective with different arguments (operation, dtype, element count, root or op). "
      "Every rank raises it alike, naming what each rank passed; the communicator stays usable where the "
      "backend says so. Every backend raises this type (singa_lite.comm.CollectiveMismatch).",
      PyExc_ValueError, nullptr));
  m.attr("CollectiveMismatch") = mismatch;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const comm::CollectiveMismatch& e) {
      PyErr_SetString(mismatch.ptr(), e.what());
    }
  });
  main_thread_ident = py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  py::class_<ShmComm>(m, "ShmComm", R"doc(
Collectives among the processes of one host through POSIX shared memory (the CPU 'shm' backend).

Every rank constructs it with the same name ('/' + up to 199 characters, no other '/'), world size
and slot size; the constructor returns once all ranks have joined. The name identifies the rendezvous:
under the memfd transport (Linux's default) nothing of the job appears in /dev/shm (see shm_transport).
Tensors: CPU, contiguous, float16, float32, float64, int32 or int64; results are bitwise identical
on all ranks. If ranks pass different arguments to a collective, every rank raises the same ValueError.
A timeout, a dead or departed peer, or abort() on any rank makes every rank raise CommError, now or at
its next call.)doc")
      .def(py::init([](const std::string& name, int rank, int world_size, double timeout, size_t slot_bytes) {
             return std::make_unique<ShmComm>(name, rank, world_size, timeout, slot_bytes, check_python_signals);
           }),
           py::arg("name"), py::arg("rank"),
           py::arg("world_size"), py::arg("timeout") = 300.0, py::arg("slot_bytes") = size_t(1) << 20, release)
      .def_property_readonly("rank", &ShmComm::rank)
      .def_property_readonly("world_size", &ShmComm::world_size)
      .def_property_readonly("name", &ShmComm::name)
      .def_property_readonly("transport", [](const ShmComm& c) { return comm::transport_name(c.transport()); },
                             "'memfd' (no name in /dev/shm, a rendezvous socket) or 'named' (see shm_transport).")
      .def_property("timeout", &ShmComm::timeout, &ShmComm::set_timeout, "Seconds any single wait may last.")
      .def_property_readonly("aborted", &ShmComm::aborted)
      .def_property_readonly("abort_reason", &ShmComm::abort_reason,
                             "'rank R: reason' once the job is aborted, '' before.")
      .def_property_readonly("closed", &ShmComm::closed)
      .def("all_reduce", [](ShmComm& c, const Tensor& t, const std::string& op) {
        c.all_reduce(t, parse_op(op, "all_reduce"));
      }, py::arg("tensor"), py::arg("op") = "sum", release, "In place.")
      .def("broadcast", &ShmComm::broadcast, py::arg("tensor"), py::arg("root") = 0, release, "In place.")
      .def("all_gather", &ShmComm::all_gather, py::arg("out"), py::arg("input"), release,
           "out (world_size * input.numel elements) = every rank's input, in rank order.")
      .def("reduce_scatter", [](ShmComm& c, const Tensor& out, const Tensor& in, const std::string& op) {
        c.reduce_scatter(out, in, parse_op(op, "reduce_scatter"));
      }, py::arg("out"), py::arg("input"), py::arg("op") = "sum", release,
           "out = block `rank` of the reduction of every rank's input (world_size * out.numel elements).")
      .def("reduce", [](ShmComm& c, const Tensor& t, int root, const std::string& op) {
        c.reduce(t, root, parse_op(op, "reduce"));
      }, py::arg("tensor"), py::arg("root") = 0, py::arg("op") = "sum", release,
           "The reduction lands in `tensor` on the root; other ranks' tensors are unchanged.")
      .def("gather", [](ShmComm& c, const OptTensor& out, const Tensor& in, int root) {
        c.gather(or_undefined(out), in, root);
      }, py::arg("out"), py::arg("input"), py::arg("root") = 0, release, "out is used on the root only (None elsewhere).")
      .def("scatter", [](ShmComm& c, const Tensor& out, const OptTensor& in, int root) {
        c.scatter(out, or_undefined(in), root);
      }, py::arg("out"), py::arg("input"), py::arg("root") = 0, release,
           "input is used on the root only (None elsewhere).")
      .def("barrier", &ShmComm::barrier, release)
      .def("send", &ShmComm::send, py::arg("tensor"), py::arg("dst"), py::arg("tag") = 0, release,
           "Returns once the message is in the channel; blocks only while the channel is full.")
      .def("recv", &ShmComm::recv, py::arg("tensor"), py::arg("src"), py::arg("tag") = 0, release,
           "In place; tag, dtype and size must match the send.")
      .def("abort", &ShmComm::abort, py::arg("reason"), release,
           "Marks the job failed: every rank's current or next call raises CommError with this reason.")
      .def("close", &ShmComm::close, release, "Detaches; later calls raise CommError.")
      .def("__enter__", [](ShmComm& c) -> ShmComm& { return c; }, py::return_value_policy::reference)
      .def("__exit__", [](ShmComm& c, const py::args&) {
        ReleaseGilForDaemon unlocked;
        c.close();
      })
      .def("__repr__", [](const ShmComm& c) {
        return str("ShmComm(name='", c.name(), "', rank=", c.rank(), ", world_size=", c.world_size(), ")");
      });

  m.def("shm_unlink", &comm::shm_unlink_name, py::arg("name"),
        "Removes a shared-memory segment name (cleanup after a failed job); a missing name is fine.");
  m.def("shm_transport", [] { return comm::transport_name(comm::default_transport()); },
        "The transport a new ShmComm uses: 'memfd' (Linux's default: the memory never has a name; the segment "
        "name identifies an abstract-socket rendezvous) or 'named' (a POSIX name in /dev/shm), from "
        "SINGA_LITE_SHM_TRANSPORT when set. Every rank of a job must use the same.");
  m.def("shm_rendezvous_address", [](const std::string& name) {
        comm::validate_name(name, "shm_rendezvous_address");
        return py::bytes(comm::rendezvous_address(name));
      }, py::arg("name"),
        "The abstract Unix socket address (with its leading NUL) of the memfd transport's rendezvous for a name.");

  // The mpi backend's hot path (comm/mpi_hot.h); only singa_lite/comm/mpi.py makes one, after checking the ABI.
  using comm::MpiHotPath;
  using comm::MpiStatus;
  py::class_<MpiHotPath>(m, "MpiHotPath", "Internal: the per-call work of the mpi backend (see comm/mpi_hot.h).")
      .def(py::init([](const std::string& library, int comm, int win, intptr_t check_request, intptr_t slot,
                       intptr_t slots, int64_t slot_bytes, int world_size, intptr_t entered, intptr_t progress,
                       std::vector<int> dtype_codes, std::vector<int> mpi_types, std::vector<int> mpi_ops,
                       int all_reduce_kind, int avg_op, int max_op, int min_op, int request_null, int64_t spin_ns,
                       int64_t yield_ns) {
             comm::MpiHotSetup s{library, comm, win, check_request, slot, slots, slot_bytes, world_size, entered,
                                 progress, std::move(dtype_codes), std::move(mpi_types), std::move(mpi_ops),
                                 all_reduce_kind, avg_op, max_op, min_op, request_null, spin_ns, yield_ns};
             return std::make_unique<MpiHotPath>(std::move(s), check_python_signals);
           }),
           py::arg("library"), py::arg("comm"), py::arg("win"), py::arg("check_request"), py::arg("slot"),
           py::arg("slots"), py::arg("slot_bytes"), py::arg("world_size"), py::arg("entered"), py::arg("progress"),
           py::arg("dtype_codes"), py::arg("mpi_types"), py::arg("mpi_ops"), py::arg("all_reduce_kind"),
           py::arg("avg_op"), py::arg("max_op"), py::arg("min_op"), py::arg("request_null"), py::arg("spin_ns"),
           py::arg("yield_ns"))
      .def("enter", [](MpiHotPath& h, int kind, int dtype_code, int64_t count, int root, int op, bool check) {
        h.enter(kind, dtype_code, count, root, op, check);
      }, py::arg("kind"), py::arg("dtype_code"), py::arg("count"), py::arg("root"), py::arg("op"), py::arg("check"))
      .def("all_reduce", [](MpiHotPath& h, const Tensor& t, int op, bool check, double timeout) {
        return int(h.all_reduce(t, op, check, timeout));
      }, py::arg("tensor"), py::arg("op"), py::arg("check"), py::arg("timeout"), release)
      .def("wait", [](MpiHotPath& h, intptr_t request, double timeout) { return int(h.wait(request, timeout)); },
           py::arg("request"), py::arg("timeout"), release)
      .def("drain", &MpiHotPath::drain, py::arg("seconds"), release)
      .def_property_readonly("check_active", &MpiHotPath::check_active)
      .def_property_readonly("last_error", &MpiHotPath::last_error);
}

}  // namespace sl::bindings
