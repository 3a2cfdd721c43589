"""SINGA's autograd operators as singa_lite provides them (singa_lite/ops, layer_extra).

Written from SINGA's documented behaviour: each operator's forward against numpy, its gradient against
central finite differences in float64, and the calling conventions SINGA scripts rely on (losses of shape
(1,), ``op.backward()`` called directly with no dy or a dy of another float dtype, AssertionError for bad
arguments, ``layer.RNN`` / ``layer.LSTM`` / ``layer.Gemm`` / ``layer.Embedding``).
"""
import math

import numpy as np
import pytest

from singa_lite import autograd, layer, tensor
from singa_lite.tensor import Tensor


pytestmark = pytest.mark.usefixtures("training")  # tests/conftest.py


def param(a):
    return Tensor(data=np.asarray(a, np.float64), requires_grad=True, stores_grad=True)


def const(a, dtype=np.float64):
    return Tensor(data=np.asarray(a, dtype), requires_grad=False)


def npy(t):
    return tensor.to_numpy(t)


def check_grads(fn, arrays, rng, eps=1e-6, tol=1e-6):
    """fn(*Tensors) -> Tensor; autograd's gradient of sum(y * R) against central differences."""
    params = [param(a) for a in arrays]
    y = fn(*params)
    R = rng.standard_normal(y.shape)
    grads = autograd.gradients(y, Tensor(data=R, requires_grad=False))
    saved, autograd.training = autograd.training, False
    try:
        for i, (p, a) in enumerate(zip(params, arrays)):
            num = np.zeros_like(a)
            for idx in np.ndindex(a.shape):
                vals = []
                for sign in (1, -1):
                    args = [b.copy() for b in arrays]
                    args[i][idx] += sign * eps
                    vals.append((npy(fn(*[const(b) for b in args])) * R).sum())
                num[idx] = (vals[0] - vals[1]) / (2 * eps)
            np.testing.assert_allclose(npy(grads[p]), num, rtol=tol, atol=tol)
    finally:
        autograd.training = saved
    return y


def away_from(a, points, gap=0.1):
    for k in points:
        a = np.where(np.abs(a - k) < gap, k + np.where(a >= k, 2 * gap, -2 * gap), a)
    return a


# ---------------------------------------------------------------- element-wise math
UNARY = [  # (name, autograd function, numpy reference, input values)
    ("sin", autograd.sin, np.sin, lambda r: r.uniform(-3, 3, (3, 4))),
    ("cos", autograd.cos, np.cos, lambda r: r.uniform(-3, 3, (3, 4))),
    ("tan", autograd.tan, np.tan, lambda r: r.uniform(-1.2, 1.2, (3, 4))),
    ("asin", autograd.asin, np.arcsin, lambda r: r.uniform(-0.9, 0.9, (3, 4))),
    ("acos", autograd.acos, np.arccos, lambda r: r.uniform(-0.9, 0.9, (3, 4))),
    ("atan", autograd.atan, np.arctan, lambda r: r.uniform(-3, 3, (3, 4))),
    ("sinh", autograd.sinh, np.sinh, lambda r: r.uniform(-2, 2, (3, 4))),
    ("cosh", autograd.cosh, np.cosh, lambda r: r.uniform(-2, 2, (3, 4))),
    ("asinh", autograd.asinh, np.arcsinh, lambda r: r.uniform(-3, 3, (3, 4))),
    ("acosh", autograd.acosh, np.arccosh, lambda r: r.uniform(1.2, 3, (3, 4))),
    ("atanh", autograd.atanh, np.arctanh, lambda r: r.uniform(-0.9, 0.9, (3, 4))),
    ("softsign", autograd.softsign, lambda x: x / (1 + np.abs(x)), lambda r: away_from(r.normal(size=(3, 4)), [0])),
    ("hardsigmoid", lambda x: autograd.hardsigmoid(x, 0.2, 0.5), lambda x: np.clip(0.2 * x + 0.5, 0, 1),
     lambda r: away_from(r.uniform(-4, 4, (3, 4)), [-2.5, 2.5])),
    ("selu", lambda x: autograd.selu(x, 1.5, 1.1), lambda x: 1.1 * np.where(x > 0, x, 1.5 * np.expm1(x)),
     lambda r: away_from(r.normal(size=(3, 4)), [0])),
    ("reciprocal", autograd.reciprocal, lambda x: 1 / x, lambda r: r.uniform(0.5, 2, (3, 4))),
    ("erf", autograd.erf, np.vectorize(math.erf), lambda r: r.uniform(-2, 2, (3, 4))),
]


