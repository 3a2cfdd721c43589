"""cuDNN's algorithm choice on a GPU (csrc/cuda/conv_plan.h): asked once per shape and geometry, then cached (a
ResNet step's ~60 convolutions used to ask cuDNN's heuristic every time, ~1 ms of host time each); and when the
chosen algorithm's workspace does not fit in GPU memory, the next candidate runs instead of a MemoryError. Marked
`gpu`; skipped with the reason where cuDNN cannot be loaded. The cache and the walk alone are tested on the CPU in
tests/unit/test_conv_plan.py."""
import functools

import numpy as np
import pytest

from singa_lite import _core

pytestmark = pytest.mark.gpu

CPU = _core.Device("cpu")
DT = _core.DType


@pytest.fixture(scope="module")
def gpu():
    if not _core.cudnn_available():
        pytest.skip(f"cuDNN not usable: {_core.cudnn_unavailable_reason()}")
    return _core.Device("cuda:0")


@pytest.fixture
def no_limit():
    yield
    _core.cuda_set_memory_limit(0, None)


def on(device, a):
    t = _core.Tensor.from_buffer(np.ascontiguousarray(a))
    return t if device.is_cpu() else t.to(device)


def conv_step(x, w, dy):
    """Forward and both backward directions of a 3x3 convolution, padding 1, through cuDNN."""
    geometry = ((1, 1), (1, 1), (1, 1), 1)
    return (_core.cudnn_conv2d_forward(x, w, *geometry),
            _core.cudnn_conv2d_backward_data(w, dy, tuple(x.shape), *geometry),
            _core.cudnn_conv2d_backward_filter(x, dy, tuple(w.shape), *geometry))


def reference_forward(x, w):
    """The convolution in float64 on the host: padding 1, stride 1, 3x3."""
    from numpy.lib.stride_tricks import sliding_window_view
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    return np.einsum("nchwij,ocij->nohw", sliding_window_view(xp, (3, 3), axis=(2, 3)), w.astype(np.float64))


def test_a_repeated_convolution_skips_the_heuristic(gpu, rng):
    x = rng.standard_normal((4, 16, 24, 24)).astype(np.float32)
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    gx, gw, gdy = on(gpu, x), on(gpu, w), on(gpu, rng.standard_normal((4, 32, 24, 24)).astype(np.float32))
    first = _core.cudnn_conv_plan_stats()
    conv_step(gx, gw, gdy)
    second = _core.cudnn_conv_plan_stats()
    assert second["misses"] - first["misses"] <= 3  # forward, backward data, backward filter: asked at most once
    for _ in range(20):
        y, _, _ = conv_step(gx, gw, gdy)
    third = _core.cudnn_conv_plan_stats()
    assert third["misses"] == second["misses"]
    assert third["hits"] - second["hits"] == 60
    want = reference_forward(x, w)
    np.testing.assert_allclose(np.asarray(y.to(CPU)), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    # another batch size is another plan
    conv_step(on(gpu, x[:3]), gw, on(gpu, np.zeros((3, 32, 24, 24), np.float32)))
    assert _core.cudnn_conv_plan_stats()["misses"] - third["misses"] == 3


def size_class(n):
    """The caching allocator's rounding (csrc/cuda/allocator.cpp), to set a limit that fits exactly."""
    n = max(n, 1)
    if n < (1 << 20):
        return (n + 511) // 512 * 512
    step = (1 << (n.bit_length() - 1)) // 4
    return (n + step - 1) // step * step


GEOMETRIES = [  # (x shape, w shape, dtype): common ResNet shapes, float32 and float16
    ((8, 64, 56, 56), (64, 64, 3, 3), np.float32),
    ((8, 128, 28, 28), (128, 128, 3, 3), np.float32),
    ((16, 3, 64, 64), (64, 3, 7, 7), np.float32),
    ((8, 256, 14, 14), (256, 256, 3, 3), np.float16),
]


def one_direction(direction, x, w, dy):
    geometry = ((1, 1), (1, 1), (1, 1), 1)
    if direction == "forward":
        return _core.cudnn_conv2d_forward(x, w, *geometry)
    if direction == "backward_data":
        return _core.cudnn_conv2d_backward_data(w, dy, tuple(x.shape), *geometry)
    return _core.cudnn_conv2d_backward_filter(x, dy, tuple(w.shape), *geometry)


def test_a_workspace_that_does_not_fit_falls_back(gpu, no_limit, rng):
    """Under a memory limit that leaves room for the output and the smallest workspace only, every direction of
    every geometry still runs, on a later candidate where the first needs more, and matches the CPU. At least one
    of them must actually have skipped its first choice, or nothing was tested."""
    fell_back = 0
    for xs, ws, dtype in GEOMETRIES:
        x = rng.uniform(-1, 1, xs).astype(dtype)
        w = rng.uniform(-1, 1, ws).astype(dtype)
        gx, gw = on(gpu, x), on(gpu, w)
        ys = (xs[0], ws[0], xs[2] + 2 - ws[2] + 1, xs[3] + 2 - ws[3] + 1)
        dy = on(gpu, rng.uniform(-1, 1, ys).astype(dtype))
        dt = DT.float16 if dtype == np.float16 else DT.float32
        for direction, out_shape in (("forward", ys), ("backward_data", xs), ("backward_filter", ws)):
            run = functools.partial(one_direction, direction, gx, gw, dy)
            plans = _core.cudnn_conv2d_plans(direction, xs, ws, (1, 1), (1, 1), (1, 1), 1, dt, gpu)
            assert plans, direction
            want = np.asarray(run().to(CPU)).astype(np.float64)  # no limit: the first choice
            smallest = min(b for _, b in plans)
            out_bytes = size_class(int(np.prod(out_shape)) * np.dtype(dtype).itemsize)
            _core.cuda_set_memory_limit(0, _core.cuda_memory_stats(0)["in_use"] + out_bytes + size_class(smallest))
            try:
                got = np.asarray(run().to(CPU)).astype(np.float64)
            finally:
                _core.cuda_set_memory_limit(0, None)
            tol = 2e-2 if dtype == np.float16 else 1e-4
            scale = np.abs(want).max()
            assert np.abs(got - want).max() <= tol * scale, (direction, xs, plans)
            fell_back += size_class(plans[0][1]) > size_class(smallest)
            # below the smallest workspace nothing can run: a MemoryError naming what was tried
            if smallest > 0:
                _core.cuda_set_memory_limit(0, _core.cuda_memory_stats(0)["in_use"] + out_bytes)
                try:
                    with pytest.raises(MemoryError, match=r"none of the \d+ cuDNN algorithms"):
                        run()
                finally:
                    _core.cuda_set_memory_limit(0, None)
    assert fell_back > 0, "every first choice needed the least workspace: no fallback was exercised"
