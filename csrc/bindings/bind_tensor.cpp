// The C++ Tensor as singa_lite._core.Tensor: views, copies, numpy interop (buffer protocol both ways
// and DLPack both ways, zero-copy on the CPU).
#include <pybind11/eval.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings/binders.h"
#include "bindings/dlpack.h"
#include "core/errors.h"
#include "core/tensor.h"
#include "ops/ops.h"
#ifdef SINGA_LITE_WITH_CUDA
#include "cuda/check.h"
#include "cuda/context.h"
#endif

namespace py = pybind11;

namespace sl::bindings {
namespace {

DType dtype_from_format(const std::string& format_in, ssize_t itemsize) {
  std::string f = format_in;
  while (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@' || f[0] == '!' || f[0] == '>')) {
    SL_CHECK(f[0] != '>' && f[0] != '!', TypeError, "from_buffer: big-endian data is not supported; use "
             "array.astype(array.dtype.newbyteorder('<'))");
    f = f.substr(1);
  }
  if (f == "e") return DType::kFloat16;
  if (f == "f") return DType::kFloat32;
  if (f == "d") return DType::kFloat64;
  if (f == "?") return DType::kBool;
  if (f == "i" || f == "l" || f == "q" || f == "n") {
    if (itemsize == 4) return DType::kInt32;
    if (itemsize == 8) return DType::kInt64;
  }
  throw TypeError(str("from_buffer: unsupported element type '", format_in, "' (", itemsize,
                      " bytes); singa_lite supports float16/32/64, int32, int64 and bool. "
                      "Convert first, e.g. array.astype(numpy.float32)"));
}

// Shares the memory of a writable buffer-protocol object (numpy array, memoryview, ...) without copying.
// A read-only buffer (np.frombuffer of bytes, np.broadcast_to, ...) is copied instead, so writing to
// the tensor can never modify memory its owner declared immutable.
Tensor from_buffer(const py::buffer& obj) {
  py::buffer_info info = obj.request();
  DType dtype = dtype_from_format(info.format, info.itemsize);
  Shape shape(info.shape.begin(), info.shape.end()), strides;
  for (ssize_t s : info.strides) {
    SL_CHECK(s % info.itemsize == 0, ValueError, "from_buffer: strides ", s, " are not a multiple of the item size ",
             info.itemsize, "; pass numpy.ascontiguousarray(array)");
    strides.push_back(s / info.itemsize);
  }
  // The storage keeps the Python object alive; releasing it needs the GIL (kernels run without it).
  auto* owner = new py::object(obj);
  auto deleter = [owner](void*) {
    py::gil_scoped_acquire gil;
    delete owner;
  };
  auto storage = std::make_shared<Storage>(info.ptr, size_t(numel_of(shape)) * itemsize(dtype), Device::cpu(), deleter);
  Tensor shared(storage, shape, strides, 0, dtype);
  if (!info.readonly) return shared;
  py::gil_scoped_release release;
  return shared.clone();
}

py::buffer_info to_buffer(const Tensor& t) {
  check_defined(t, "buffer", "tensor");
  SL_CHECK(t.dtype() != DType::kBFloat16, TypeError, "numpy has no bfloat16 type, so a bfloat16 tensor has no "
           "buffer view; read it as float32 (exact): t.cast(DType.float32), or tensor.to_numpy(t)");
  SL_CHECK(t.device().is_cpu(), ValueError, "numpy can only read CPU tensors; this one is on ", t.device().str(),
           ". Copy it first with to_host() (or tensor.to_numpy)");
  std::vector<ssize_t> shape(t.shape().begin(), t.shape().end()), strides;
  for (int64_t s : t.strides()) strides.push_back(ssize_t(s * int64_t(t.itemsize())));
  return py::buffer_info(t.data_ptr(), ssize_t(t.itemsize()), buffer_format(t.dtype()), t.ndim(), shape, strides);
}

// ---------------------------------------------------------------- DLPack
// An exported tensor, alive while the consumer holds it. `consumer` is the stream the consumer said it reads on
// (__dlpack__'s stream argument), kept for the release: see release_after_consumer.
struct DLContext {
  Tensor tensor;  // keeps the storage alive while the consumer holds the capsule
  std::vector<int64_t> shape, strides;
  dlpack::DLManagedTensor managed;
  dlpack::DLManagedTensorVersioned versioned;
  int64_t consumer = 0;  // CUDA tensors: the stream handle as the array API gives it (1, 2, -1 or a pointer)
};

dlpack::DLDataType dl_dtype(DType t) {
  switch (t) {
    case DType::kFloat16: return {dlpack::kDLFloat, 16, 1};
    case DType::kFloat32: return {dlpack::kDLFloat, 32, 1};
    case DType::kFloat64: return {dlpack::kDLFloat, 64, 1};
    case DType::kInt32: return {dlpack::kDLInt, 32, 1};
    case DType::kInt64: return {dlpack::kDLInt, 64, 1};
    case DType::kBool: return {dlpack::kDLBool, 8, 1};
    case DType::kBFloat16: return {dlpack::kDLBfloat, 16, 1};
  }
  throw TypeError("__dlpack__: unsupported dtype");
}

DType dtype_from_dl(dlpack::DLDataType t) {
  SL_CHECK(t.lanes == 1, TypeError, "from_dlpack: vector types (lanes=", t.lanes, ") are not supported");
  if (t.code == dlpack::kDLFloat && t.bits == 16) return DType::kFloat16;
  if (t.code == dlpack::kDLFloat && t.bits == 32) return DType::kFloat32;
  if (t.code == dlpack::kDLFloat && t.bits == 64) return DType::kFloat64;
  if (t.code == dlpack::kDLInt && t.bits == 32) return DType::kInt32;
  if (t.code == dlpack::kDLInt && t.bits == 64) return DType::kInt64;
  if (t.code == dlpack::kDLBool && t.bits == 8) return DType::kBool;
  if (t.code == dlpack::kDLBfloat && t.bits == 16) return DType::kBFloat16;
  throw TypeError(str("from_dlpack: unsupported type (code ", int(t.code), ", ", int(t.bits),
                      " bits); supported: float16/32/64, bfloat16, int32, int64, bool"));
}

// The stream argument of __dlpack__, checked: None, or an int as the array API defines it (1: the legacy default
// stream, 2: the per-thread default stream, -1: the consumer synchronises itself, else a cudaStream_t). For a CUDA
// tensor None means 1. A CPU tensor has no stream: only None. Returns the handle (0 for a CPU tensor).
int64_t consumer_stream(const Tensor& t, const py::object& stream) {
  if (!stream.is_none() && (!PyIndex_Check(stream.ptr()) || py::isinstance<py::bool_>(stream)))
    throw TypeError(str("__dlpack__: stream must be None or an int (a CUDA stream handle, or 1, 2, -1), got ",
                        std::string(py::str(py::type::of(stream).attr("__name__")))));
  if (t.device().is_cpu()) {
    SL_CHECK(stream.is_none(), ValueError, "__dlpack__: this tensor is on the CPU, which has no streams; pass "
             "stream=None (got ", py::int_(stream).cast<int64_t>(), ")");
    return 0;
  }
  const int64_t handle = stream.is_none() ? 1 : py::int_(stream).cast<int64_t>();
  SL_CHECK(handle > 0 || handle == -1, ValueError, "__dlpack__: stream must be None, -1, 1, 2 or a CUDA stream "
           "handle, got ", handle, " (0 is ambiguous and not allowed by the array API)");
  return handle;
}

#ifdef SINGA_LITE_WITH_CUDA
cudaStream_t as_stream(int64_t handle) {
  if (handle == 1) return cudaStreamLegacy;
  if (handle == 2) return cudaStreamPerThread;
  return reinterpret_cast<cudaStream_t>(handle);
}
#endif

// Before export: the consumer's stream is made to wait for what we queued (the array API's contract: our kernels
// run on the device's own compute stream). An event, not a host wait: nothing blocks.
void order_consumer_stream(const Tensor& t, int64_t consumer) {
#ifdef SINGA_LITE_WITH_CUDA
  if (!t.device().is_cuda() || consumer == -1) return;
  const int device = t.device().index;
  cuda::DeviceGuard guard(device);
  cudaEvent_t ev = nullptr;
  SL_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  cudaError_t err = cudaEventRecord(ev, cuda::stream(device));
  if (err == cudaSuccess) err = cudaStreamWaitEvent(as_stream(consumer), ev, 0);
  cudaEventDestroy(ev);  // released once the wait is satisfied
  SL_CUDA_CHECK(err);
#else
  (void)t;
  (void)consumer;
#endif
}

// The consumer is done with an exported CUDA tensor (its deleter ran): before the memory goes back to the caching
// allocator, which hands it to the next kernel on our compute stream at once, our stream is made to wait for what
// the consumer has queued on its stream so far (the kernels that read it). Without this, the next kernel of ours
// could overwrite memory that torch or CuPy is still reading. With stream -1 the consumer named no stream, so the
// whole device is waited for. Called from a deleter: nothing may throw, and a failure falls back to that full wait.
void release_after_consumer(const DLContext& ctx) noexcept {
#ifdef SINGA_LITE_WITH_CUDA
  if (!ctx.tensor.device().is_cuda() || ctx.consumer == 0) return;
  const int device = ctx.tensor.device().index;
  try {
    cuda::DeviceGuard guard(device);
    cudaError_t err = cudaErrorUnknown;
    if (ctx.consumer != -1) {
      cudaEvent_t ev = nullptr;
      err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
      if (err == cudaSuccess) {
        err = cudaEventRecord(ev, as_stream(ctx.consumer));
        if (err == cudaSuccess) err = cudaStreamWaitEvent(cuda::stream(device), ev, 0);
        cudaEventDestroy(ev);
      }
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      if (cudaDeviceSynchronize() != cudaSuccess) cudaGetLastError();
    }
  } catch (...) {
    // no GPU context could be made current: nothing can run on this device, so nothing can reuse the memory early
  }
#else
  (void)ctx;
#endif
}

constexpr uint64_t kDLPackFlagIsCopied = uint64_t(1) << 1;  // DLPACK_FLAG_BITMASK_IS_COPIED

// versioned: a DLPack 1.0 capsule (the consumer passed max_version >= (1, 0)), otherwise a legacy one.
// copied: the tensor is a copy made for this export (copy=True), which a versioned capsule says in its flags.
py::capsule to_dlpack(const Tensor& t, bool versioned, int64_t consumer, bool copied) {
  check_defined(t, "__dlpack__", "tensor");
  auto* ctx = new DLContext{t, t.shape(), t.strides(), {}, {}, consumer};
  dlpack::DLTensor dl;
  dl.data = t.data_ptr();
  dl.device = {t.device().is_cpu() ? dlpack::kDLCPU : dlpack::kDLCUDA, t.device().index};
  dl.ndim = t.ndim();
  dl.dtype = dl_dtype(t.dtype());
  dl.shape = ctx->shape.data();
  dl.strides = ctx->strides.data();
  dl.byte_offset = 0;
  // A consumer renames the capsule ("used_...") and calls the deleter itself; an unused one is freed here, and since
  // nothing read it, without ordering against the consumer's stream (which may be gone by then).
  if (versioned) {
    ctx->versioned = {{1, 0}, ctx, [](dlpack::DLManagedTensorVersioned* self) {
                        auto* c = static_cast<DLContext*>(self->manager_ctx);
                        release_after_consumer(*c);
                        delete c;
                      }, copied ? kDLPackFlagIsCopied : 0, dl};
    return py::capsule(&ctx->versioned, "dltensor_versioned", [](PyObject* cap) {
      if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        auto* m = static_cast<dlpack::DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, "dltensor_versioned"));
        static_cast<DLContext*>(m->manager_ctx)->consumer = 0;
        m->deleter(m);
      }
    });
  }
  ctx->managed = {dl, ctx, [](dlpack::DLManagedTensor* self) {
                    auto* c = static_cast<DLContext*>(self->manager_ctx);
                    release_after_consumer(*c);
                    delete c;
                  }};
  return py::capsule(&ctx->managed, "dltensor", [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) {
      auto* m = static_cast<dlpack::DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      static_cast<DLContext*>(m->manager_ctx)->consumer = 0;
      m->deleter(m);
    }
  });
}

