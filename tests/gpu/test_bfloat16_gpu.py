"""bfloat16 on the GPU: the CUDA kernels (float32 compute, one rounding per result, as the CPU) against the
CPU's bfloat16 results, matmul through cuBLAS (CUDA_R_16BF), random fills, and NCCL carrying bfloat16.
Marked `gpu`: skipped without a usable GPU (NCCL parts also without NCCL)."""
import numpy as np
import pytest

from singa_lite import _core, device, dist, tensor
from singa_lite.comm import nccl

pytestmark = pytest.mark.gpu

BF16 = tensor.bfloat16
CPU = _core.Device("cpu")


@pytest.fixture(scope="module")
def gpu():
    return device.create_cuda_gpu_on(0)


def bf(x) -> _core.Tensor:
    return _core.Tensor.from_buffer(np.ascontiguousarray(x, np.float64)).cast(BF16)


def vals(t: _core.Tensor) -> np.ndarray:
    t = t if t.device.is_cpu() else t.to(CPU)
    return np.asarray(t.cast(tensor.float32)).astype(np.float64)


def close(got, want, msg=""):
    # the same float32 value rounded once on both sides; libm and summation order may move it one step
    np.testing.assert_allclose(got, want, rtol=2.0 ** -7, atol=1e-30, err_msg=msg)


def test_elementwise_reductions_and_casts_match_the_cpu(gpu, rng):
    a, b = bf(rng.uniform(-4, 4, (33, 17))), bf(rng.uniform(0.5, 4, (33, 17)))
    ga, gb = a.to(gpu.core), b.to(gpu.core)
    for op in ("add", "sub", "mul", "div", "maximum", "minimum"):
        r = getattr(_core, op)(ga, gb)
        assert r.dtype == BF16 and r.device == gpu.core
        close(vals(r), vals(getattr(_core, op)(a, b)), op)
    for op in ("relu", "abs", "neg", "square", "exp", "tanh", "sigmoid"):
        close(vals(getattr(_core, op)(ga)), vals(getattr(_core, op)(a)), op)
    np.testing.assert_array_equal(vals(_core.max(ga, [1], False)), vals(_core.max(a, [1], False)))
    close(vals(_core.sum(ga, [0], False)), vals(_core.sum(a, [0], False)), "sum")
    close(vals(_core.add_scalar(ga, 0.1)), vals(_core.add_scalar(a, 0.1)), "add_scalar")
    x = rng.standard_normal(1000) * 1e3
    np.testing.assert_array_equal(vals(_core.Tensor.from_buffer(x).to(gpu.core).cast(BF16)), vals(bf(x)))
    np.testing.assert_array_equal(vals(bf(x).to(gpu.core).cast(tensor.float16)), vals(bf(x).cast(tensor.float16)))


def test_matmul_through_cublas(gpu, rng):
    a, b = bf(rng.standard_normal((2, 40, 70))), bf(rng.standard_normal((2, 70, 30)))
    got = _core.matmul(a.to(gpu.core), b.to(gpu.core))
    assert got.dtype == BF16 and tuple(got.shape) == (2, 40, 30)
    exact = vals(a) @ vals(b)
    # float32 accumulation, one rounding: within a bfloat16 step of the exact product's magnitude
    assert (np.abs(vals(got) - exact) <= 2.0 ** -7 * (np.abs(vals(a)) @ np.abs(vals(b)))).all()


def test_random_fills_in_bfloat16(gpu):
    t = tensor.Tensor((4096,), device=gpu, dtype=BF16).uniform(-1.0, 1.0)
    v = vals(t.data)
    assert v.min() >= -1.0 and v.max() < 1.0 and abs(v.mean()) < 0.1


def test_nccl_carries_bfloat16(gpu, rng):
    problem = nccl.readiness()
    if problem:
        pytest.skip(problem)
    comm = dist.init(backend="nccl", holder=dist.NcclIdHolder(), rank=0, world_size=1, timeout=60)
    try:
        a = vals(bf(rng.standard_normal((6, 5))))
        for op in ("sum", "avg", "max"):
            t = tensor.Tensor(data=a, dtype=BF16).to_device(gpu)
            comm.all_reduce(t, op)
            np.testing.assert_array_equal(tensor.to_numpy(t), a, err_msg=op)  # one rank: the values themselves
        g = comm.all_gather(tensor.Tensor(data=a, dtype=BF16).to_device(gpu))
        np.testing.assert_array_equal(tensor.to_numpy(tensor.from_raw_tensor(g) if isinstance(g, _core.Tensor)
                                                      else g)[0], a)
    finally:
        comm.close()


# ---------------------------------------------------------------- every op family in bfloat16
UNARY = ["neg", "abs", "sign", "square", "relu", "exp", "log", "sqrt", "tanh", "sigmoid", "reciprocal", "sin", "cos",
         "floor", "ceil", "round", "log1p", "expm1", "erf", "softplus"]
BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge"]


def pair(gpu, x):
    """(cpu, gpu) bfloat16 tensors holding the same values."""
    c = bf(x)
    return c, c.to(gpu.core)


def same(g, c, msg=""):
    got, want = vals(g), vals(c)
    if g.dtype != BF16:
        np.testing.assert_array_equal(got, want, err_msg=msg)
    else:
        close(got, want, msg)


