"""Every C++ op on the GPU against the same op on the CPU, on fresh random data: |gpu - cpu| <= atol +
rtol * |cpu|. Inputs are made on the CPU and copied, so both sides see identical bits; views (transposed,
sliced, broadcast) are taken on each side the same way. Marked `gpu`: skipped where no GPU is usable."""
import numpy as np
import pytest

from singa_lite import _core

pytestmark = pytest.mark.gpu

CPU = _core.Device("cpu")
FLOATS = ["float16", "float32", "float64"]
NUMERIC = FLOATS + ["int32", "int64"]
NP = {"float16": np.float16, "float32": np.float32, "float64": np.float64, "int32": np.int32, "int64": np.int64,
      "bool": np.bool_}
TOL = {"float16": (2e-3, 2e-3), "float32": (1e-5, 1e-5), "float64": (1e-12, 1e-12), "int32": (0, 0),
       "int64": (0, 0), "bool": (0, 0)}


@pytest.fixture(scope="module")
def gpu():
    return _core.Device("cuda:0")


def host(t):
    return np.asarray(t.to(CPU) if t.device.is_cuda() else t)


def data(shape, dtype, seed=0, positive=False, low=-3, high=3):
    rng = np.random.default_rng(seed)
    if dtype in ("int32", "int64"):
        a = rng.integers(1 if positive else low, high + 1, shape)
    elif dtype == "bool":
        a = rng.random(shape) < 0.5
    else:
        a = rng.uniform(0.1 if positive else low, high, shape)
    return np.ascontiguousarray(a.astype(NP[dtype]))


def both(gpu, *arrays):
    """(cpu tensors, gpu tensors) holding the same values."""
    cpu = [_core.Tensor.from_buffer(a) for a in arrays]
    return cpu, [t.to(gpu) for t in cpu]


def check(got_gpu, want_cpu, dtype, scale=1.0):
    got, want = host(got_gpu), host(want_cpu)
    assert got.shape == want.shape and got.dtype == want.dtype
    rtol, atol = TOL[dtype]
    if got.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol * scale,
                                   equal_nan=True)


BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge"]


@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("op", BINARY)
def test_binary_with_broadcasting_and_views(gpu, op, dtype):
    positive = op in ("pow", "div")
    a = data((4, 1, 33), dtype, 1, positive=positive)
    b = data((5, 33), dtype, 2, positive=positive, high=2 if op == "pow" else 3)
    (ca, cb), (ga, gb) = both(gpu, a, b)
    fn = getattr(_core, op)
    check(fn(ga, gb), fn(ca, cb), dtype, scale=10)
    # a transposed operand, and the scalar form both ways round
    check(fn(ga.transpose([2, 1, 0]), gb.transpose([1, 0]).unsqueeze(2)),
          fn(ca.transpose([2, 1, 0]), cb.transpose([1, 0]).unsqueeze(2)), dtype, scale=10)
    s = 2.0
    scalar = getattr(_core, op + "_scalar")
    for first in (False, True):
        check(scalar(ga, s, first), scalar(ca, s, first), dtype, scale=10)


def test_binary_special_values(gpu):
    a = np.array([np.nan, 1.0, -0.0, np.inf, -np.inf, 2.0], np.float32)
    b = np.array([1.0, np.nan, 0.0, np.inf, 1.0, -np.inf], np.float32)
    (ca, cb), (ga, gb) = both(gpu, a, b)
    for op in ("maximum", "minimum", "div", "pow", "eq", "lt"):
        check(getattr(_core, op)(ga, gb), getattr(_core, op)(ca, cb), "float32")


def test_integer_division_rounding(gpu):
    a = np.array([7, -7, 7, -7, 0, 5], np.int32)
    b = np.array([2, 2, -2, -2, 3, 5], np.int32)
    (ca, cb), (ga, gb) = both(gpu, a, b)
    check(_core.div(ga, gb), _core.div(ca, cb), "int32")