// The producer's __dlpack__ call. A CUDA producer is handed our compute stream, so that it orders its pending
// writes before our kernels (the array API's contract); others are called without one.
py::object producer_capsule(const py::object& obj) {
  if (!py::hasattr(obj, "__dlpack__")) return obj;
#ifdef SINGA_LITE_WITH_CUDA
  if (py::hasattr(obj, "__dlpack_device__")) {
    py::tuple dev = obj.attr("__dlpack_device__")();
    if (dev.size() == 2 && dev[0].cast<int>() == int(dlpack::kDLCUDA)) {
      const int device = dev[1].cast<int>();
      SL_CHECK(device >= 0 && device < cuda_device_count(), ValueError, "from_dlpack: the producer's tensor is on cuda:",
               device, ", which this process cannot use (", cuda_device_count(), " GPU(s) visible)");
      return obj.attr("__dlpack__")(py::arg("stream") = reinterpret_cast<int64_t>(cuda::stream(device)));
    }
  }
#endif
  return obj.attr("__dlpack__")();
}

// __dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None), the array API's (2023.12) signature.
py::capsule dlpack_export(const Tensor& t, const py::kwargs& kw) {
  check_defined(t, "__dlpack__", "tensor");
  for (const auto& item : kw) {
    const std::string key = py::str(item.first);
    SL_CHECK(key == "stream" || key == "max_version" || key == "dl_device" || key == "copy", TypeError,
             "__dlpack__: unexpected argument '", key, "'; it takes stream, max_version, dl_device and copy");
  }
  auto arg = [&](const char* k) { return kw.contains(k) ? py::object(kw[k]) : py::object(py::none()); };
  const int64_t consumer = consumer_stream(t, arg("stream"));
  bool versioned = false;
  if (py::object mv = arg("max_version"); !mv.is_none()) {
    SL_CHECK(py::isinstance<py::sequence>(mv) && py::len(mv) == 2, TypeError,
             "__dlpack__: max_version must be a (major, minor) pair, got ", std::string(py::repr(mv)));
    versioned = mv[py::int_(0)].cast<int>() >= 1;
  }
  const int dl_type = t.device().is_cpu() ? int(dlpack::kDLCPU) : int(dlpack::kDLCUDA);
  if (py::object want = arg("dl_device"); !want.is_none()) {
    SL_CHECK(py::isinstance<py::sequence>(want) && py::len(want) == 2, TypeError,
             "__dlpack__: dl_device must be a (device_type, device_id) pair, got ", std::string(py::repr(want)));
    const auto pair = want.cast<std::pair<int, int>>();
    if (pair.first != dl_type || pair.second != t.device().index)
      throw py::buffer_error(str("__dlpack__: this tensor is on ", t.device().str(), " (DLPack device (", dl_type,
                                 ", ", t.device().index, ")); it cannot be exported to device (", pair.first, ", ",
                                 pair.second, "). Copy it with to_device() first"));
  }
  Tensor shared = t;
  const py::object copy = arg("copy");
  const bool copied = !copy.is_none() && copy.cast<bool>();
  if (copied) {
    py::gil_scoped_release release;
    shared = t.clone();  // copy=True: the consumer gets memory of its own
  }
  order_consumer_stream(shared, consumer);
  return to_dlpack(shared, versioned, consumer, copied);
}