@pytest.mark.parametrize("name,fn,ref,gen", UNARY, ids=[u[0] for u in UNARY])
def test_unary_math_forward_and_gradient(name, fn, ref, gen):
    rng = np.random.default_rng(len(name))
    a = gen(rng)
    y = check_grads(fn, [a], rng)
    np.testing.assert_allclose(npy(y), ref(a), rtol=1e-10, atol=1e-12)


def test_step_functions_round_as_singa_and_have_zero_gradient():
    a = np.array([-2.5, -1.5, -0.4, 0.5, 1.5, 2.5, 3.7])
    for fn, want in ((autograd.round, [-3, -2, -0, 1, 2, 3, 4]),  # halves away from zero
                     (autograd.rounde, [-2, -2, -0, 0, 2, 2, 4]),  # halves to even
                     (autograd.ceil, np.ceil(a)), (autograd.floor, np.floor(a)), (autograd.sign, np.sign(a))):
        x = param(a)
        y = fn(x)
        np.testing.assert_array_equal(npy(y), want)
        np.testing.assert_array_equal(npy(autograd.gradients(y)[x]), np.zeros_like(a))


def test_prelu_broadcasts_the_slope_and_learns_it():
    rng = np.random.default_rng(1)
    x = away_from(rng.normal(size=(2, 3, 4)), [0])
    slope = rng.uniform(0.1, 0.5, (3, 1))
    y = check_grads(autograd.prelu, [x, slope], rng)
    np.testing.assert_allclose(npy(y), np.where(x >= 0, x, slope * x))


def test_comparisons_and_logic_give_zero_one_in_the_input_dtype():
    a = np.array([[-1.0, 0.0, 2.0], [3.0, 0.0, -4.0]], np.float32)
    b = np.array([0.0, 0.0, 2.0], np.float32)  # broadcast
    ta, tb = const(a, np.float32), const(b, np.float32)
    for fn, ref in ((autograd.less, np.less), (autograd.greater, np.greater), (autograd.equal, np.equal),
                    (autograd._and, np.logical_and), (autograd._or, np.logical_or),
                    (autograd._xor, np.logical_xor)):
        y = fn(ta, tb)
        assert y.dtype == tensor.float32 and y.shape == (2, 3)
        np.testing.assert_array_equal(npy(y), ref(a, b).astype(np.float32))
    np.testing.assert_array_equal(npy(autograd._not(ta)), np.logical_not(a).astype(np.float32))
    x = param(a)
    assert not npy(autograd.gradients(autograd.greater(x, const(b)))[x]).any()


def test_max_and_min_of_several_inputs_route_the_gradient_to_the_winner():
    rng = np.random.default_rng(2)
    a, b, c = rng.normal(size=(3, 4)), rng.normal(size=(4,)), rng.normal(size=(3, 1))
    y = check_grads(autograd.max, [a, b, c], rng)
    np.testing.assert_allclose(npy(y), np.maximum(np.maximum(a, b), c))
    y = check_grads(autograd.min, [a, b, c], rng)
    np.testing.assert_allclose(npy(y), np.minimum(np.minimum(a, b), c))
    x0, x1 = param([1.0, 2.0, 3.0]), param([1.0, 5.0, 0.0])  # a tie goes to the first input, as SINGA
    g = autograd.gradients(autograd.max(x0, x1))
    np.testing.assert_array_equal(npy(g[x0]), [1, 0, 1])
    np.testing.assert_array_equal(npy(g[x1]), [0, 1, 0])
    x = param([3.0, 1.0])
    assert np.array_equal(npy(autograd.gradients(autograd.max(x))[x]), [1, 1])