UNARY_ANY = ["neg", "abs", "sign", "square", "relu"]
UNARY_FLOAT = ["exp", "log", "sqrt", "tanh", "sigmoid", "reciprocal", "sin", "cos", "floor", "ceil", "round",
               "log1p", "expm1", "erf", "softplus"]


@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("op", UNARY_ANY)
def test_unary_numeric(gpu, op, dtype):
    (cx,), (gx,) = both(gpu, data((3, 257), dtype, 3))
    fn = getattr(_core, op)
    check(fn(gx), fn(cx), dtype, scale=10)
    check(fn(gx.transpose([1, 0])), fn(cx.transpose([1, 0])), dtype, scale=10)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", UNARY_FLOAT)
def test_unary_float(gpu, op, dtype):
    positive = op in ("log", "sqrt", "log1p")
    x = data((1000,), dtype, 4, positive=positive)
    x[:4] = [0.5, 1.5, 2.5, -2.5] if not positive else [0.5, 1.5, 2.5, 3.5]  # round: half to even
    (cx,), (gx,) = both(gpu, x)
    fn = getattr(_core, op)
    check(fn(gx), fn(cx), dtype, scale=10)


def test_unary_in_place_on_a_strided_view(gpu):
    (cx,), (gx,) = both(gpu, data((6, 8), "float32", 5))
    for t in (cx, gx):
        v = t.slice(1, 0, 8, 2)
        _core.exp(v, out=v)
    check(gx, cx, "float32")


@pytest.mark.parametrize("dtype", NUMERIC)
def test_clip_axpy_fill(gpu, dtype):
    (cx, cy), (gx, gy) = both(gpu, data((7, 9), dtype, 6), data((9,), dtype, 7))
    check(_core.clip(gx, -1, 2), _core.clip(cx, -1, 2), dtype)
    check(_core.clip(gx, None, 1), _core.clip(cx, None, 1), dtype)
    for x, y in ((cx, cy), (gx, gy)):
        _core.axpy_(2, y, x)  # y broadcast over x's rows
        _core.fill_(y, 3)
    check(gx, cx, dtype, scale=10)
    check(gy, cy, dtype)


@pytest.mark.parametrize("src", ["float16", "float32", "float64", "int32", "int64", "bool"])
@pytest.mark.parametrize("dst", ["float16", "float32", "float64", "int32", "int64", "bool"])
def test_cast_and_strided_copy(gpu, src, dst):
    (cx,), (gx,) = both(gpu, data((5, 6, 7), src, 8))
    check(gx.cast(getattr(_core.DType, dst)), cx.cast(getattr(_core.DType, dst)), dst)
    tc, tg = cx.transpose([2, 0, 1]).contiguous(), gx.transpose([2, 0, 1]).contiguous()
    check(tg, tc, src)
    # into a strided destination, with broadcasting and a cast
    dc = _core.Tensor([7, 12], getattr(_core.DType, dst), CPU)
    dg = dc.to(gpu)
    _core.copy_(dc.slice(1, 0, 12, 2), cx.select(0, 1).transpose([1, 0]))
    _core.copy_(dg.slice(1, 0, 12, 2), gx.select(0, 1).transpose([1, 0]))
    check(dg, dc, dst)


def test_host_device_copies_cast_and_broadcast(gpu):
    a = data((3, 1), "float64", 9)
    (ca,), _ = both(gpu, a)
    g = _core.Tensor([3, 4], _core.DType.float32, gpu)
    _core.copy_(g, ca)  # host float64 [3,1] -> GPU float32 [3,4]
    np.testing.assert_array_equal(host(g), np.broadcast_to(a.astype(np.float32), (3, 4)))
    h = _core.Tensor([4, 3], _core.DType.float16, CPU)
    _core.copy_(h, g.transpose([1, 0]))  # GPU strided float32 -> host float16
    np.testing.assert_array_equal(np.asarray(h), np.broadcast_to(a.astype(np.float32), (3, 4)).T.astype(np.float16))


