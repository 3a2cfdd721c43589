"""Convolution, pooling and batch normalisation operators (singa_lite/ops/nn.py).

Forward values against numpy references (and torch.nn.functional when torch is installed); every backward
against central finite differences in float64, following tests/unit/test_autograd_ops.py: all inputs are
parameters and the gradient checked is that of sum(y * R) for a fixed random R, passed as dy.
"""
import zlib

import numpy as np
import pytest

from singa_lite import _core, autograd, tensor
from core_testutil import np_pool, numeric_grads, out_size, pair as _pair

RTOL = ATOL = 1e-5


pytestmark = pytest.mark.usefixtures("training")


def rng_for(name):
    return np.random.default_rng(zlib.crc32(name.encode()))


def param(a):
    return tensor.Tensor(data=np.array(a, np.float64), requires_grad=True, stores_grad=True)


def const(a, dtype=np.float64):
    return tensor.Tensor(data=np.array(a, dtype), requires_grad=False)


def check_gradients(fn, arrays, rng):
    """Runs fn on parameters, checks the autograd gradients against finite differences; returns y."""
    params = [param(a) for a in arrays]
    y = fn(*params)
    R = rng.standard_normal(y.shape)
    grads = autograd.gradients(y, const(R))
    assert set(grads) == set(params)
    for p, _a, num in zip(params, arrays, numeric_grads(fn, arrays, R)):
        g = grads[p]
        assert g.shape == p.shape and g.dtype == tensor.float64
        np.testing.assert_allclose(tensor.to_numpy(g), num, rtol=RTOL, atol=ATOL)
    return tensor.to_numpy(y)


def distinct(rng, shape, spacing=0.01):
    """Values at least `spacing` apart (so a finite-difference step never changes which one is the max)."""
    n = int(np.prod(shape))
    return (rng.permutation(n).astype(np.float64) * spacing - n * spacing / 2).reshape(shape)