def test_where_and_cossim():
    rng = np.random.default_rng(3)
    cond = [[True, False, True], [False, False, True]]
    a, b = rng.normal(size=(2, 3)), rng.normal(size=(2, 3))
    y = check_grads(lambda x, z: autograd.where(x, z, cond), [a, b], rng)
    np.testing.assert_allclose(npy(y), np.where(cond, a, b))
    a, b = rng.normal(size=(4, 5)), rng.normal(size=(4, 5))
    y = check_grads(autograd.cossim, [a, b], rng)
    want = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    np.testing.assert_allclose(npy(y), want)
    with pytest.raises(ValueError, match="cossim"):
        autograd.cossim(const(a), const(b[:, :3]))


# ---------------------------------------------------------------- shapes and indexing
SHAPE_CASES = [  # (name, autograd function, numpy reference, input shape)
    ("squeeze", lambda x: autograd.squeeze(x, [1, 3]), lambda x: x.reshape(3, 2, 1), (3, 1, 2, 1, 1)),
    ("squeeze_all", lambda x: autograd.squeeze(x), lambda x: x.reshape(3, 2), (3, 1, 2, 1)),
    ("unsqueeze", lambda x: autograd.unsqueeze(x, [0, 4]), lambda x: x.reshape(1, 2, 3, 1, 1),
     (2, 3, 1)),
    ("expand", lambda x: autograd.expand(x, [2, 1, 4]), lambda x: x * np.ones((2, 1, 4)), (3, 1)),
    ("tile", lambda x: autograd.tile(x, [2, 1, 3]), lambda x: np.tile(x, [2, 1, 3]), (2, 3)),
    ("upsample", lambda x: autograd.upsample(x, "nearest", [1, 1, 2, 3]),
     lambda x: x.repeat(2, axis=2).repeat(3, axis=3), (1, 2, 2, 2)),
    ("pad_constant", lambda x: autograd.pad(x, "constant", [0, 2, 1, 0], 0.5),
     lambda x: np.pad(x, [(0, 1), (2, 0)], constant_values=0.5), (3, 2)),
    ("pad_reflect", lambda x: autograd.pad(x, "reflect", [1, 2, 1, 1]),
     lambda x: np.pad(x, [(1, 1), (2, 1)], mode="reflect"), (3, 4)),
    ("pad_edge", lambda x: autograd.pad(x, "edge", [0, 2, 2, 0]),
     lambda x: np.pad(x, [(0, 2), (2, 0)], mode="edge"), (3, 2)),
    ("gather", lambda x: autograd.gather(x, 1, [[0, 2], [2, -1]]), lambda x: np.take(x, [[0, 2], [2, -1]], 1),
     (2, 4, 2)),
    ("depth_to_space_dcr", lambda x: autograd.depth_to_space(x, 2, "DCR"), None, (1, 8, 2, 3)),
    ("space_to_depth_crd", lambda x: autograd.space_to_depth(x, 2, "CRD"), None, (1, 2, 4, 6)),
]


@pytest.mark.parametrize("name,fn,ref,shape", SHAPE_CASES, ids=[c[0] for c in SHAPE_CASES])
def test_shape_ops_forward_and_gradient(name, fn, ref, shape):
    rng = np.random.default_rng(len(name) + 10)
    a = rng.normal(size=shape)
    y = check_grads(fn, [a], rng)
    if ref is not None:
        np.testing.assert_array_equal(npy(y), ref(a))


def test_depth_to_space_follows_onnx_and_space_to_depth_inverts_it():
    x = np.arange(1 * 8 * 2 * 3, dtype=np.float64).reshape(1, 8, 2, 3)
    b = 2
    dcr = x.reshape(1, b, b, 2, 2, 3).transpose(0, 3, 4, 1, 5, 2).reshape(1, 2, 4, 6)  # ONNX's definition
    crd = x.reshape(1, 2, b, b, 2, 3).transpose(0, 1, 4, 2, 5, 3).reshape(1, 2, 4, 6)
    for mode, want in (("DCR", dcr), ("CRD", crd)):
        y = autograd.depth_to_space(const(x), b, mode)
        np.testing.assert_array_equal(npy(y), want)
        np.testing.assert_array_equal(npy(autograd.space_to_depth(y, b, mode)), x)