Tensor from_dlpack(const py::object& obj) {
  py::object cap_obj = producer_capsule(obj);
  PyObject* cap = cap_obj.ptr();
  SL_CHECK(PyCapsule_IsValid(cap, "dltensor"), TypeError,
           "from_dlpack: expected an object with __dlpack__() or an unused 'dltensor' capsule");
  auto* m = static_cast<dlpack::DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
  const auto& dl = m->dl_tensor;
  DType dtype = dtype_from_dl(dl.dtype);
  Device device;
  if (dl.device.device_type == dlpack::kDLCPU) device = Device::cpu();
  else if (dl.device.device_type == dlpack::kDLCUDA) device = Device::cuda(dl.device.device_id);
  else throw ValueError(str("from_dlpack: unsupported device type ", dl.device.device_type, " (CPU and CUDA only)"));
  Shape shape(dl.shape, dl.shape + dl.ndim);
  Shape strides = dl.strides ? Shape(dl.strides, dl.strides + dl.ndim) : contiguous_strides(shape);
  SL_CHECK(dl.byte_offset % itemsize(dtype) == 0, ValueError, "from_dlpack: byte offset not aligned to the item size");
  PyCapsule_SetName(cap, "used_dltensor");
  auto storage = std::make_shared<Storage>(static_cast<char*>(dl.data) + dl.byte_offset,
                                           size_t(numel_of(shape)) * itemsize(dtype), device, [m, device](void*) {
#ifdef SINGA_LITE_WITH_CUDA
                                             // our kernels may still read the memory: the producer may reuse it
                                             // as soon as it gets it back
                                             if (device.is_cuda()) {
                                               try {
                                                 cuda::sync(device.index);
                                               } catch (...) {
                                               }
                                             }
#else
                                             (void)device;
#endif
                                             py::gil_scoped_acquire gil;  // producers may touch Python objects
                                             if (m->deleter) m->deleter(m);
                                           });
  return Tensor(storage, shape, strides, 0, dtype);
}

