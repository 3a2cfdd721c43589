"""float32 CPU convolutions on oneDNN (csrc/cpu/onednn.h, singa_lite/_runtime/onednn.py): the same results as
the im2col + GEMM path within float32 tolerance, in every pass, for the geometries convolutions take (odd sizes,
strides, padding, dilation, groups, 1x1, with and without bias); repeatable per thread count; fallbacks and errors.

Needs the onednn-cpu-gomp wheel (a dependency on x86-64 Linux); skipped elsewhere. Where the wheel is installed,
oneDNN must load: a broken loader fails test_loaded_where_the_wheel_is instead of skipping everything."""
import os
import platform
import subprocess
import sys
from importlib import metadata

import numpy as np
import pytest

from singa_lite import _core, autograd, tensor
from singa_lite._runtime import onednn
from singa_lite.ops.nn import _Conv2d


def wheel_installed() -> bool:
    try:
        metadata.distribution("onednn-cpu-gomp")
        return True
    except metadata.PackageNotFoundError:
        return False


needs_onednn = pytest.mark.skipif(not onednn.ready(), reason=f"oneDNN not usable: {onednn.status()}")


@pytest.fixture
def onednn_switch():
    """Restores oneDNN's switch after a test that turns it off."""
    yield
    _core.set_onednn_enabled(True)


def test_loaded_where_the_wheel_is():
    if not wheel_installed():
        assert platform.machine() != "x86_64" or sys.platform != "linux" or os.environ.get(onednn.LIB_VAR), \
            "onednn-cpu-gomp is a dependency on x86-64 Linux but is not installed"
        pytest.skip("onednn-cpu-gomp is not installed (not x86-64 Linux)")
    if os.environ.get(onednn.SWITCH_VAR) == "0":
        pytest.skip(f"{onednn.SWITCH_VAR}=0 switches oneDNN off")
    assert onednn.ready(), onednn.status()
    assert _core.onednn_version().startswith("3.")
    assert "oneDNN 3." in onednn.status()


# (id, x shape, W shape, bias, stride, padding, dilation, groups)
CASES = [
    ("resnet_3x3", (2, 16, 8, 8), (32, 16, 3, 3), False, 1, 1, 1, 1),
    ("resnet_3x3_s2", (2, 16, 9, 9), (32, 16, 3, 3), False, 2, 1, 1, 1),
    ("pointwise_s2", (3, 8, 7, 6), (16, 8, 1, 1), False, 2, 0, 1, 1),
    ("pointwise_bias", (2, 5, 5, 3), (7, 5, 1, 1), True, 1, 0, 1, 1),
    ("odd_rect", (2, 3, 11, 7), (5, 3, 2, 3), True, (2, 1), (1, 2), 1, 1),
    ("dilated", (1, 4, 10, 9), (6, 4, 3, 3), True, 1, 2, 2, 1),
    ("groups", (2, 6, 7, 7), (9, 2, 3, 3), True, 1, 1, 1, 3),
    ("depthwise_s2", (2, 8, 9, 8), (8, 1, 3, 3), False, 2, 1, 1, 8),
    ("stem_1ch", (3, 1, 12, 12), (4, 1, 5, 5), True, 1, 0, 1, 1),
    ("big_stride_pad", (2, 3, 8, 5), (2, 3, 3, 3), False, 3, 1, 1, 1),
]


def run_conv(x, W, b, stride, padding, dilation, groups, dy):
    """(y, dx, dW[, db]) of one float32 convolution, and whether it ran on oneDNN."""
    op = _Conv2d(stride, padding, dilation, groups)
    ins = [tensor.from_numpy(a).data for a in ((x, W) if b is None else (x, W, b))]
    y = op.forward(*ins)
    grads = op.backward(tensor.from_numpy(dy).data)
    return [tensor.to_numpy(tensor.Tensor(data=t)) for t in (y, *grads)], op.onednn