def test_scatter_elements_and_its_gradient():
    data = np.zeros((3, 3))
    idx = np.array([[1, 0, 2], [0, 2, 1]])
    upd = np.array([[1.0, 1.1, 1.2], [2.0, 2.1, 2.2]])
    x = param(data)
    y = autograd.scatter_elements(x, const(idx, np.int32), const(upd))
    np.testing.assert_allclose(npy(y), [[2.0, 1.1, 0.0], [1.0, 0.0, 2.2], [0.0, 2.1, 1.2]])
    g = npy(autograd.gradients(y)[x])  # overwritten places get no gradient
    np.testing.assert_array_equal(g, [[0, 0, 1], [0, 1, 0], [1, 0, 0]])
    y = autograd.scatter_elements(const([[1.0, 2, 3, 4, 5]]), [[1, -2]], [[1.1, 2.1]], axis=1)
    np.testing.assert_allclose(npy(y), [[1.0, 1.1, 3.0, 2.1, 5.0]])
    with pytest.raises(IndexError, match="scatter_elements"):
        autograd.scatter_elements(const(data), [[3, 0, 0]], [[1.0, 1.0, 1.0]])


def test_integer_valued_ops():
    x = const([[1.0, 0.0], [1.0, 1.0]], np.float32)
    np.testing.assert_array_equal(npy(autograd.nonzero(x)), np.array(np.nonzero(npy(x))))
    np.testing.assert_array_equal(npy(autograd.shape(const(np.zeros((4, 3, 2))))), [4, 3, 2])
    c = autograd.constant_of_shape(const([4, 3], np.int64), 1.5)
    assert c.shape == (4, 3) and c.dtype == tensor.float32 and (npy(c) == 1.5).all()
    assert autograd.constant_of_shape(const([2], np.int64), 3).dtype == tensor.int32
    hot = autograd.onehot(1, const([[1, 9], [2, -1]], np.float32), [10], [1.0, 3.0])
    want = np.ones((2, 10, 2), np.float32)
    for i, j, k in ((0, 1, 0), (0, 9, 1), (1, 2, 0), (1, 9, 1)):
        want[i, j, k] = 3.0
    np.testing.assert_array_equal(npy(hot), want)


def test_shape_op_errors_are_clear():
    x = const(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="squeeze: axis 1 is not a size-1 axis"):
        autograd.squeeze(x, [1])
    with pytest.raises(ValueError, match="expand"):
        autograd.expand(x, [4, 2])
    with pytest.raises(IndexError, match="gather"):
        autograd.gather(x, 1, [0, 3])
    with pytest.raises(ValueError, match="pad: expected 4"):
        autograd.pad(x, "constant", [1, 1])
    with pytest.raises(ValueError, match="pad: mode"):
        autograd.pad(x, "wrap", [0, 0, 0, 0])
    with pytest.raises(ValueError, match="upsample"):
        autograd.upsample(x, "linear", [1, 2])


def test_gemm_and_embedding_operators():
    rng = np.random.default_rng(4)
    a, b, c = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(1, 5))
    y = check_grads(lambda A, B, C: autograd.gemm(A, B, C, 0.5, 2.0, 0, 1), [a, b, c], rng)
    np.testing.assert_allclose(npy(y), 0.5 * a @ b.T + 2.0 * c)
    y = check_grads(lambda A, B: autograd.gemm(A, B, None, 1.5, 1.0, 1, 0), [a.T.copy(), b.T.copy()], rng)
    np.testing.assert_allclose(npy(y), 1.5 * a @ b.T)
    w = param(rng.normal(size=(6, 3)))
    ids = const([[0, 5, 5], [2, 0, 1]], np.int32)
    y = autograd.embedding(ids, w)
    np.testing.assert_allclose(npy(y), npy(w)[npy(ids)])
    dw = npy(autograd.gradients(y)[w])
    np.testing.assert_array_equal(dw[:, 0], [2, 1, 1, 0, 0, 2])  # repeated ids accumulate
    with pytest.raises(IndexError, match="embedding"):
        autograd.embedding(const([6], np.int32), w)