py::tuple tuple_of(const Shape& s) {
  py::tuple t(s.size());
  for (size_t i = 0; i < s.size(); ++i) t[i] = s[i];
  return t;
}

// ---------------------------------------------------------------- SINGA's C++ names (singa_wrap.Tensor)
// SINGA's Python code and tests call its SWIG-wrapped C++ tensor with C++-style names (Size(), data_type(),
// ToHost(), GetFloatValue(n), ...). They are bound here on the same class, next to our own names, so that a
// tensor.Tensor's `.data` is SINGA's CTensor: one class, no wrapper. Two of SINGA's names are properties of
// ours: `shape` returns a Shape (a tuple that is also callable, `shape()` / `shape(i)`), and `device` a Device
// that returns itself when called, so `t.shape()` and `t.device()` work next to `t.shape` and `t.device`.

// A device argument as SINGA scripts pass it: a _core.Device, a singa_lite.device.Device, or a name ("cuda:0").
Device device_arg(const py::object& dev) {
  if (py::isinstance<Device>(dev)) return dev.cast<Device>();
  return py::module_::import("singa_lite.device").attr("as_device")(dev).attr("core").cast<Device>();
}

// The first `num` values of t, in row-major order, as a new numpy array of `dtype` (t may live on any device).
py::array host_values(const Tensor& t, int64_t num, DType dtype, const char* op) {
  check_defined(t, op, "tensor");
  SL_CHECK(num >= 0 && num <= t.numel(), IndexError, op, "(", num, "): the tensor has ", t.numel(),
           " elements; ask for at most that many (t.Size())");
  Tensor host;
  {
    py::gil_scoped_release release;
    host = t.to(Device::cpu()).cast(dtype).contiguous();
  }
  const ssize_t item = ssize_t(itemsize(dtype));
  // no base object given: pybind11 copies the data into the new array
  return py::array(py::dtype(std::string(buffer_format(dtype))), {ssize_t(num)}, {item}, host.data_ptr());
}