@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("axes", [None, [0], [1], [2], [0, 2], [1, 2]])
def test_reductions(gpu, op, dtype, axes):
    if op == "mean" and dtype.startswith("int"):
        pytest.skip("mean of integers is rejected on every device")
    x = data((6, 130, 17), dtype, 10)
    (cx,), (gx,) = both(gpu, x)
    fn = getattr(_core, op)
    scale = 1000 if op in ("sum", "mean") else 1
    check(fn(gx, axes, False), fn(cx, axes, False), dtype, scale=scale)
    check(fn(gx.transpose([2, 0, 1]), axes, True), fn(cx.transpose([2, 0, 1]), axes, True), dtype, scale=scale)


def test_reductions_with_nan_and_large_rows(gpu):
    x = data((3, 100003), "float32", 11)
    x[1, 777] = np.nan
    (cx,), (gx,) = both(gpu, x)
    for op in ("max", "min", "sum"):
        check(getattr(_core, op)(gx, [1], False), getattr(_core, op)(cx, [1], False), "float32", scale=100)
    for op in ("argmax", "argmin"):
        check(getattr(_core, op)(gx, 1, False), getattr(_core, op)(cx, 1, False), "int64")


@pytest.mark.parametrize("dtype", NUMERIC)
def test_argmax_argmin_ties_first(gpu, dtype):
    x = data((9, 40), dtype, 12, low=-1, high=1)  # many ties in the integer cases
    (cx,), (gx,) = both(gpu, x)
    for op in ("argmax", "argmin"):
        for axis in (0, 1, None):
            check(getattr(_core, op)(gx, axis, False), getattr(_core, op)(cx, axis, False), "int64")


@pytest.mark.parametrize("dtype", FLOATS + ["int32", "int64"])
@pytest.mark.parametrize("shapes", [((64, 48), (48, 80)), ((3, 17, 5), (3, 5, 9)), ((2, 1, 4, 6), (5, 6, 7)),
                                    ((7,), (7, 3)), ((4, 7), (7,)), ((5, 0), (0, 3))])
def test_matmul(gpu, dtype, shapes):
    (ca, cb), (ga, gb) = both(gpu, data(shapes[0], dtype, 13, low=-2, high=2),
                              data(shapes[1], dtype, 14, low=-2, high=2))
    check(_core.matmul(ga, gb), _core.matmul(ca, cb), dtype, scale=100)


@pytest.mark.parametrize("dtype", FLOATS)
def test_matmul_of_transposed_and_broadcast_views(gpu, dtype):
    (ca, cb), (ga, gb) = both(gpu, data((30, 20), dtype, 15), data((4, 30, 10), dtype, 16))
    want = _core.matmul(ca.transpose([1, 0]), cb)  # [20,30] @ [4,30,10]: broadcast batch, transposed lhs
    check(_core.matmul(ga.transpose([1, 0]), gb), want, dtype, scale=100)
    want = _core.matmul(cb.transpose([0, 2, 1]), ca)  # [4,10,30] @ [30,20]
    check(_core.matmul(gb.transpose([0, 2, 1]), ga), want, dtype, scale=100)


def test_matmul_large(gpu):
    (ca, cb), (ga, gb) = both(gpu, data((512, 1024), "float32", 17), data((1024, 384), "float32", 18))
    check(_core.matmul(ga, gb), _core.matmul(ca, cb), "float32", scale=1000)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("geom", [((2, 3, 9, 11), (3, 3), (1, 1), (1, 1), (1, 1)),
                                  ((1, 2, 8, 8), (2, 3), (2, 1), (0, 1), (1, 1)),
                                  ((2, 1, 10, 10), (3, 3), (1, 2), (2, 0), (2, 2))])
def test_im2col_col2im(gpu, dtype, geom):
    shape, kernel, stride, pad, dil = geom
    (cx,), (gx,) = both(gpu, data(shape, dtype, 19))
    cc, gc = _core.im2col(cx, kernel, stride, pad, dil), _core.im2col(gx, kernel, stride, pad, dil)
    check(gc, cc, dtype)
    check(_core.col2im(gc, list(shape), kernel, stride, pad, dil),
          _core.col2im(cc, list(shape), kernel, stride, pad, dil),
          dtype, scale=10)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("geom", [((2, 3, 8, 8), (2, 2), (2, 2), (0, 0)), ((1, 2, 9, 7), (3, 3), (2, 1), (1, 1)),
                                  ((2, 1, 5, 5), (3, 2), (1, 1), (1, 0))])