# ---------------------------------------------------------------- losses: SINGA's shape (1,) and conventions
def test_losses_have_shape_1_as_singa():
    x = param(np.random.default_rng(5).normal(size=(4, 3)))
    labels = const([0, 2, 1, 2], np.int32)
    for loss in (autograd.softmax_cross_entropy(x, labels), autograd.mse_loss(x, const(np.zeros((4, 3)))),
                 autograd.cross_entropy(autograd.softmax(x), labels),
                 autograd.binary_cross_entropy(autograd.sigmoid(x), const(np.ones((4, 3)))),
                 autograd.ranking_loss(x, const(np.zeros((4, 3))))):
        assert loss.shape == (1,)
        v = npy(loss)[0]  # what SINGA scripts write
        assert float(loss) == v == loss.item()


def test_full_reduction_without_keepdims_has_shape_1():
    rng = np.random.default_rng(12)
    a = rng.normal(size=(3, 4))
    y = check_grads(lambda x: autograd.reduce_sum(x, None, 0), [a], rng)
    assert y.shape == (1,)
    np.testing.assert_allclose(npy(y), [a.sum()])
    y = check_grads(lambda x: autograd.reduce_mean(x, [0, 1], 0), [a], rng)
    assert y.shape == (1,)
    assert autograd.reduce_sum(const(a)).shape == (1, 1)  # keepdims=1 (the default) keeps every axis


