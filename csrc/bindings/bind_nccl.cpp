// The NCCL communicator as singa_lite._core.NcclComm / NcclWork, the single-process multi-GPU clique as
// NcclClique, and the nccl_* library functions. Compiled
// in CUDA builds only (module.cpp registers it under SINGA_LITE_WITH_CUDA). Every call that may wait or
// take the communicator's lock releases the GIL, so other Python threads keep running and a thread that
// polls NCCL can call back into Python (Ctrl-C) without a deadlock.
#include <pybind11/stl.h>

#include <optional>

#include "bindings/binders.h"
#include "core/errors.h"
#include "comm/nccl.h"
#include "comm/nccl_clique.h"

namespace py = pybind11;

namespace sl::bindings {
namespace {

namespace nc = cuda::nccl;
using OptTensor = std::optional<Tensor>;
const auto release = py::call_guard<ReleaseGilForDaemon>();  // see binders.h

Tensor or_undefined(const OptTensor& t) { return t ? *t : Tensor(); }

}  // namespace

void bind_nccl(py::module_& m) {
  m.def("nccl_set_library_dir", &nc::set_library_dir, py::arg("path"), release,
        "Directory searched first for libnccl.so.2 (the package passes the nvidia-nccl wheel's lib folder).");
  m.def("nccl_available", &nc::available, release, "Can NCCL be loaded? (loads it on first success)");
  m.def("nccl_unavailable_reason", &nc::unavailable_reason, release,
        "Why NCCL cannot be loaded, with how to install it; '' when it can.");
  m.def("nccl_version", &nc::version, release, "The loaded NCCL's version code, e.g. 23203 for 2.32.3.");
  m.def("nccl_get_unique_id", [] {
    std::string id;
    {
      ReleaseGilForDaemon unlocked;
      id = nc::get_unique_id();
    }
    return py::bytes(id);
  }, "A new NCCL unique id (128 bytes) for NcclComm; CommError / CudaError when NCCL or a GPU is missing.");

  py::class_<nc::Work, std::shared_ptr<nc::Work>>(m, "NcclWork", R"doc(
One operation queued by NcclComm on its device's communication stream. Holds the tensors involved until
order() (or its deletion) has made the compute stream wait for it.)doc")
      .def_property_readonly("what", &nc::Work::what, "The operation, e.g. 'all_reduce #3 (1024 float32)'.")
      .def("completed", &nc::Work::completed, release,
           "True once the GPU finished it (or the communicator failed: order() then raises).")
      .def("order", &nc::Work::order, release,
           "Makes the compute stream wait for it (the host does not block) and releases the tensors; "
           "CommError when the communicator failed.")
      .def("synchronize", [](nc::Work& w, double timeout, bool abort_on_timeout) {
        w.synchronize(timeout, abort_on_timeout, check_python_signals);
      }, py::arg("timeout"), py::arg("abort_on_timeout"), release,
           "Blocks until the GPU finished it, at most `timeout` seconds (CommError after that; with "
           "abort_on_timeout the communicator is aborted too).");

  py::class_<nc::Comm>(m, "NcclComm", R"doc(
A NCCL communicator on one GPU (the 'nccl' backend; use singa_lite.dist.init(backend='nccl')).

Every rank constructs it with the same 128-byte unique id (nccl_get_unique_id on one rank, shared), the
world size, its own rank and its GPU; the constructor returns once all ranks have joined (CommError after
`timeout` seconds). Tensors: contiguous, on that GPU, float16/32/64, bfloat16, int32/64. Every operation returns an
NcclWork at once; a watchdog aborts the communicator when an operation has not finished after `timeout`
seconds or NCCL reports an error, after which every call raises CommError.)doc")
      .def(py::init([](const py::bytes& unique_id, int rank, int world_size, int device, double timeout) {
             std::string id = unique_id;
             ReleaseGilForDaemon unlocked;
             return std::make_unique<nc::Comm>(id, rank, world_size, device, timeout, check_python_signals);
           }),
           py::arg("unique_id"), py::arg("rank"), py::arg("world_size"), py::arg("device"),
           py::arg("timeout") = 300.0)
      .def_property_readonly("rank", &nc::Comm::rank)
      .def_property_readonly("world_size", &nc::Comm::world_size)
      .def_property_readonly("device", &nc::Comm::device, "The CUDA device index.")
      .def_property("timeout", &nc::Comm::timeout, &nc::Comm::set_timeout,
                    "Seconds an operation may take before the communicator is aborted.")
      .def_property_readonly("error", &nc::Comm::error, "Why the communicator failed; '' while it works.")
      .def_property_readonly("closed", &nc::Comm::closed)
      .def("all_reduce", &nc::Comm::all_reduce, py::arg("tensor"), py::arg("op") = "sum", release, "In place.")
      .def("broadcast", &nc::Comm::broadcast, py::arg("tensor"), py::arg("root") = 0, release, "In place.")
      .def("reduce", &nc::Comm::reduce, py::arg("tensor"), py::arg("root") = 0, py::arg("op") = "sum", release,
           "The reduction lands in `tensor` on the root; other ranks' tensors are unchanged.")
      .def("all_gather", &nc::Comm::all_gather, py::arg("out"), py::arg("input"), release,
           "out (world_size * input.numel elements) = every rank's input, in rank order.")
      .def("reduce_scatter", &nc::Comm::reduce_scatter, py::arg("out"), py::arg("input"), py::arg("op") = "sum",
           release, "out = block `rank` of the reduction of every rank's input (world_size * out.numel elements).")
      .def("gather", [](nc::Comm& c, const OptTensor& out, const Tensor& in, int root) {
        return c.gather(or_undefined(out), in, root);
      }, py::arg("out"), py::arg("input"), py::arg("root") = 0, release,
           "out is used on the root only (None elsewhere).")
      .def("scatter", [](nc::Comm& c, const Tensor& out, const OptTensor& in, int root) {
        return c.scatter(out, or_undefined(in), root);
      }, py::arg("out"), py::arg("input"), py::arg("root") = 0, release,
           "input is used on the root only (None elsewhere).")
      .def("send", &nc::Comm::send, py::arg("tensor"), py::arg("dst"), release,
           "Matched with the peer's recv calls in call order (NCCL has no tags).")
      .def("recv", &nc::Comm::recv, py::arg("tensor"), py::arg("src"), release, "In place.")
      .def("abort", &nc::Comm::abort, py::arg("reason"), release,
           "Aborts this rank's communicator; every later call raises CommError with the reason.")
      .def("close", &nc::Comm::close, release,
           "Finalizes and destroys the communicator (idempotent); later calls raise CommError.")
      .def("__repr__", [](const nc::Comm& c) {
        return str("NcclComm(rank=", c.rank(), ", world_size=", c.world_size(), ", device=cuda:", c.device(), ")");
      });

  py::class_<nc::Clique>(m, "NcclClique", R"doc(
NCCL's single-process multi-device communicator: one NCCL rank per listed GPU, all driven by this process
(singa_lite.multi_device.all_reduce uses it; see csrc/comm/nccl_clique.h).

devices: distinct CUDA device ordinals (rank i on cuda:devices[i]); the constructor returns once every
communicator is initialised (CommError after `timeout` seconds). all_reduce and broadcast take one tensor
per device in that order (contiguous, one shape and dtype: float16/32/64, bfloat16, int32/64) and run on the devices'
compute streams, so later work on those tensors is ordered after them; they return once NCCL has queued
the work. A failure aborts every communicator, after which every call raises CommError.)doc")
      .def(py::init([](const std::vector<int>& devices, double timeout) {
             ReleaseGilForDaemon unlocked;
             return std::make_unique<nc::Clique>(devices, timeout, check_python_signals);
           }),
           py::arg("devices"), py::arg("timeout") = 300.0)
      .def_property_readonly("devices", &nc::Clique::devices, "The CUDA device ordinals, rank order.")
      .def_property_readonly("size", &nc::Clique::size)
      .def_property("timeout", &nc::Clique::timeout, &nc::Clique::set_timeout,
                    "Seconds an NCCL call may take to complete before the clique is aborted.")
      .def_property_readonly("error", &nc::Clique::error, "Why the clique failed; '' while it works.")
      .def_property_readonly("closed", &nc::Clique::closed)
      .def("all_reduce", &nc::Clique::all_reduce, py::arg("tensors"), py::arg("op") = "sum", release,
           "In place: every tensor becomes the reduction (op: sum, avg, max, min, prod).")
      .def("broadcast", &nc::Clique::broadcast, py::arg("tensors"), py::arg("root") = 0, release,
           "In place: every tensor becomes a copy of tensors[root].")
      .def("synchronize", &nc::Clique::synchronize, py::arg("timeout"), release,
           "Blocks until every device finished the last operation, at most `timeout` seconds (then the clique "
           "is aborted and CommError raised).")
      .def("abort", &nc::Clique::abort, py::arg("reason"), release,
           "Aborts every communicator; every later call raises CommError with the reason.")
      .def("close", &nc::Clique::close, release,
           "Finalizes and destroys the communicators (idempotent); later calls raise CommError.")
      .def("__repr__", [](const nc::Clique& c) {
        std::string devs;
        for (int d : c.devices()) devs += str(devs.empty() ? "" : ", ", "cuda:", d);
        return str("NcclClique(devices=[", devs, "])");
      });
}

}  // namespace sl::bindings