# ---------------------------------------------------------------- numpy references
def np_conv2d(x, W, b=None, stride=1, padding=0, dilation=1, groups=1):
    s, p, d = _pair(stride), _pair(padding), _pair(dilation)
    N, C, H, Wd = x.shape
    OC, Cg, kh, kw = W.shape
    oh, ow = out_size(H, kh, s[0], p[0], d[0]), out_size(Wd, kw, s[1], p[1], d[1])
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    Wg = W.reshape(groups, OC // groups, Cg, kh, kw)
    y = np.zeros((N, groups, OC // groups, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * d[0]:i * d[0] + s[0] * (oh - 1) + 1:s[0], j * d[1]:j * d[1] + s[1] * (ow - 1) + 1:s[1]]
            patch = patch.reshape(N, groups, Cg, oh, ow)
            y += np.einsum("ngchw,goc->ngohw", patch, Wg[:, :, :, i, j])
    y = y.reshape(N, OC, oh, ow)
    return y if b is None else y + b[None, :, None, None]


def np_batchnorm_train(x, scale, bias, rm, rv, momentum, eps):
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean, var = x.mean(axes), x.var(axes)
    M = x.size // x.shape[1]
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(shape) + bias.reshape(shape)
    return y, (1 - momentum) * rm + momentum * mean, (1 - momentum) * rv + momentum * var * M / (M - 1)


def np_batchnorm_eval(x, scale, bias, rm, rv, eps):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (x - rm.reshape(shape)) / np.sqrt(rv.reshape(shape) + eps) * scale.reshape(shape) + bias.reshape(shape)


# ---------------------------------------------------------------- convolution
# (id, x shape, W shape, bias, stride, padding, dilation, groups)
CONV_CASES = [
    ("basic", (2, 3, 6, 7), (4, 3, 3, 3), True, 1, 0, 1, 1),
    ("stride_pad_dil_rect", (2, 2, 7, 9), (3, 2, 3, 2), True, (2, 1), (1, 2), (1, 2), 1),
    ("groups2", (2, 4, 7, 6), (6, 2, 3, 3), True, 2, 1, 1, 2),
    ("depthwise_nobias", (1, 4, 6, 6), (4, 1, 2, 3), False, (1, 2), (0, 1), 2, 4),
    ("pointwise", (3, 5, 3, 4), (2, 5, 1, 1), True, 1, 0, 1, 1),
    ("stride3_pad", (2, 2, 8, 5), (2, 2, 3, 3), False, 3, 1, 1, 1),
]


@pytest.mark.parametrize("name,xs,ws,bias,stride,padding,dilation,groups", CONV_CASES,
                         ids=[c[0] for c in CONV_CASES])
def test_conv2d_forward_and_gradient(name, xs, ws, bias, stride, padding, dilation, groups):
    rng = rng_for(name)
    arrays = [rng.standard_normal(xs), rng.standard_normal(ws)] + ([rng.standard_normal(ws[0])] if bias else [])

    def fn(x, W, b=None):
        return autograd.conv2d(x, W, b, stride, padding, dilation, groups)

    y = check_gradients(fn, arrays, rng)
    x, W, b = arrays + [None] * (3 - len(arrays))
    np.testing.assert_allclose(y, np_conv2d(x, W, b, stride, padding, dilation, groups), rtol=1e-10, atol=1e-12)


def test_conv2d_skips_dx_for_data_input(monkeypatch):
    """The first layer's input needs no gradient: col2im (the dx path) must not run."""
    rng = rng_for("skip_dx")
    calls = []
    real = _core.col2im
    monkeypatch.setattr(_core, "col2im", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = const(rng.standard_normal((2, 3, 5, 5)))
    W, b = param(rng.standard_normal((4, 3, 3, 3))), param(rng.standard_normal(4))
    grads = autograd.gradients(autograd.conv2d(x, W, b, padding=1))
    assert set(grads) == {W, b} and calls == []
    # with a parameter as input, dx is computed
    x2 = param(rng.standard_normal((2, 3, 5, 5)))
    grads = autograd.gradients(autograd.conv2d(x2, W, b, padding=1))
    assert set(grads) == {x2, W, b} and calls == [1]


def test_conv2d_only_dx():
    """W and b constants: only dx is asked for (needs_grad (True, False, False))."""
    rng = rng_for("only_dx")
    x, W, b = rng.standard_normal((2, 2, 5, 4)), rng.standard_normal((3, 2, 2, 2)), rng.standard_normal(3)
    xp = param(x)
    y = autograd.conv2d(xp, const(W), const(b), stride=(1, 2))
    R = rng.standard_normal(y.shape)
    g = autograd.gradients(y, const(R))
    num = numeric_grads(lambda t: autograd.conv2d(t, const(W), const(b), stride=(1, 2)), [x], R)[0]
    np.testing.assert_allclose(tensor.to_numpy(g[xp]), num, rtol=RTOL, atol=ATOL)


def test_conv2d_float32_and_int_args():
    rng = rng_for("f32")
    x = rng.standard_normal((4, 3, 9, 9)).astype(np.float32)
    W = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    y = autograd.conv2d(const(x, np.float32), const(W, np.float32), const(b, np.float32), 2, 1, 1, 1)
    assert y.dtype == tensor.float32 and y.shape == (4, 5, 5, 5)
    np.testing.assert_allclose(tensor.to_numpy(y), np_conv2d(x.astype(np.float64), W, b, 2, 1), rtol=1e-4,
                               atol=1e-4)


# ---------------------------------------------------------------- pooling
# (id, x shape, kernel, stride, padding)
POOL_CASES = [
    ("k2_default_stride", (2, 3, 6, 6), 2, None, 0),
    ("rect_pad", (2, 2, 7, 9), (3, 2), (2, 1), (1, 1)),
    ("overlap_pad", (1, 3, 5, 5), 3, 1, 1),
    ("odd_size", (2, 1, 7, 5), (2, 3), (2, 2), (0, 1)),
]


@pytest.mark.parametrize("name,xs,kernel,stride,padding", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_max_pool2d(name, xs, kernel, stride, padding):
    rng = rng_for("max" + name)
    x = distinct(rng, xs)
    y = check_gradients(lambda t: autograd.max_pool2d(t, kernel, stride, padding), [x], rng)
    np.testing.assert_array_equal(y, np_pool(x, kernel, stride, padding, "max"))


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("name,xs,kernel,stride,padding", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_avg_pool2d(name, xs, kernel, stride, padding, count_include_pad):
    rng = rng_for("avg" + name)
    x = rng.standard_normal(xs)
    y = check_gradients(lambda t: autograd.avg_pool2d(t, kernel, stride, padding, count_include_pad), [x], rng)
    np.testing.assert_allclose(y, np_pool(x, kernel, stride, padding, "avg", count_include_pad), rtol=1e-12,
                               atol=1e-12)


def test_global_avg_pool2d():
    rng = rng_for("gap")
    x = rng.standard_normal((2, 3, 4, 5))
    y = check_gradients(autograd.global_avg_pool2d, [x], rng)
    assert y.shape == (2, 3, 1, 1)
    np.testing.assert_allclose(y, x.mean((2, 3), keepdims=True), rtol=1e-12)
    assert autograd.globalaveragepool is autograd.global_avg_pool2d


# ---------------------------------------------------------------- batch normalisation
@pytest.mark.parametrize("xs", [(4, 3, 2, 3), (5, 2, 1, 1), (6, 3)], ids=["nchw", "1x1", "nc"])
def test_batchnorm_training_gradient_and_running_stats(xs):
    rng = rng_for(f"bn{xs}")
    C = xs[1]
    x = rng.standard_normal(xs) * 2 + 1
    scale, bias = rng.uniform(0.5, 1.5, C), rng.standard_normal(C)
    rm0, rv0 = rng.standard_normal(C), rng.uniform(0.5, 2.0, C)
    rm, rv = const(rm0), const(rv0)

    def fn(t, s, b):  # the finite differences update scratch running statistics, not rm / rv
        return autograd.batchnorm_2d(t, s, b, const(rm0), const(rv0), 0.3, 1e-5)

    params = [param(a) for a in (x, scale, bias)]
    y = autograd.batchnorm_2d(*params, rm, rv, momentum=0.3, eps=1e-5)
    ey, erm, erv = np_batchnorm_train(x, scale, bias, rm0, rv0, 0.3, 1e-5)
    np.testing.assert_allclose(tensor.to_numpy(y), ey, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tensor.to_numpy(rm), erm, rtol=1e-12)  # updated in place
    np.testing.assert_allclose(tensor.to_numpy(rv), erv, rtol=1e-12)
    R = rng.standard_normal(y.shape)
    grads = autograd.gradients(y, const(R))
    assert set(grads) == set(params)
    for p, num in zip(params, numeric_grads(fn, [x, scale, bias], R)):
        assert grads[p].shape == p.shape
        np.testing.assert_allclose(tensor.to_numpy(grads[p]), num, rtol=RTOL, atol=ATOL)


def test_batchnorm_eval_uses_running_stats():
    rng = rng_for("bn_eval")
    x = rng.standard_normal((3, 4, 2, 2))
    scale, bias = rng.uniform(0.5, 1.5, 4), rng.standard_normal(4)
    rm0, rv0 = rng.standard_normal(4), rng.uniform(0.5, 2.0, 4)
    rm, rv = const(rm0), const(rv0)
    autograd.training = False
    y = autograd.batchnorm_2d(const(x), const(scale), const(bias), rm, rv)
    np.testing.assert_allclose(tensor.to_numpy(y), np_batchnorm_eval(x, scale, bias, rm0, rv0, 1e-5), rtol=1e-12)
    np.testing.assert_array_equal(tensor.to_numpy(rm), rm0)  # untouched
    np.testing.assert_array_equal(tensor.to_numpy(rv), rv0)


def test_batchnorm_default_momentum_convention():
    """SINGA: running = (1 - momentum) * running + momentum * batch_stat; default momentum 0.9."""
    rng = rng_for("bn_mom")
    x = rng.standard_normal((8, 2, 3, 3))
    rm, rv = const(np.zeros(2)), const(np.ones(2))
    autograd.batchnorm_2d(const(x), const(np.ones(2)), const(np.zeros(2)), rm, rv)
    np.testing.assert_allclose(tensor.to_numpy(rm), 0.9 * x.mean((0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(tensor.to_numpy(rv), 0.1 + 0.9 * x.var((0, 2, 3), ddof=1), rtol=1e-12)


# ---------------------------------------------------------------- a small network, end to end
def test_chain_conv_bn_pool_conv():
    rng = rng_for("chain")
    arrays = [rng.standard_normal((2, 2, 6, 6)), rng.standard_normal((3, 2, 3, 3)), rng.standard_normal(3),
              rng.uniform(0.5, 1.5, 3), rng.standard_normal(3), rng.standard_normal((4, 3, 2, 2))]

    def fn(x, W1, b1, s, beta, W2):
        h = autograd.conv2d(x, W1, b1, padding=1)
        h = autograd.batchnorm_2d(h, s, beta, const(np.zeros(3)), const(np.ones(3)))
        h = autograd.avg_pool2d(h, 2)
        h = autograd.conv2d(h, W2, None, padding=(1, 0))
        return autograd.global_avg_pool2d(autograd.tanh(h))

    check_gradients(fn, arrays, rng)


def test_float16_chain_follows_float64():
    # conv (groups, stride, padding), batch norm, both poolings, global pooling and a loss, all in float16 end
    # to end, against the same half-rounded inputs in float64.
    rng = rng_for("half chain")
    arrays = [rng.standard_normal((2, 4, 7, 7)), rng.standard_normal((6, 2, 3, 3)) * 0.5, rng.standard_normal(6),
              rng.uniform(0.5, 1.5, 6), rng.standard_normal(6), rng.standard_normal((5, 6, 2, 2)) * 0.5]
    arrays = [a.astype(np.float16).astype(np.float64) for a in arrays]

    def fn(dtype):
        ps = [tensor.Tensor(data=a.astype(dtype), requires_grad=True, stores_grad=True) for a in arrays]
        x, W1, b1, s, beta, W2 = ps
        h = autograd.conv2d(x, W1, b1, stride=1, padding=1, groups=2)
        h = autograd.batchnorm_2d(h, s, beta, const(np.zeros(6), dtype), const(np.ones(6), dtype))
        h = autograd.max_pool2d(autograd.relu(h), 2, 1)
        h = autograd.conv2d(h, W2, None, stride=2)
        h = autograd.avg_pool2d(h, 2, 1, padding=1)
        y = autograd.global_avg_pool2d(autograd.tanh(h))
        return ps, y

    p16, y16 = fn(np.float16)
    p64, y64 = fn(np.float64)
    assert y16.dtype == tensor.float16
    np.testing.assert_allclose(tensor.to_numpy(y16).astype(np.float64), tensor.to_numpy(y64), rtol=3e-2, atol=3e-2)
    R = rng.standard_normal(y64.shape).astype(np.float16)
    g16 = autograd.gradients(y16, const(R, np.float16))
    g64 = autograd.gradients(y64, const(R.astype(np.float64)))
    for a, b in zip(p16, p64):
        assert g16[a].dtype == tensor.float16
        want = tensor.to_numpy(g64[b])
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(tensor.to_numpy(g16[a]).astype(np.float64), want, rtol=3e-2, atol=3e-2 * scale)


# ---------------------------------------------------------------- errors
def _raises(fn, *fragments):
    with pytest.raises(ValueError) as e:
        fn()
    for f in fragments:
        assert f in str(e.value), (f, str(e.value))


def test_errors():
    x = const(np.zeros((2, 3, 8, 8)))
    W4 = const(np.zeros((5, 4, 3, 3)))
    _raises(lambda: autograd.conv2d(x, W4), "conv2d", "(2, 3, 8, 8)", "(5, 4, 3, 3)", "3 channels", "expects 4")
    _raises(lambda: autograd.conv2d(x, const(np.zeros((6, 1, 3, 3))), groups=2), "conv2d", "groups=2",
            "(2, 3, 8, 8)")
    _raises(lambda: autograd.conv2d(const(np.zeros((2, 4, 8, 8))), const(np.zeros((5, 2, 3, 3))), groups=2),
            "conv2d", "groups=2", "(5, 2, 3, 3)")
    _raises(lambda: autograd.conv2d(const(np.zeros((3, 8, 8))), W4), "conv2d", "(3, 8, 8)")
    _raises(lambda: autograd.conv2d(x, const(np.zeros((5, 3, 3)))), "conv2d", "(5, 3, 3)")
    _raises(lambda: autograd.conv2d(x, const(np.zeros((5, 3, 3, 3))), const(np.zeros(4))), "conv2d", "(4,)")
    _raises(lambda: autograd.conv2d(x, const(np.zeros((5, 3, 9, 3)))), "conv2d", "height")
    _raises(lambda: autograd.conv2d(x, const(np.zeros((5, 3, 3, 3))), stride=0), "conv2d", "stride")
    _raises(lambda: autograd.conv2d(x, const(np.zeros((5, 3, 3, 3))), padding=(1, 2, 3)), "conv2d", "padding")
    _raises(lambda: autograd.conv2d(x, const(np.zeros((5, 3, 3, 3))), groups=0), "conv2d", "groups")
    _raises(lambda: autograd.max_pool2d(x, 2, padding=2), "max_pool2d", "padding")
    _raises(lambda: autograd.max_pool2d(const(np.zeros((3, 8, 8))), 2), "max_pool2d", "(3, 8, 8)")
    _raises(lambda: autograd.avg_pool2d(x, 9), "avg_pool2d", "(2, 3, 8, 8)")
    _raises(lambda: autograd.global_avg_pool2d(const(np.zeros((2, 3)))), "global_avg_pool2d", "(2, 3)")
    c3 = const(np.zeros(3))
    _raises(lambda: autograd.batchnorm_2d(x, const(np.zeros(4)), c3, c3, c3), "batchnorm_2d", "scale",
            "(3,)", "(4,)")
    _raises(lambda: autograd.batchnorm_2d(x, c3, c3, c3, const(np.zeros((1, 3, 1, 1)))), "batchnorm_2d",
            "running_var")
    _raises(lambda: autograd.batchnorm_2d(const(np.zeros((2, 3, 4))), c3, c3, c3, c3), "batchnorm_2d",
            "(2, 3, 4)")
    _raises(lambda: autograd.batchnorm_2d(const(np.zeros((1, 3, 1, 1))), c3, c3, c3, c3), "batchnorm_2d",
            "more than one value")


# ---------------------------------------------------------------- against torch
TORCH_CONV = [  # x shape, W shape, stride, padding, dilation, groups
    ((3, 4, 11, 10), (6, 2, 3, 4), (2, 1), (1, 2), (2, 1), 2),
    ((2, 3, 9, 9), (5, 3, 5, 5), 1, 0, 1, 1),
    ((2, 6, 8, 8), (6, 1, 3, 3), 1, 1, 1, 6),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs,ws,stride,padding,dilation,groups", TORCH_CONV)
def test_conv2d_against_torch(xs, ws, stride, padding, dilation, groups, dtype):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = rng_for(f"tconv{xs}{ws}")
    x, W, b = (rng.standard_normal(s).astype(dtype) for s in (xs, ws, ws[0]))
    params = [tensor.Tensor(data=a, requires_grad=True, stores_grad=True) for a in (x, W, b)]
    y = autograd.conv2d(*params, stride, padding, dilation, groups)
    tp = [torch.tensor(a, requires_grad=True) for a in (x, W, b)]
    ty = F.conv2d(*tp, stride=stride, padding=padding, dilation=dilation, groups=groups)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(tensor.to_numpy(y), ty.detach().numpy(), rtol=tol, atol=tol)
    R = rng.standard_normal(y.shape).astype(dtype)
    grads = autograd.gradients(y, tensor.Tensor(data=R, requires_grad=False))
    (ty * torch.tensor(R)).sum().backward()
    for p, t in zip(params, tp):
        np.testing.assert_allclose(tensor.to_numpy(grads[p]), t.grad.numpy(), rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("name,xs,kernel,stride,padding", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_pooling_against_torch(name, xs, kernel, stride, padding):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = rng_for("tpool" + name).standard_normal(xs).astype(np.float32)
    tx = torch.tensor(x)
    y = autograd.max_pool2d(const(x, np.float32), kernel, stride, padding)
    np.testing.assert_array_equal(tensor.to_numpy(y), F.max_pool2d(tx, kernel, stride, padding).numpy())
    for cip in (True, False):
        y = autograd.avg_pool2d(const(x, np.float32), kernel, stride, padding, cip)
        np.testing.assert_allclose(tensor.to_numpy(y), F.avg_pool2d(tx, kernel, stride, padding,
                                                                    count_include_pad=cip).numpy(), rtol=1e-6,
                                   atol=1e-6)
    y = autograd.global_avg_pool2d(const(x, np.float32))
    np.testing.assert_allclose(tensor.to_numpy(y), F.adaptive_avg_pool2d(tx, 1).numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("momentum", [0.9, 0.1])
def test_batchnorm_against_torch(momentum):
    """SINGA's momentum is the weight of the new batch statistic, which is what torch's momentum means."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = rng_for(f"tbn{momentum}")
    x = rng.standard_normal((4, 3, 5, 5)) * 3 + 2
    scale, bias = rng.uniform(0.5, 1.5, 3), rng.standard_normal(3)
    rm0, rv0 = rng.standard_normal(3), rng.uniform(0.5, 2.0, 3)
    rm, rv = const(rm0), const(rv0)
    trm, trv = torch.tensor(rm0), torch.tensor(rv0)
    params = [param(a) for a in (x, scale, bias)]
    tp = [torch.tensor(a, requires_grad=True) for a in (x, scale, bias)]
    for _step in range(2):  # two steps: the running statistics compound
        y = autograd.batchnorm_2d(*params, rm, rv, momentum, 1e-5)
        ty = F.batch_norm(tp[0], trm, trv, tp[1], tp[2], training=True, momentum=momentum, eps=1e-5)
        np.testing.assert_allclose(tensor.to_numpy(y), ty.detach().numpy(), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(tensor.to_numpy(rm), trm.numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(tensor.to_numpy(rv), trv.numpy(), rtol=1e-12, atol=1e-12)
    R = rng.standard_normal(y.shape)
    grads = autograd.gradients(y, const(R))
    (ty * torch.tensor(R)).sum().backward()
    for p, t in zip(params, tp):
        np.testing.assert_allclose(tensor.to_numpy(grads[p]), t.grad.numpy(), rtol=1e-9, atol=1e-9)
    autograd.training = False
    y = autograd.batchnorm_2d(*params, rm, rv, momentum, 1e-5)
    ty = F.batch_norm(tp[0], trm, trv, tp[1], tp[2], training=False, eps=1e-5)
    np.testing.assert_allclose(tensor.to_numpy(y), ty.detach().numpy(), rtol=1e-10, atol=1e-10)


def test_batchnorm_eval_backward_direct():
    """The evaluation-mode operator's backward (reachable only by driving the operator directly)."""
    from singa_lite.ops.nn import _BatchNorm2d
    rng = rng_for("bn_eval_bwd")
    x, scale, bias = rng.standard_normal((2, 3, 2, 2)), rng.uniform(0.5, 1.5, 3), rng.standard_normal(3)
    rm0, rv0 = rng.standard_normal(3), rng.uniform(0.5, 2.0, 3)
    autograd.training = False
    op = _BatchNorm2d(const(rm0).data, const(rv0).data, 0.9, 1e-5)
    op.forward(*(const(a).data for a in (x, scale, bias)))
    R = rng.standard_normal(x.shape)
    op.needs_grad = (True, True, True)
    got = [tensor.to_numpy(tensor.from_raw_tensor(g)) for g in op.backward(const(R).data)]
    num = numeric_grads(lambda t, s, b: autograd.batchnorm_2d(t, s, b, const(rm0), const(rv0)), [x, scale, bias], R)
    for g, n in zip(got, num):
        np.testing.assert_allclose(g, n, rtol=RTOL, atol=ATOL)
