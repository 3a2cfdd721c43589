"""GPU facts the C++ core does not expose (free / total memory, device properties), read from the CUDA driver.

``device.get_gpu_mem_size`` and ``device.device_query`` need ``cudaMemGetInfo`` / ``cudaGetDeviceProperties``;
``_core`` links the CUDA runtime statically and binds neither, so this module asks the driver library
(``libcuda.so.1``, which any usable GPU has and which the runtime itself loads) through ctypes. Memory is read
inside the device's *primary* context, the one the CUDA runtime (and so singa_lite's allocator) uses, so the
free bytes count our own allocations. Callers check first that a GPU is usable (device._require_gpu).
"""
from __future__ import annotations

import ctypes

from .._core import CudaError

_driver = None

# CUdevice_attribute values (cuda.h), with the labels device_query prints.
_BASIC = (("Total shared memory per block", 8), ("Maximum threads per block", 1))
_BLOCK_DIMS, _GRID_DIMS = (2, 3, 4), (5, 6, 7)
_OVERLAP = 15
_VERBOSE = (("Major revision number", 75), ("Minor revision number", 76), ("Total registers per block", 12),
            ("Maximum memory pitch", 11), ("Warp size", 10), ("Clock rate (kHz)", 13),
            ("Number of multiprocessors", 16))
_TIMEOUT = 17


def _lib():
    global _driver
    if _driver is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise CudaError(f"the CUDA driver library libcuda.so.1 cannot be loaded ({e}); install the NVIDIA "
                            f"driver") from None
        _call(lib, "cuInit", 0)
        _driver = lib
    return _driver


def _call(lib, name: str, *args) -> None:
    status = getattr(lib, name)(*args)
    if status != 0:
        text = ctypes.c_char_p()
        lib.cuGetErrorString(status, ctypes.byref(text))
        raise CudaError(f"{name} failed: CUDA driver error {status} ({(text.value or b'?').decode()})")


def _device(index: int):
    lib = _lib()
    dev = ctypes.c_int()
    _call(lib, "cuDeviceGet", ctypes.byref(dev), int(index))
    return lib, dev


def mem_info(index: int) -> tuple[int, int]:
    """(free, total) bytes of GPU ``index``, as cudaMemGetInfo reports them in the runtime's context."""
    lib, dev = _device(index)
    ctx = ctypes.c_void_p()
    _call(lib, "cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    try:
        _call(lib, "cuCtxPushCurrent_v2", ctx)
        try:
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            _call(lib, "cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        finally:
            _call(lib, "cuCtxPopCurrent_v2", ctypes.byref(ctypes.c_void_p()))
    finally:
        _call(lib, "cuDevicePrimaryCtxRelease_v2", dev)
    return free.value, total.value


def _attribute(lib, dev, attr: int):
    """An attribute's value, or None where this driver no longer reports it (e.g. clock rate in CUDA 13)."""
    value = ctypes.c_int()
    return value.value if lib.cuDeviceGetAttribute(ctypes.byref(value), attr, dev) == 0 else None


def properties(index: int, verbose: bool) -> list[tuple[str, object]]:
    """(label, value) pairs describing GPU ``index``: the basics always, more with ``verbose``."""
    lib, dev = _device(index)
    total = ctypes.c_size_t()
    _call(lib, "cuDeviceTotalMem_v2", ctypes.byref(total), dev)
    rows = [("Device id", index), ("Total global memory", total.value)]
    rows += [(label, _attribute(lib, dev, attr)) for label, attr in _BASIC]
    rows.append(("Maximum dimension of block", ", ".join(str(_attribute(lib, dev, a)) for a in _BLOCK_DIMS)))
    rows.append(("Maximum dimension of grid", ", ".join(str(_attribute(lib, dev, a)) for a in _GRID_DIMS)))
    rows.append(("Concurrent copy and execution", "Yes" if _attribute(lib, dev, _OVERLAP) else "No"))
    if verbose:
        name = ctypes.create_string_buffer(256)
        _call(lib, "cuDeviceGetName", name, len(name), dev)
        rows.append(("Name", name.value.decode(errors="replace")))
        rows += [(label, _attribute(lib, dev, attr)) for label, attr in _VERBOSE]
        rows.append(("Kernel execution timeout", "Yes" if _attribute(lib, dev, _TIMEOUT) else "No"))
    return [(label, value) for label, value in rows if value is not None]