// Copies a host sequence (list, numpy array) into t's elements [offset, offset + len(src)). The tensor must
// already hold `dtype` (SINGA's CopyFloatDataFromHostPtr writes float bits; into an int tensor that is never
// what was meant, so it is refused rather than cast).
void copy_from_host(const Tensor& t, const py::object& src, int64_t offset, DType dtype, const char* op) {
  check_defined(t, op, "tensor");
  SL_CHECK(t.dtype() == dtype, TypeError, op, ": the tensor holds ", dtype_name(t.dtype()), ", this call writes ",
           dtype_name(dtype), "; use the Copy...DataFromHostPtr of the tensor's type or AsType() first");
  SL_CHECK(!src.is_none(), TypeError, op, ": src is None; pass a list or a numpy array of values");
  py::array arr = py::module_::import("numpy").attr("ascontiguousarray")(src, py::arg("dtype") = buffer_format(dtype));
  arr = arr.attr("reshape")(-1);
  const int64_t num = int64_t(arr.size());
  SL_CHECK(offset >= 0 && offset + num <= t.numel(), IndexError, op, ": ", num, " values at offset ", offset,
           " do not fit the tensor's ", t.numel(), " elements");
  SL_CHECK(t.is_contiguous(), ValueError, op, ": the tensor is a non-contiguous view; copy it with Clone() first");
  Tensor values = from_buffer(arr);
  py::gil_scoped_release release;
  sl::copy_(t.view({-1}).slice(0, offset, offset + num, 1), values);
}

// f() run without the GIL (a copy or a cast may take long), its result returned with the GIL held again.
template <class F>
Tensor released(F&& f) {
  py::gil_scoped_release release;
  return f();
}

double host_scalar(const Tensor& t) {
  Tensor host = t.to(Device::cpu()).cast(DType::kFloat64);
  return *host.data<double>();
}

// SINGA's Tensor::Repeat, numpy.repeat's meaning: one count for every element, or one count per index of `axis`.
// No axis (None, or SINGA's Noaxis 9999) repeats the flattened tensor.
Tensor repeat(const Tensor& t, const std::vector<int64_t>& repeats, std::optional<int64_t> axis) {
  check_defined(t, "Repeat", "tensor");
  constexpr int64_t kNoAxis = 9999;
  Tensor src = t;
  int64_t ax = 0;
  if (!axis || *axis == kNoAxis) {
    src = t.reshape({-1});
  } else {
    ax = *axis < 0 ? *axis + t.ndim() : *axis;
    SL_CHECK(ax >= 0 && ax < t.ndim(), IndexError, "Repeat: axis ", *axis, " is out of range for ", t.ndim(),
             " dimensions");
  }
  SL_CHECK(!repeats.empty(), ValueError, "Repeat: repeats is empty; give one count, or one per index of the axis");
  for (int64_t r : repeats) SL_CHECK(r >= 0, ValueError, "Repeat: counts must be >= 0, got ", r);
  if (repeats.size() == 1) {  // a broadcast view, copied once into the merged shape
    Shape target = src.shape(), merged = src.shape();
    target.insert(target.begin() + ax + 1, repeats[0]);
    merged[ax] *= repeats[0];
    return src.unsqueeze(ax + 1).broadcast_to(target).contiguous().view(merged);
  }
  SL_CHECK(int64_t(repeats.size()) == src.shape()[ax], ValueError, "Repeat: ", repeats.size(),
           " counts for an axis of size ", src.shape()[ax]);
  std::vector<Tensor> pieces;
  for (int64_t i = 0; i < int64_t(repeats.size()); ++i)
    for (int64_t k = 0; k < repeats[i]; ++k) pieces.push_back(src.slice(ax, i, i + 1, 1));
  if (pieces.empty()) {
    Shape shape = src.shape();
    shape[ax] = 0;
    return Tensor::empty(shape, src.dtype(), src.device());
  }
  return sl::concat(pieces, ax);
}

// SINGA's raw-tensor operators +=, -=, *=, /= (its SWIG tensor has them; singa_peft merges LoRA weights with
// `W.data += delta.data`). They write into the left tensor's memory through the element-wise kernels with `out` set
// to it, so the tensor object and every view of its storage see the result, and nothing is allocated unless the
// right side partially overlaps the left (then the kernel's result goes through a temporary, as `binary` does for
// any aliased out). The right side is a raw tensor of the same dtype and device that broadcasts to the left's shape,
// or a real number (bool excluded) that the left's dtype can hold.
struct InPlaceOp {
  const char* name;    // __iadd__ ...
  const char* symbol;  // +=
  BinaryOp op;
};
constexpr InPlaceOp kInPlaceOps[] = {{"__iadd__", "+=", BinaryOp::kAdd},
                                     {"__isub__", "-=", BinaryOp::kSub},
                                     {"__imul__", "*=", BinaryOp::kMul},
                                     {"__itruediv__", "/=", BinaryOp::kDiv}};

bool is_real_number(const py::handle& v) {
  if (PyBool_Check(v.ptr())) return false;
  if (PyFloat_Check(v.ptr()) || PyLong_Check(v.ptr())) return true;
  // numpy scalars and other registered reals (numbers.Real), which define __float__
  return py::isinstance(v, py::module_::import("numbers").attr("Real"));
}