def test_pooling_forward_and_backward(gpu, dtype, geom):
    shape, kernel, stride, pad = geom
    x = data(shape, dtype, 20, low=-1, high=1)
    x.reshape(-1)[::7] = 0.5  # ties inside windows: the first one wins on both devices
    (cx,), (gx,) = both(gpu, x)
    cy, carg = _core.max_pool2d(cx, kernel, stride, pad)
    gy, garg = _core.max_pool2d(gx, kernel, stride, pad)
    check(gy, cy, dtype)
    check(garg, carg, "int64")
    (cdy,), (gdy,) = both(gpu, data(tuple(cy.shape), dtype, 21))
    check(_core.max_pool2d_backward(gdy, garg, list(shape)), _core.max_pool2d_backward(cdy, carg, list(shape)),
          dtype, scale=10)
    for include in (True, False):
        ca = _core.avg_pool2d(cx, kernel, stride, pad, include)
        check(_core.avg_pool2d(gx, kernel, stride, pad, include), ca, dtype)
        (cdy,), (gdy,) = both(gpu, data(tuple(ca.shape), dtype, 22))
        check(_core.avg_pool2d_backward(gdy, list(shape), kernel, stride, pad, include),
              _core.avg_pool2d_backward(cdy, list(shape), kernel, stride, pad, include), dtype, scale=10)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
def test_one_hot(gpu, dtype):
    (ci,), (gi,) = both(gpu, np.array([[0, 3], [9, 1]], np.int64))
    check(_core.one_hot(gi, 10, getattr(_core.DType, dtype)), _core.one_hot(ci, 10, getattr(_core.DType, dtype)), dtype)
    # checked on the GPU, reported at the next wait for it (tests/gpu/test_index_checks_gpu.py has the rest)
    _core.one_hot(gi, 5, _core.DType.float32)
    with pytest.raises(IndexError, match=r"one_hot: indices must lie in \[0, 5\), got out-of-range values in \[9, 9\]"):
        _core.cuda_sync(gpu.index)


@pytest.mark.parametrize("dtype", FLOATS)
def test_random_numbers_equal_the_cpu_stream(gpu, dtype):
    """The GPU draws the CPU's Philox numbers, element for element, for the same seed."""
    for name, args in (("uniform_", (-1.0, 2.0)), ("gaussian_", (0.5, 2.0)), ("bernoulli_", (0.3,))):
        c = _core.Tensor([1001], getattr(_core.DType, dtype), CPU)
        g = _core.Tensor([1001], getattr(_core.DType, dtype), gpu)
        _core.manual_seed(CPU, 42)
        getattr(_core, name)(c, *args)
        _core.manual_seed(gpu, 42)
        getattr(_core, name)(g, *args)
        rtol = 1e-6 if dtype != "float16" else 1e-3
        np.testing.assert_allclose(host(g).astype(np.float64), host(c).astype(np.float64), rtol=rtol, atol=rtol)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("momentum,nesterov,first", [(0.0, False, False), (0.9, False, True), (0.9, True, False)])
def test_fused_sgd_update(gpu, dtype, momentum, nesterov, first):
    (cp, cg, cb), (gp, gg, gb) = both(gpu, data((33, 7), dtype, 23), data((33, 7), dtype, 24), data((33, 7), dtype, 25))
    for p, g, b in ((cp, cg, cb), (gp, gg, gb)):
        _core.sgd_update_(p, g, b if momentum else None, 0.1, momentum, 0.0, 1e-4, nesterov, first)
    check(gp, cp, dtype)
    check(gb, cb, dtype)