@needs_onednn
@pytest.mark.parametrize("name,xs,ws,bias,stride,padding,dilation,groups", CASES, ids=[c[0] for c in CASES])
def test_matches_im2col(name, xs, ws, bias, stride, padding, dilation, groups, onednn_switch):
    rng = np.random.default_rng(len(name) * 7919 + sum(xs))
    x, W = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32) if bias else None
    geometry = (stride, padding, dilation, groups)
    y_shape = tuple(autograd.conv2d(tensor.from_numpy(x), tensor.from_numpy(W), None, *geometry).shape)
    dy = rng.standard_normal(y_shape).astype(np.float32)
    ours, used = run_conv(x, W, b, *geometry, dy)
    assert used
    _core.set_onednn_enabled(False)
    ref, used_ref = run_conv(x, W, b, *geometry, dy)
    assert not used_ref
    assert len(ours) == len(ref) == (4 if bias else 3)
    for what, a, r in zip(("y", "dx", "dW", "db"), ours, ref):
        assert a.shape == r.shape and a.dtype == np.float32, what
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-4 * float(np.abs(r).max()), err_msg=what)


@needs_onednn
def test_each_thread_count_repeats_its_bits(restore_threads):
    """Same inputs, same thread count: the same bits (primitives are cached per thread count). Between thread
    counts oneDNN's weight gradient may differ in the last bits (it splits the batch sum over threads); the im2col
    path (SINGA_LITE_ONEDNN=0) keeps those bits too."""
    rng = np.random.default_rng(5)
    x, W = rng.standard_normal((4, 32, 10, 10)).astype(np.float32), rng.standard_normal((48, 32, 3, 3)).astype(
        np.float32)
    dy = rng.standard_normal((4, 48, 5, 5)).astype(np.float32)
    results = {}
    for n in (1, 2, 1, 2):
        _core.set_num_threads(n)
        out, used = run_conv(x, W, None, 2, 1, 1, 1, dy)
        assert used
        if n in results:
            for a, r in zip(out, results[n]):
                np.testing.assert_array_equal(a, r)
        results[n] = out
    for a, r in zip(results[1], results[2]):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5 * float(np.abs(r).max()))