void in_place(const Tensor& a, const py::handle& other, const InPlaceOp& o) {
  check_defined(a, o.symbol, "left tensor");
  // A view whose elements share memory (a broadcast view, stride 0) would receive several results per element.
  for (int i = 0; i < a.ndim(); ++i)
    SL_CHECK(a.strides()[size_t(i)] != 0 || a.shape()[size_t(i)] <= 1, ValueError, "raw tensor ", o.symbol,
             ": the left tensor is a broadcast view (shape ", shape_str(a.shape()), ", strides ",
             shape_str(a.strides()), ") whose elements share memory; write to a copy (Clone()) instead");
  if (py::isinstance<Tensor>(other)) {
    const Tensor& b = other.cast<const Tensor&>();
    check_defined(b, o.symbol, "right tensor");
    SL_CHECK(a.dtype() == b.dtype(), TypeError, "raw tensor ", o.symbol, ": the right side is ",
             dtype_name(b.dtype()), ", the left ", dtype_name(a.dtype()), "; convert it with AsType(",
             "singa_wrap.k...) first");
    SL_CHECK(a.device() == b.device(), ValueError, "raw tensor ", o.symbol, ": the right side is on ",
             b.device().str(), ", the left on ", a.device().str(), "; move it with ToDevice() first");
    bool fits = b.ndim() <= a.ndim();
    for (int i = 1; fits && i <= b.ndim(); ++i) {
      const int64_t bd = b.shape()[size_t(b.ndim() - i)], ad = a.shape()[size_t(a.ndim() - i)];
      fits = bd == ad || bd == 1;
    }
    SL_CHECK(fits, ValueError, "raw tensor ", o.symbol, ": the right side's shape ", shape_str(b.shape()),
             " does not broadcast to the left's ", shape_str(a.shape()), " (the result is written in place, so it "
             "keeps the left's shape)");
    py::gil_scoped_release unlocked;
    binary(o.op, a, b, a);
    return;
  }
  if (is_real_number(other)) {
    const double s = other.cast<double>();
    py::gil_scoped_release unlocked;
    binary_scalar(o.op, a, s, false, a);
    return;
  }
  const bool wrapper = py::hasattr(other, "data") && py::isinstance<Tensor>(other.attr("data"));
  throw TypeError(str("raw tensor ", o.symbol, ": the right side must be a raw tensor (tensor.Tensor.data) or a "
                      "number, got ", std::string(py::str(py::type::of(other).attr("__name__"))),
                      wrapper ? "; pass its .data" : ""));
}

void bind_in_place(py::class_<Tensor>& cls) {
  // float(t) of a one-element raw tensor (numpy's rule for arrays). SINGA's autograd.backward hands the root
  // operator dy as the float 1.0, ours a one-element raw tensor; an operator written for SINGA that reads it with
  // float(dy) (SINGA's examples/model_selection: dx.data *= float(dy)) gets the same number.
  cls.def("__float__", [](const Tensor& t) {
    check_defined(t, "float()", "tensor");
    SL_CHECK(t.numel() == 1, TypeError, "float(raw tensor): only a one-element raw tensor converts to a float, this "
             "one has shape ", shape_str(t.shape()), " (", t.numel(), " elements)");
    py::gil_scoped_release unlocked;  // a GPU tensor is copied to the host
    return host_scalar(t);
  });
  for (const InPlaceOp& o : kInPlaceOps) {
    cls.def(o.name, [o](py::object self, const py::object& other) {
      in_place(self.cast<const Tensor&>(), other, o);
      return self;  // the same object: `t.data += d` leaves t.data the tensor it was
    }, py::arg("other"), str("SINGA's raw tensor ``", o.symbol, "``: in place, with a raw tensor of the same dtype "
                             "and device that broadcasts to this shape, or a number.").c_str());
  }
}