@pytest.mark.parametrize("op", UNARY)
def test_unary(gpu, rng, op):
    positive = op in ("log", "sqrt", "log1p", "reciprocal")
    c, g = pair(gpu, rng.uniform(0.1 if positive else -3, 3, (7, 129)))
    fn = getattr(_core, op)
    same(fn(g), fn(c), op)
    same(fn(g.transpose([1, 0])), fn(c.transpose([1, 0])), op + " (transposed)")


@pytest.mark.parametrize("op", BINARY)
def test_binary_broadcast_and_scalar(gpu, rng, op):
    positive = op in ("pow", "div")
    ca, ga = pair(gpu, rng.uniform(0.5 if positive else -3, 3, (4, 1, 33)))
    cb, gb = pair(gpu, rng.uniform(0.5 if positive else -3, 2, (5, 33)))
    fn, scalar = getattr(_core, op), getattr(_core, op + "_scalar")
    same(fn(ga, gb), fn(ca, cb), op)
    for first in (False, True):
        same(scalar(ga, 1.5, first), scalar(ca, 1.5, first), op + "_scalar")


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("axes", [None, [0], [2], [0, 2]])
def test_reductions(gpu, rng, op, axes):
    c, g = pair(gpu, rng.uniform(-2, 2, (6, 130, 17)))
    fn = getattr(_core, op)
    same(fn(g, axes, False), fn(c, axes, False), f"{op} {axes}")
    same(_core.argmax(g, 1, False), _core.argmax(c, 1, False), "argmax")
    same(_core.argmin(g, None, False), _core.argmin(c, None, False), "argmin")


def test_clip_axpy_sgd_and_copies(gpu, rng):
    (cx, gx), (cy, gy) = pair(gpu, rng.uniform(-3, 3, (9, 7))), pair(gpu, rng.uniform(-3, 3, (7,)))
    same(_core.clip(gx, -1, 2), _core.clip(cx, -1, 2), "clip")
    for x, y in ((cx, cy), (gx, gy)):
        _core.axpy_(0.5, y, x)
    same(gx, cx, "axpy")
    (cp, gp), (cg, gg), (cb, gbuf) = (pair(gpu, rng.uniform(-1, 1, (33, 7))) for _ in range(3))
    for p, g_, b in ((cp, cg, cb), (gp, gg, gbuf)):
        _core.sgd_update_(p, g_, b, 0.1, 0.9, 0.0, 1e-4, True, False)
    same(gp, cp, "sgd param")
    same(gbuf, cb, "sgd momentum")
    for dtype in (tensor.float16, tensor.float32, tensor.float64, tensor.int32):
        same(gx.transpose([1, 0]).cast(dtype), cx.transpose([1, 0]).cast(dtype), f"cast to {dtype}")
    same(_core.concat([gx, gx], 1), _core.concat([cx, cx], 1), "concat")


def test_convolution_and_pooling_kernels(gpu, rng):
    # bfloat16 does not go through cuDNN (ops/nn.py): im2col + cuBLAS and the own pooling kernels
    c, g = pair(gpu, rng.uniform(-1, 1, (2, 3, 9, 11)))
    geometry = ((3, 3), (1, 2), (1, 0), (1, 1))
    cc, gc = _core.im2col(c, *geometry), _core.im2col(g, *geometry)
    same(gc, cc, "im2col")
    same(_core.col2im(gc, [2, 3, 9, 11], *geometry), _core.col2im(cc, [2, 3, 9, 11], *geometry), "col2im")
    cy, carg = _core.max_pool2d(c, (3, 3), (2, 2), (1, 1))
    gy, garg = _core.max_pool2d(g, (3, 3), (2, 2), (1, 1))
    same(gy, cy, "max_pool2d")
    same(garg, carg, "argmax of the windows")
    cdy, gdy = pair(gpu, rng.uniform(-1, 1, tuple(cy.shape)))
    same(_core.max_pool2d_backward(gdy, garg, [2, 3, 9, 11]), _core.max_pool2d_backward(cdy, carg, [2, 3, 9, 11]),
         "max_pool2d_backward")
    for include in (True, False):
        ca = _core.avg_pool2d(c, (2, 3), (2, 1), (1, 1), include)
        same(_core.avg_pool2d(g, (2, 3), (2, 1), (1, 1), include), ca, "avg_pool2d")
        cdy, gdy = pair(gpu, rng.uniform(-1, 1, tuple(ca.shape)))
        same(_core.avg_pool2d_backward(gdy, [2, 3, 9, 11], (2, 3), (2, 1), (1, 1), include),
             _core.avg_pool2d_backward(cdy, [2, 3, 9, 11], (2, 3), (2, 1), (1, 1), include), "avg_pool2d_backward")


def test_index_ops_and_selection(gpu, rng):
    labels = _core.Tensor.from_buffer(np.array([[0, 3], [9, 1]], np.int64))
    same(_core.one_hot(labels.to(gpu.core), 10, BF16), _core.one_hot(labels, 10, BF16), "one_hot")
    x = rng.permutation(np.arange(1, 1001)) / 250 * rng.choice([-1, 1], 1000)
    c, g = pair(gpu, x)
    for spars, top_k in ((1.5, False), (0.05, True)):
        ci, gi = _core.select_significant(c, spars, top_k), _core.select_significant(g, spars, top_k)
        same(gi, ci, f"select_significant {spars} {top_k}")
        same(_core.take(g, gi), _core.take(c, ci), "take")
        cd, gd = pair(gpu, np.ones(1000))
        _core.index_add_(cd, ci, _core.take(c, ci))
        _core.index_add_(gd, gi, _core.take(g, gi))
        same(gd, cd, "index_add_")
