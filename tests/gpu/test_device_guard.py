"""What singa_lite leaves current on the calling thread (csrc/cuda/context.cpp, DeviceGuard): exactly what the thread
had before. A thread with no CUDA context must still have none after running ops, on any GPU: not a context of the
GPU the ops ran on (other code in the thread meaning "the current GPU" would land there), and no new context on
GPU 0 (about 0.5 GiB each). Read through the driver (libcuda's cuCtxGetCurrent), as every CUDA library sees it.
Marked `gpu`."""
import ctypes
import threading

import numpy as np
import pytest

from singa_lite import _core, device

pytestmark = pytest.mark.gpu

CPU = _core.Device("cpu")


def current_context():
    lib = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    assert lib.cuCtxGetCurrent(ctypes.byref(ctx)) == 0
    return ctx.value


def in_fresh_thread(fn):
    """fn() on a new thread (no CUDA context yet); its result or its exception."""
    box = {}

    def run():
        try:
            box["before"] = current_context()
            box["result"] = fn()
            box["after"] = current_context()
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = e
    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box


def ops_on(index):
    gpu = _core.Device(f"cuda:{index}")
    x = _core.Tensor.from_buffer(np.arange(64, dtype=np.float32).reshape(8, 8)).to(gpu)
    y = _core.matmul(_core.add_scalar(x, 1.0), x)
    _core.cuda_sync(index)
    return np.asarray(y.to(CPU))


def test_a_thread_without_a_context_keeps_none():
    box = in_fresh_thread(lambda: ops_on(0))
    x = np.arange(64, dtype=np.float64).reshape(8, 8)
    np.testing.assert_allclose(box["result"], (x + 1) @ x, rtol=1e-5)
    assert box["before"] is None and box["after"] is None, box


def test_a_threads_own_context_is_restored():
    def work():
        lib = ctypes.CDLL("libcuda.so.1")
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        assert lib.cuDeviceGet(ctypes.byref(dev), 0) == 0
        assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
        assert lib.cuCtxSetCurrent(ctx) == 0
        try:
            ops_on(device.get_num_gpus() - 1)
            return ctx.value, current_context()
        finally:
            lib.cuCtxSetCurrent(None)
            lib.cuDevicePrimaryCtxRelease_v2(dev)
    box = in_fresh_thread(work)
    mine, after = box["result"]
    assert after == mine


def test_ops_on_another_gpu_leave_no_context_behind():
    if device.get_num_gpus() < 2:
        pytest.skip("needs two GPUs (one GPU: test_a_thread_without_a_context_keeps_none covers it)")
    box = in_fresh_thread(lambda: ops_on(1))
    assert box["before"] is None and box["after"] is None, box