void bind_singa_names(py::module_& m, py::class_<Tensor>& cls) {
  // A tuple subclass defined in Python source: the same type any tuple method and isinstance check accept.
  py::dict ns;
  ns["__builtins__"] = py::module_::import("builtins");
  ns["__name__"] = m.attr("__name__");
  py::exec(R"(
class Shape(tuple):
    """A tensor's shape: a tuple, also callable as SINGA's C++ ``shape()`` (the whole shape) or ``shape(i)``."""
    __slots__ = ()

    def __call__(self, axis=None):
        return self if axis is None else self[axis]
)", ns);
  py::object shape_type = ns["Shape"];
  m.attr("Shape") = shape_type;
  // Filled in place like a tuple (what tuple.__new__ does for a subclass): calling the type from here cost
  // about as much again as the whole plain-tuple property, and `shape` is read on every op.
  auto* shape_tp = reinterpret_cast<PyTypeObject*>(shape_type.release().ptr());  // kept alive by the module
  cls.def_property_readonly("shape", [shape_tp](const Tensor& t) {
        const Shape& s = t.shape();
        py::object out = py::reinterpret_steal<py::object>(shape_tp->tp_alloc(shape_tp, Py_ssize_t(s.size())));
        if (!out) throw py::error_already_set();
        for (size_t i = 0; i < s.size(); ++i) {
          PyObject* d = PyLong_FromLongLong(s[i]);
          if (!d) throw py::error_already_set();
          PyTuple_SET_ITEM(out.ptr(), Py_ssize_t(i), d);
        }
        return out;
      }, "A Shape: a tuple that SINGA's code may also call, t.shape() or t.shape(i).");

  cls.def(py::init([](const Shape& shape, const py::object& device, DType dtype) {
            return Tensor::empty(shape, dtype, device_arg(device));
          }),
          py::arg("shape"), py::arg("device"), py::arg("dtype") = DType::kFloat32,
          "SINGA's argument order, Tensor(shape, device, dtype): uninitialised.");
  cls.def("data_type", &Tensor::dtype)
      .def("nDim", &Tensor::ndim)
      .def("Size", &Tensor::numel)
      .def("MemSize", &Tensor::nbytes)
      .def("initialized", &Tensor::defined)
      .def("Clone", &Tensor::clone, py::call_guard<py::gil_scoped_release>())
      // SINGA's AsType always returns a new tensor, a copy when the dtype is already `dtype`
      .def("AsType", [](const Tensor& t, DType dtype) { return t.dtype() == dtype ? t.clone() : t.cast(dtype); },
           py::arg("dtype"), py::call_guard<py::gil_scoped_release>())
      // The in-place conversions rebind this tensor to new storage; other views of the old storage keep it. The
      // new tensor is made without the GIL and swapped in with it, so no other Python thread sees a half-assigned one.
      .def("ToType", [](py::object self, DType dtype) {
             Tensor& t = self.cast<Tensor&>();
             if (t.dtype() != dtype) t = released([&] { return t.cast(dtype); });
             return self;
           }, py::arg("dtype"))
      .def("ToDevice", [](Tensor& t, const py::object& device) {
             Device d = device_arg(device);
             t = released([&] { return t.to(d); });
           }, py::arg("device"))
      .def("ToHost", [](Tensor& t) { t = released([&] { return t.to(Device::cpu()); }); })
      .def("ResetLike", [](Tensor& t, const Tensor& like) {
             check_defined(like, "ResetLike", "tensor");
             t = released([&] {
               Tensor fresh = Tensor::empty(like.shape(), like.dtype(), like.device());
               sl::fill_(fresh, 0.0);  // zeros, as singa_lite's other fresh tensors (SINGA leaves them uninitialised)
               return fresh;
             });
           }, py::arg("t"))
      .def("CopyData", [](const Tensor& t, const Tensor& src) {
             check_defined(t, "CopyData", "tensor");
             check_defined(src, "CopyData", "source");
             SL_CHECK(t.numel() == src.numel(), ValueError, "CopyData: the source has ", src.numel(),
                      " elements, this tensor ", t.numel(), "; they must be equal");
             SL_CHECK(t.dtype() == src.dtype(), TypeError, "CopyData: the source holds ", dtype_name(src.dtype()),
                      ", this tensor ", dtype_name(t.dtype()), "; convert it with AsType() first");
             if (t.shape() == src.shape()) return sl::copy_(t, src);
             SL_CHECK(t.is_contiguous(), ValueError, "CopyData: a source of another shape (", shape_str(src.shape()),
                      ") needs this tensor contiguous, it is a strided view of shape ", shape_str(t.shape()));
             sl::copy_(t.view({-1}), src.reshape({-1}));  // element by element in row-major order, as SINGA
           }, py::arg("src"), py::call_guard<py::gil_scoped_release>())
      .def("Repeat", &repeat, py::arg("repeats"), py::arg("axis") = py::none(),
           py::call_guard<py::gil_scoped_release>())
      .def("SetFloatValue", [](const Tensor& t, double x) { sl::fill_(t, x); }, py::arg("x"),
           py::call_guard<py::gil_scoped_release>())
      .def("GetFloatValue", [](const Tensor& t, int64_t num) {
             return host_values(t, num, DType::kFloat32, "GetFloatValue");
           }, py::arg("num"))
      .def("GetIntValue", [](const Tensor& t, int64_t num) {
             return host_values(t, num, DType::kInt32, "GetIntValue");
           }, py::arg("num"))
      .def("GetHalfFloatValue", [](const Tensor& t, int64_t num) {
             return host_values(t, num, DType::kFloat16, "GetHalfFloatValue");
           }, py::arg("num"))
      .def("CopyFloatDataFromHostPtr", [](const Tensor& t, const py::object& src, int64_t offset) {
             copy_from_host(t, src, offset, DType::kFloat32, "CopyFloatDataFromHostPtr");
           }, py::arg("src"), py::arg("offset") = 0)
      .def("CopyIntDataFromHostPtr", [](const Tensor& t, const py::object& src, int64_t offset) {
             copy_from_host(t, src, offset, DType::kInt32, "CopyIntDataFromHostPtr");
           }, py::arg("src"), py::arg("offset") = 0)
      .def("CopyHalfFloatDataFromHostPtr", [](const Tensor& t, const py::object& src, int64_t offset) {
             copy_from_host(t, src, offset, DType::kFloat16, "CopyHalfFloatDataFromHostPtr");
           }, py::arg("src"), py::arg("offset") = 0)
      // SINGA's norms are divided by the element count: L1 = sum|x| / n, L2 = sqrt(sum x^2) / n
      .def("L1", [](const Tensor& t) {
             check_defined(t, "L1", "tensor");
             if (t.numel() == 0) return 0.0;
             Tensor s = sl::reduce(ReduceOp::kSum, sl::unary(UnaryOp::kAbs, t.cast(DType::kFloat64)), std::nullopt, false);
             return host_scalar(s) / double(t.numel());
           }, py::call_guard<py::gil_scoped_release>())
      .def("L2", [](const Tensor& t) {
             check_defined(t, "L2", "tensor");
             if (t.numel() == 0) return 0.0;
             Tensor s = sl::reduce(ReduceOp::kSum, sl::unary(UnaryOp::kSquare, t.cast(DType::kFloat64)), std::nullopt,
                                    false);
             return std::sqrt(host_scalar(s)) / double(t.numel());
           }, py::call_guard<py::gil_scoped_release>());
}

}  // namespace

