"""cuDNN where there is no GPU: the build imports, says why cuDNN is not used, honours SINGA_LITE_CUDNN=0, and the
autograd operators of CPU tensors keep their own path whatever the switch says (the GPU cases are in
tests/gpu/test_cudnn.py)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import singa_lite
from singa_lite import _core, autograd, device
from singa_lite.ops.nn import _AvgPool2d, _BatchNorm2d, _Conv2d, _MaxPool2d

no_gpu = pytest.mark.skipif(device.cuda_is_available(), reason="checks the machine-without-GPU behaviour")


def python(code, **env):
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          check=True).stdout


@no_gpu
def test_cudnn_unavailable_with_a_reason():
    assert _core.cudnn_available() is False
    reason = _core.cudnn_unavailable_reason()
    if _core.cuda_compiled():
        assert "no GPU" in reason
    else:
        assert "CPU-only build" in reason
    info = singa_lite.build_info()["cudnn"]
    assert info["compiled"] == _core.cuda_compiled() and info["used"] is False and info["reason"] == reason
    assert info["status"].startswith(("loaded ", "not found", "unusable", "not built"))
    assert (info["version"] is None) == (not info["status"].startswith("loaded "))


@no_gpu
def test_main_reports_cudnn():
    out = subprocess.run([sys.executable, "-m", "singa_lite"], capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("cuDNN:"))
    assert "not used:" in line and "im2col + GEMM" in line


def test_env_switch_is_read():
    code = "from singa_lite import _core; print(_core.cudnn_enabled(), _core.cudnn_available())"
    assert python(code, SINGA_LITE_CUDNN="0").split() == ["False", "False"]
    if _core.cuda_compiled():
        assert python(code, SINGA_LITE_CUDNN="1").split()[0] == "True"
        assert "switched off" in python("from singa_lite import _core; print(_core.cudnn_unavailable_reason())",
                                        SINGA_LITE_CUDNN="0")


@pytest.mark.skipif(not _core.cuda_compiled(), reason="the cuDNN loader exists in CUDA builds only")
@no_gpu
def test_cudnn_call_errors_are_cuda_errors():
    # Without cuDNN: CudaError saying what to install; with the wheel installed (it loads without a GPU): cuDNN's
    # own BAD_PARAM for the invalid descriptor, naming the call and file:line.
    with pytest.raises(_core.CudaError, match=r"cuDNN (not found|unusable).*nvidia-cudnn|"
                                              r"cudnnSetTensor4dDescriptorEx failed: CUDNN_STATUS_BAD_PARAM"):
        _core._cudnn_provoke_error()


@pytest.mark.skipif(not _core.cuda_compiled(), reason="the staging switch exists in CUDA builds only")
def test_copy_staging_switch():
    assert _core.cuda_copy_staging() is True
    _core.cuda_set_copy_staging(False)
    try:
        assert _core.cuda_copy_staging() is False
    finally:
        _core.cuda_set_copy_staging(True)


def _cpu(a):
    return _core.Tensor.from_buffer(np.ascontiguousarray(a))


def _run_ops(x, w):
    out = []
    for op, args in ((_Conv2d(1, 1), (x, w)), (_MaxPool2d(2), (x,)), (_AvgPool2d(3, 1, 1), (x,)),
                     (_BatchNorm2d(_cpu(np.zeros(3, np.float32)), _cpu(np.ones(3, np.float32))),
                      (x, np.ones(3, np.float32), np.zeros(3, np.float32)))):
        y = op.forward(*[_cpu(a) for a in args])
        assert op.cudnn is False
        op.needs_grad = (True,) * len(args)
        g = op.backward(_core.mul_scalar(y, 0.5))
        out += [np.asarray(y)] + [np.asarray(t) for t in (g if isinstance(g, tuple) else (g,))]
    return out


def test_cpu_tensors_keep_their_path():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    saved, saved_training = _core.cudnn_enabled(), autograd.training
    autograd.training = True
    try:
        results = []
        for enabled in (True, False):
            _core.set_cudnn_enabled(enabled)
            results.append(_run_ops(x, w))
    finally:
        _core.set_cudnn_enabled(saved)
        autograd.training = saved_training
    for a, b in zip(*results):  # bit-identical whatever the switch says
        np.testing.assert_array_equal(a, b)
    ref = (x[1, :, 2:5, 1:4] * w[3]).sum()  # the definition of the convolution, for one output
    np.testing.assert_allclose(results[0][0][1, 3, 3, 2], ref, rtol=1e-5)