def test_concat_stack_split(gpu):
    (ca, cb), (ga, gb) = both(gpu, data((2, 3), "float32", 26), data((4, 3), "float32", 27))
    check(_core.concat([ga, gb], 0), _core.concat([ca, cb], 0), "float32")
    check(_core.stack([ga, ga], 1), _core.stack([ca, ca], 1), "float32")
    for x, y in zip(_core.split(gb, [1, 3], 0), _core.split(cb, [1, 3], 0)):
        check(x, y, "float32")


def test_memory_is_reused_and_reported(gpu):
    _core.cuda_sync(gpu.index)
    before = _core.cuda_memory_stats(gpu.index)
    for _ in range(50):
        t = _core.Tensor([1 << 20], _core.DType.float32, gpu)
        del t
    after = _core.cuda_memory_stats(gpu.index)
    assert after["device_allocs"] - before["device_allocs"] <= 1  # the block is reused, not re-allocated
    assert after["peak_in_use"] >= 4 << 20
    _core.cuda_empty_cache(gpu.index)
    assert _core.cuda_memory_stats(gpu.index)["cached"] == 0


def test_out_of_memory_is_a_memory_error_and_the_device_stays_usable(gpu):
    keep = _core.Tensor([1 << 20], _core.DType.float32, gpu)  # cached blocks are emptied, live ones kept
    _core.fill_(keep, 2.0)
    # 4 TiB: more than any GPU; the allocator empties its cache, retries, then raises
    with pytest.raises(MemoryError, match=r"cannot allocate \d+ bytes on cuda:\d+ \(out of GPU memory"):
        _core.Tensor([1 << 40], _core.DType.float32, gpu)
    # beyond any machine: refused before cudaMalloc (a size class that wrapped once gave such a tensor 1 byte)
    with pytest.raises(MemoryError, match="more than any machine has"):
        _core.Tensor([2 ** 61 - 1], _core.DType.float64, gpu)
    np.testing.assert_array_equal(host(_core.add(keep, keep)), np.full(1 << 20, 4.0, np.float32))


@pytest.mark.parametrize("dtype", FLOATS)
def test_sparse_selection_take_and_index_add(gpu, dtype):
    x = np.random.default_rng(28).permutation(np.arange(1, 5001)).astype(np.float64) / 5000  # distinct
    x[::2] *= -1
    x[17] = np.nan
    (cx,), (gx,) = both(gpu, x.astype(NP[dtype]))
    for spars, top_k in ((0.3, False), (0.05, True), (1.0, True)):
        ci, gi = _core.select_significant(cx, spars, top_k), _core.select_significant(gx, spars, top_k)
        # float16 rounding makes magnitudes tie at the top-K cut: the lower index wins on both devices
        check(gi, ci, "int64")
        check(_core.take(gx, gi), _core.take(cx, ci), dtype)
        (cd,), (gd,) = both(gpu, np.ones(x.size, NP[dtype]))
        _core.index_add_(cd, ci, _core.take(cx, ci))
        _core.index_add_(gd, gi, _core.take(gx, gi))
        check(gd, cd, dtype)


@pytest.mark.parametrize("dtype", FLOATS + ["bfloat16"])
def test_top_k_among_zeros_of_both_signs_matches_the_cpu(gpu, dtype):
    """A gradient with more zeros than k: the cut falls among zeros, half of them -0.0. |-0.0| keeps no sign on the
    GPU (it sorted below +0.0 before) and ties go to the lower index on both devices, so the same entries are sent."""
    rng = np.random.default_rng(29)
    x = np.zeros(20000)
    x[rng.choice(x.size, x.size // 2, replace=False)] = -0.0
    big = rng.choice(x.size, 300, replace=False)
    x[big] = rng.uniform(0.5, 2, big.size) * rng.choice([-1, 1], big.size)
    cx = _core.Tensor.from_buffer(x).cast(getattr(_core.DType, dtype))
    gx = cx.to(gpu)
    for spars in (0.02, 0.1, 0.5):
        ci = np.asarray(_core.select_significant(cx, spars, True))
        gi = host(_core.select_significant(gx, spars, True))
        np.testing.assert_array_equal(gi, ci)
        assert set(big.tolist()) <= set(gi.tolist()) and np.all(np.diff(gi) > 0)