void bind_tensor(py::module_& m) {
  py::enum_<DType>(m, "DType")
      .value("float16", DType::kFloat16)
      .value("float32", DType::kFloat32)
      .value("float64", DType::kFloat64)
      .value("int32", DType::kInt32)
      .value("int64", DType::kInt64)
      .value("bool", DType::kBool)
      .value("bfloat16", DType::kBFloat16)
      .def_property_readonly("itemsize", [](DType t) { return itemsize(t); })
      .def_property_readonly("is_floating", [](DType t) { return is_floating(t); });

  py::class_<Tensor> tensor_class(m, "Tensor", py::buffer_protocol(),
                     "A strided view of device memory. Views share storage; copies are explicit.");
  tensor_class.def(py::init([](const Shape& shape, DType dtype, const Device& device) {
             return Tensor::empty(shape, dtype, device);
           }),
           py::arg("shape"), py::arg("dtype") = DType::kFloat32, py::arg("device") = Device::cpu(),
           "An uninitialised tensor.")
      .def_static("from_buffer", &from_buffer, py::arg("obj"), "Shares a writable buffer-protocol object's memory (no copy); copies a read-only one.")
      .def_static("from_dlpack", &from_dlpack, py::arg("obj"), "Shares a DLPack producer's memory (no copy).")
      .def_buffer(&to_buffer)
      .def("__dlpack__", &dlpack_export)
      .def("__dlpack_device__", [](const Tensor& t) {
        return py::make_tuple(t.device().is_cpu() ? int(dlpack::kDLCPU) : int(dlpack::kDLCUDA), t.device().index);
      })
      .def_property_readonly("strides", [](const Tensor& t) { return tuple_of(t.strides()); }, "In elements.")
      .def_property_readonly("offset", &Tensor::offset, "In elements from the start of the storage.")
      .def_property_readonly("dtype", &Tensor::dtype)
      .def_property_readonly("device", &Tensor::device)
      .def_property_readonly("ndim", &Tensor::ndim)
      .def_property_readonly("numel", &Tensor::numel)
      .def_property_readonly("itemsize", &Tensor::itemsize)
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def_property_readonly("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); })
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("shares_storage", &Tensor::shares_storage)
      .def("view", &Tensor::view, py::arg("shape"))
      .def("reshape", &Tensor::reshape, py::arg("shape"))
      .def("transpose", &Tensor::transpose, py::arg("axes") = std::vector<int64_t>{})
      .def("slice", &Tensor::slice, py::arg("axis"), py::arg("start"), py::arg("stop"), py::arg("step") = 1)
      .def("select", &Tensor::select, py::arg("axis"), py::arg("index"))
      .def("broadcast_to", &Tensor::broadcast_to, py::arg("shape"))
      .def("unsqueeze", &Tensor::unsqueeze, py::arg("axis"))
      .def("squeeze", &Tensor::squeeze, py::arg("axes") = std::vector<int64_t>{})
      .def("contiguous", &Tensor::contiguous, py::call_guard<py::gil_scoped_release>())
      .def("clone", &Tensor::clone, py::call_guard<py::gil_scoped_release>())
      .def("to", &Tensor::to, py::arg("device"), py::call_guard<py::gil_scoped_release>())
      .def("cast", &Tensor::cast, py::arg("dtype"), py::call_guard<py::gil_scoped_release>())
      .def("__repr__", [](const Tensor& t) {
        return str("_core.Tensor(shape=", shape_str(t.shape()), ", dtype=", dtype_name(t.dtype()), ", device=",
                   t.device().str(), ")");
      });
  bind_singa_names(m, tensor_class);
  bind_in_place(tensor_class);
}

}  // namespace sl::bindings