@needs_onednn
def test_primitives_are_cached_per_shape():
    rng = np.random.default_rng(3)
    x, W = rng.standard_normal((2, 3, 6, 6)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    y = autograd.conv2d(tensor.from_numpy(x), tensor.from_numpy(W), None, 1, 1)
    before = _core.onednn_cached_primitives()
    for _ in range(3):
        assert autograd.conv2d(tensor.from_numpy(x), tensor.from_numpy(W), None, 1, 1).shape == y.shape
    assert _core.onednn_cached_primitives() == before


@needs_onednn
def test_layers_share_one_workspace_for_their_blocked_copies():
    # Each plan used to keep blocked buffers of its own: a model's sum over shapes and passes (~170 MB for
    # ResNet-18). Calls are serialized, so one workspace sized by the largest call serves them all.
    rng = np.random.default_rng(5)

    def train_conv(c, size):
        x, W = rng.standard_normal((4, c, size, size)), rng.standard_normal((c, c, 3, 3))
        dy = rng.standard_normal((4, c, size, size))
        _, on_onednn = run_conv(*(a.astype(np.float32) for a in (x, W)), None, 1, 1, 1, 1, dy.astype(np.float32))
        assert on_onednn

    train_conv(32, 40)
    largest = _core.onednn_workspace_bytes()
    # One blocked copy of the largest x alone takes at least this much.
    assert largest >= 4 * 32 * 40 * 40 * 4
    for size in (8, 12, 16, 20, 24, 28, 32, 36):  # 8 more shapes x 3 passes, each smaller than the first
        train_conv(32, size)
    assert _core.onednn_workspace_bytes() == largest


@needs_onednn
def test_other_dtypes_and_switched_off_use_im2col(onednn_switch):
    rng = np.random.default_rng(4)
    x, W = rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((4, 3, 3, 3))
    op = _Conv2d(1, 1)
    op.forward(tensor.from_numpy(x).data, tensor.from_numpy(W).data)  # float64
    assert not op.onednn
    _core.set_onednn_enabled(False)
    assert not _core.onednn_available() and "switched off" in _core.onednn_unavailable_reason()
    op = _Conv2d(1, 1)
    op.forward(tensor.from_numpy(x.astype(np.float32)).data, tensor.from_numpy(W.astype(np.float32)).data)
    assert not op.onednn


@needs_onednn
def test_errors():
    f32 = tensor.from_numpy(np.zeros((1, 2, 4, 4), np.float32)).data
    w32 = tensor.from_numpy(np.zeros((3, 2, 3, 3), np.float32)).data
    f64 = tensor.from_numpy(np.zeros((1, 2, 4, 4))).data
    with pytest.raises(TypeError, match="float32 CPU tensor"):
        _core.onednn_conv2d_forward(f64, w32, None, [1, 1], [1, 1], [1, 1], 1)
    with pytest.raises(ValueError, match="dy has shape"):
        _core.onednn_conv2d_backward_data(w32, f32, [1, 2, 4, 4], [1, 1], [1, 1], [1, 1], 1)
    with pytest.raises(ValueError, match="already loaded"):
        _core.onednn_load("/nonexistent/libdnnl.so.3")


def test_unloadable_library_is_reported():
    """A path that is no oneDNN: the process keeps im2col + GEMM and says why (a fresh process: one load each)."""
    code = ("from singa_lite._runtime import onednn; from singa_lite import _core; "
            "print(onednn.ready()); print(onednn.status())")
    env = {k: v for k, v in os.environ.items() if k != onednn.SWITCH_VAR}
    env[onednn.LIB_VAR] = "/nonexistent/libdnnl.so.3"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    ready, status = p.stdout.splitlines()[:2]
    assert ready == "False" and "cannot open /nonexistent/libdnnl.so.3" in status


@needs_onednn
def test_forked_child_after_threads_falls_back():
    """libgomp's pool does not survive fork: a child forked after the parent ran threaded work stays off oneDNN
    (and off its threads) and still convolves."""
    code = """
import os, numpy as np
from singa_lite import _core, autograd, tensor
from singa_lite._runtime import onednn
from singa_lite.ops.nn import _Conv2d
_core.set_num_threads(2)
x = tensor.from_numpy(np.ones((4, 16, 16, 16), np.float32)).data
w = tensor.from_numpy(np.ones((32, 16, 3, 3), np.float32)).data
op = _Conv2d(1, 1); y = op.forward(x, w); assert op.onednn
pid = os.fork()
if pid == 0:
    op = _Conv2d(1, 1); y2 = op.forward(x, w)
    ok = (not op.onednn and "forked" in _core.onednn_unavailable_reason()
          and np.array_equal(tensor.to_numpy(tensor.Tensor(data=y2)), tensor.to_numpy(tensor.Tensor(data=y))))
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "0"


def test_build_info_reports_onednn():
    import singa_lite

    info = singa_lite.build_info()["onednn"]
    assert info["used"] == onednn.ready() and info["status"] == onednn.status()
    assert (info["version"] is not None) == bool(_core.onednn_version())


@pytest.mark.slow
@needs_onednn
def test_cache_stays_bounded_over_a_shape_sweep():
    """A primitive per shape, but not without end: past 512 the cache starts again (cpu/onednn.cpp)."""
    w = tensor.from_numpy(np.ones((1, 1, 1, 1), np.float32)).data
    for n in range(1, 530):
        x = tensor.from_numpy(np.full((n, 1, 2, 2), 2.0, np.float32)).data
        y = _core.onednn_conv2d_forward(x, w, None, [1, 1], [0, 0], [1, 1], 1)
        assert tuple(y.shape) == (n, 1, 2, 2)
        assert 1 <= _core.onednn_cached_primitives() <= 512
    assert np.array_equal(tensor.to_numpy(tensor.Tensor(data=y)), np.full((529, 1, 2, 2), 2.0, np.float32))