def test_mse_loss_is_the_element_mean_and_backward_takes_no_dy():
    rng = np.random.default_rng(6)
    y, t = rng.random((10, 12)).astype(np.float32), rng.random((10, 12)).astype(np.float32)
    loss = autograd.mse_loss(tensor.from_numpy(y), tensor.from_numpy(t))  # requires_grad, not parameters
    np.testing.assert_allclose(npy(loss), [np.mean((y - t) ** 2)], rtol=1e-5)
    dx = loss.creator.backward()  # SINGA's scripts call backward() without dy; one gradient comes back
    np.testing.assert_allclose(np.asarray(dx), 2 * (y - t) / y.size, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(np.asarray(loss.creator.backward(0.5)), (y - t) / y.size, rtol=1e-5, atol=1e-8)
    x = param(rng.normal(size=(3, 4)))  # the target may broadcast to the prediction's shape
    check_grads(lambda p: autograd.mse_loss(p, const(np.arange(4.0))), [npy(x)], rng)


def test_binary_cross_entropy_and_ranking_loss():
    rng = np.random.default_rng(7)
    p, t = rng.uniform(0.1, 0.9, (4, 3)), (rng.random((4, 3)) > 0.5).astype(np.float64)
    y = check_grads(lambda q: autograd.binary_cross_entropy(q, const(t)), [p], rng)
    np.testing.assert_allclose(npy(y), [-(t * np.log(p) + (1 - t) * np.log(1 - p)).sum() / 4])
    pos, neg = rng.normal(size=(5,)), rng.normal(size=(5,))
    y = check_grads(lambda a, b: autograd.ranking_loss(a, b, 0.3), [pos, neg], rng)
    np.testing.assert_allclose(npy(y), [np.maximum(0, neg - pos + 0.3).sum() / 5])


def test_bad_loss_arguments_raise_assertion_error_as_singa_and_value_error():
    _2d, _3d, _1d = const(np.zeros((10, 10))), const(np.zeros((10, 10, 10))), const(np.zeros(10))
    for call in (lambda: autograd.softmax_cross_entropy(_2d, _3d), lambda: autograd.mse_loss(_2d, _3d),
                 lambda: autograd.add_bias(_2d, _1d, 3), lambda: autograd.ranking_loss(_2d, _1d)):
        with pytest.raises(AssertionError):
            call()
        with pytest.raises(ValueError):
            call()


# ---------------------------------------------------------------- op.backward(dy) called directly
def test_direct_backward_accepts_another_float_dtype_and_computes_every_gradient():
    x = Tensor(data=np.ones((2, 3), np.float32))  # requires_grad (the default), so the op is recorded
    w = Tensor(data=np.full((1, 3), 2.0, np.float32))
    y = autograd.mul(x, w)
    dx, dw = y.creator.backward(const(np.ones((2, 3)), np.float64).data)  # a float64 dy
    assert dx.dtype == tensor.float32 and np.asarray(dw).tolist() == [[2.0, 2.0, 2.0]]
    conv = layer.Conv2d(2, 2)
    out = conv(const(np.ones((1, 3, 3, 3)), np.float32))
    dx, dW, db = out.creator.backward(const(np.ones((1, 2, 2, 2)), np.float32).data)
    assert dx.shape == (1, 3, 3, 3) and dW.shape == (2, 3, 2, 2) and np.asarray(db).tolist() == [4.0, 4.0]


def test_globalaveragepool_channels_last():
    rng = np.random.default_rng(8)
    a = rng.normal(size=(2, 3, 4, 5))
    y = check_grads(lambda x: autograd.globalaveragepool(x, "channels_last"), [a], rng)
    np.testing.assert_allclose(npy(y), a.mean((1, 2), keepdims=True))
    y = check_grads(autograd.globalaveragepool, [a[..., 0]], rng)  # any rank >= 3, channels first
    np.testing.assert_allclose(npy(y), a[..., 0].mean(2, keepdims=True))
    with pytest.raises(ValueError, match="data_format"):
        autograd.globalaveragepool(const(a), "NHWC")


# ---------------------------------------------------------------- layers: RNN, LSTM, Gemm, Embedding
def _np_sigmoid(z):
    return 1 / (1 + np.exp(-z))


def test_rnn_matches_the_recurrence_and_its_gradients_are_exact():
    rng = np.random.default_rng(9)
    xs = [rng.normal(size=(2, 3)) for _ in range(3)]
    h0 = np.zeros((2, 2))
    rnn = layer.RNN(3, 2)
    hs, h = rnn([const(x, np.float32) for x in xs], const(h0, np.float32))
    p = {k: npy(v).astype(np.float64) for k, v in rnn.get_params().items()}
    assert sorted(p) == ["Wh", "Wx", "b"]
    want = h0
    for x, got in zip(xs, hs):
        want = np.tanh(x @ p["Wx"] + want @ p["Wh"] + p["b"])
        np.testing.assert_allclose(npy(got), want, rtol=1e-5, atol=1e-6)
    assert h is hs[-1]
    # gradients of every parameter against finite differences (float64 copies of the parameters)
    names = ["Wx", "Wh", "b"]

    def run(wx, wh, b):
        h = const(h0)
        total = None
        for x in xs:
            h = rnn.step_forward(const(x), h, wx, wh, b)
            total = h if total is None else autograd.add(total, h)
        return total
    check_grads(run, [p[n] for n in names], rng, tol=1e-5)


def test_lstm_matches_the_recurrence():
    rng = np.random.default_rng(10)
    xs = [rng.normal(size=(2, 3)).astype(np.float32) for _ in range(2)]
    h0, c0 = np.zeros((2, 4), np.float32), rng.normal(size=(2, 1)).astype(np.float32)  # c0 broadcasts
    lstm = layer.LSTM(3, 4)
    hs, h, c = lstm([const(x, np.float32) for x in xs], (const(h0, np.float32), const(c0, np.float32)))
    p = {k: npy(v) for k, v in lstm.get_params().items()}
    assert len(p) == 16 and p["Wx_i"].shape == (3, 4) and p["Bh_g"].shape == (4,)
    hh, cc = h0, c0
    for x, got in zip(xs, hs):
        gate = {g: x @ p[f"Wx_{g}"] + p[f"Bx_{g}"] + hh @ p[f"Wh_{g}"] + p[f"Bh_{g}"] for g in "ifog"}
        cc = _np_sigmoid(gate["f"]) * cc + _np_sigmoid(gate["i"]) * np.tanh(gate["g"])
        hh = _np_sigmoid(gate["o"]) * np.tanh(cc)
        np.testing.assert_allclose(npy(got), hh, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(npy(c), cc, rtol=1e-5, atol=1e-6)
    loss = autograd.softmax_cross_entropy(hs[-1], const(np.eye(4)[[0, 3]], np.float32))
    grads = dict(autograd.backward(loss))
    assert {g.shape for g in grads.values()} == {(3, 4), (4, 4), (4,)} and len(grads) == 16


def test_rnn_refuses_what_it_does_not_implement():
    with pytest.raises(NotImplementedError, match="bidirectional"):
        layer.RNN(3, 2, bidirectional=True)
    with pytest.raises(NotImplementedError, match="num_layers"):
        layer.LSTM(3, 2, num_layers=2)
    with pytest.raises(ValueError, match="nonlinearity"):
        layer.RNN(3, 2, nonlinearity="gelu")
    with pytest.raises(TypeError, match="list"):
        layer.RNN(3, 2)(const(np.zeros((2, 3))), const(np.zeros((2, 2))))


def test_gemm_and_embedding_layers():
    rng = np.random.default_rng(11)
    a = rng.normal(size=(3, 4)).astype(np.float32)
    gemm = layer.Gemm(5, 0.5, 2.0, False, True)
    y = gemm(const(a, np.float32))
    W, b = npy(gemm.get_params()["W"]), npy(gemm.get_params()["b"])
    assert W.shape == (5, 4) and b.shape == (1, 5)
    np.testing.assert_allclose(npy(y), 0.5 * a @ W.T + 2.0 * b, rtol=1e-5)
    with pytest.raises(ValueError, match="Gemm: expects 4 input features"):
        gemm(const(np.zeros((3, 6)), np.float32))
    emb = layer.Embedding(10, 3)
    y = emb(const([[0, 1, 2, 3], [9, 8, 7, 6]], np.int32))
    assert y.shape == (2, 4, 3)
    np.testing.assert_array_equal(npy(y)[1, 0], npy(emb.W)[9])
    emb2 = layer.Embedding(4, 2)
    emb2.from_pretrained(np.arange(8.0).reshape(4, 2).astype(np.float32), freeze=True)
    np.testing.assert_array_equal(npy(emb2(const([3], np.int32))), [[6.0, 7.0]])
    assert emb2.get_params() == {}  # frozen: not trained


# ---------------------------------------------------------------- SINGA's odd_padding (SAME_UPPER / SAME_LOWER)
ODD = [  # (name, function of (x, W) or (x,), reference built from numpy padding)
    ("conv2d", lambda x, w: autograd.conv2d(x, w, None, 1, (0, 1), odd_padding=(1, 0, 0, 1)),
     lambda x, w: autograd.conv2d(const(np.pad(x, [(0, 0), (0, 0), (1, 0), (1, 2)])), const(w), None, 1, 0)),
    ("avg_pool2d", lambda x: autograd.avg_pool2d(x, (2, 3), 1, (0, 1), True, odd_padding=(1, 0, 0, 1)),
     lambda x: autograd.avg_pool2d(const(np.pad(x, [(0, 0), (0, 0), (1, 0), (1, 2)])), (2, 3), 1, 0)),
    ("max_pool2d", lambda x: autograd.max_pool2d(x, (2, 2), 1, 0, odd_padding=(0, 1, 1, 0)),
     lambda x: autograd.max_pool2d(const(np.pad(x, [(0, 0), (0, 0), (0, 1), (1, 0)], constant_values=-1e9)),
                                   (2, 2), 1, 0)),
]


@pytest.mark.parametrize("name,fn,ref", ODD, ids=[o[0] for o in ODD])
def test_odd_padding_pads_one_side_more(name, fn, ref):
    rng = np.random.default_rng(13)
    arrays = [rng.normal(size=(2, 2, 4, 5))] + ([rng.normal(size=(3, 2, 2, 3))] if name == "conv2d" else [])
    y = check_grads(fn, arrays, rng)
    np.testing.assert_allclose(npy(y), npy(ref(*arrays)), rtol=1e-12, atol=1e-12)


def test_avg_pool_odd_padding_without_counting_pads():
    rng = np.random.default_rng(14)
    a = rng.normal(size=(1, 2, 3, 4))
    y = check_grads(lambda x: autograd.avg_pool2d(x, 2, 1, 0, False, odd_padding=(1, 0, 1, 0)), [a], rng)
    xp = np.pad(a, [(0, 0), (0, 0), (1, 0), (1, 0)])
    mp = np.pad(np.ones((3, 4)), [(1, 0), (1, 0)])
    want = np.array([[[[xp[0, c, i:i + 2, j:j + 2].sum() / mp[i:i + 2, j:j + 2].sum() for j in range(4)]
                       for i in range(3)] for c in range(2)]])
    np.testing.assert_allclose(npy(y), want)
    with pytest.raises(ValueError, match="odd_padding"):
        autograd.max_pool2d(const(a), 2, odd_padding=(1, 0))


def test_singa_helpers_axis_helper_back_broadcast_add_all_ctensor2numpy():
    assert autograd.axis_helper((2, 3, 4), (3, 1)) == (0, 2)
    assert autograd.axis_helper((2, 3), (2, 3)) == ()
    g = autograd.back_broadcast((2, 3, 4), (3, 1), const(np.ones((2, 3, 4))).data)
    np.testing.assert_array_equal(np.asarray(g), np.full((3, 1), 8.0))
    a, b, c = param([1.0, 2.0]), param([3.0, 4.0]), param([[10.0], [20.0]])
    y = autograd.add_all(a, b, c)
    np.testing.assert_array_equal(npy(y), [[14.0, 16.0], [24.0, 26.0]])
    assert npy(autograd.gradients(y)[c]).tolist() == [[2.0], [2.0]]
    with pytest.raises(ValueError, match="add_all"):
        autograd.add_all(a)
    arr = autograd.ctensor2numpy(a.data)
    arr[0] = 99.0  # a copy
    assert npy(a)[0] == 1.0


def test_integer_valued_ops_inside_a_graph_pass_a_zero_gradient():
    x = Tensor(data=np.ones((2, 3), np.float32), requires_grad=True, stores_grad=True)
    y = autograd.add(x, autograd.constant_of_shape(autograd.shape(x), 1.0))  # shape(x) feeds a graph
    y = autograd.add(y, autograd.mul(x, x))
    np.testing.assert_array_equal(npy(autograd.gradients(y)[x]), np.full((2, 3), 3.0))
    assert autograd.shape(x).creator.backward(const(np.zeros(5)).data) == [5]  # SINGA's direct call


# ---------------------------------------------------------------- SINGA's handle spellings
def test_conv_pooling_and_batchnorm_with_singa_handles():
    from singa_lite import singa_wrap
    rng = np.random.default_rng(15)
    a, w, b = rng.normal(size=(2, 3, 5, 6)), rng.normal(size=(4, 3, 3, 3)), rng.normal(size=(4,))
    x = const(a)
    h = singa_wrap.ConvHandle(x.data, (3, 3), (2, 1), (1, 0), 3, 4, True)
    y = autograd.conv2d(h, x, const(w), const(b), (0, 1, 0, 0))
    want = autograd.conv2d(x, const(w), const(b), (2, 1), (1, 0), odd_padding=(0, 1, 0, 0))
    np.testing.assert_allclose(npy(y), npy(want))
    with pytest.raises(ValueError, match="kernel"):
        autograd.conv2d(h, x, const(w[:, :, :2]))
    ph = singa_wrap.PoolingHandle(x.data, (2, 2), (2, 2), (1, 1), False)  # average without the padding
    np.testing.assert_allclose(npy(autograd.pooling_2d(ph, x)), npy(autograd.avg_pool2d(x, 2, 2, 1, False)))
    ph = singa_wrap.PoolingHandle(x.data, (3, 3), (1, 1), (0, 0), True)
    np.testing.assert_allclose(npy(autograd.pooling_2d(ph, x)), npy(autograd.max_pool2d(x, 3, 1, 0)))
    with pytest.raises(TypeError, match="PoolingHandle"):
        autograd.pooling_2d(h, x)
    bh = singa_wrap.BatchNormHandle(0.25, x.data)
    rm, rv = const(np.zeros(3)), const(np.ones(3))
    scale, bias = const(np.ones(3)), const(np.zeros(3))
    y = autograd.batchnorm_2d(bh, x, scale, bias, rm, rv)  # training mode: batch statistics, running updated
    mean = a.mean((0, 2, 3))
    np.testing.assert_allclose(npy(y), (a - mean[:, None, None]) / np.sqrt(a.var((0, 2, 3)) + 1e-5)[:, None, None],
                               rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(npy(rm), 0.25 * mean)
