"""The autograd engine: graph recording, the backward generator (dependency counting, early yields,
accumulation, memory release), losses against numpy, dropout, errors and the Layer classes."""
import gc
import weakref

import numpy as np
import pytest

from singa_lite import _core, autograd, device, tensor


pytestmark = pytest.mark.usefixtures("training")


def param(a, name=None, dtype=np.float64):
    return tensor.Tensor(data=np.asarray(a, dtype), requires_grad=True, stores_grad=True, name=name)


def data(a, dtype=None):
    a = np.asarray(a) if dtype is None else np.asarray(a, dtype)
    return tensor.Tensor(data=a, requires_grad=False)


def npy(t):
    return tensor.to_numpy(t)


# ---------------------------------------------------------------- recording
def test_operator_call_records_graph_in_training():
    w = param(np.ones((2, 2)))
    x = data(np.ones((3, 2)))
    (y,) = autograd.Matmul()(x, w)
    assert isinstance(y.creator, autograd.Matmul) and y.requires_grad and not y.stores_grad
    assert y.creator.src == [None, (w, 0)]  # data gets no edge, the parameter a leaf edge


def test_nothing_recorded_when_not_training():
    autograd.training = False
    w = param(np.ones((2, 2)))
    op = autograd.ReLU()
    (y,) = op(autograd.matmul(data(np.ones((3, 2))), w))
    assert y.creator is None and not hasattr(op, "src")
    ref = weakref.ref(op)
    del op
    gc.collect()
    assert ref() is None  # nothing keeps the operator (and what it cached) alive
    with pytest.raises(ValueError, match="training = True"):
        autograd.gradients(autograd.reduce_sum(y))


def test_no_graph_without_any_input_requiring_grad():
    x = data(np.ones((2, 2)))
    y = autograd.relu(x)
    assert y.creator is None and not y.requires_grad


# ---------------------------------------------------------------- the generator
def mlp(rng, sizes=(6, 5, 4, 3)):
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append((param(rng.standard_normal((a, b)) * 0.5, f"W{i}"), param(rng.standard_normal(b) * 0.1, f"b{i}")))
    return layers


def mlp_loss(layers, x, t):
    h = x
    for i, (w, b) in enumerate(layers):
        h = autograd.add_bias(autograd.matmul(h, w), b)
        if i < len(layers) - 1:
            h = autograd.relu(h)
    return autograd.softmax_cross_entropy(h, t)


def np_mlp_loss(arrays, x, labels):
    h = x
    for i in range(0, len(arrays), 2):
        h = h @ arrays[i] + arrays[i + 1]
        if i < len(arrays) - 2:
            h = np.maximum(h, 0)
    s = h - h.max(1, keepdims=True)
    logp = s - np.log(np.exp(s).sum(1, keepdims=True))
    return -logp[np.arange(len(labels)), labels].mean()


def test_generator_yields_each_param_once_last_layer_first(monkeypatch):
    rng = np.random.default_rng(1)
    layers = mlp(rng)
    x = data(rng.standard_normal((8, 6)))
    t = data(rng.integers(0, 3, 8).astype(np.int32))
    events = []
    real = autograd.Matmul.backward

    def spy(self, dy):
        events.append(("matmul_backward", self.b.shape))
        return real(self, dy)

    monkeypatch.setattr(autograd.Matmul, "backward", spy)
    loss = mlp_loss(layers, x, t)
    for p, g in autograd.backward(loss):
        assert g.shape == p.shape
        events.append(("yield", p.name))
    names = [e[1] for e in events if e[0] == "yield"]
    assert sorted(names) == sorted(f"{k}{i}" for i in range(3) for k in "Wb")  # each exactly once
    assert names == ["b2", "W2", "b1", "W1", "b0", "W0"]
    # the last layer's gradients come out before the first layer's backward has even run
    first_layer_backward = events.index(("matmul_backward", (6, 5)))
    assert events.index(("yield", "W2")) < first_layer_backward
    assert events.index(("yield", "b1")) < first_layer_backward


def test_mlp_gradients_match_finite_differences():
    rng = np.random.default_rng(2)
    layers = mlp(rng)
    xa, labels = rng.standard_normal((5, 6)), rng.integers(0, 3, 5)
    grads = autograd.gradients(mlp_loss(layers, data(xa), data(labels.astype(np.int64))))
    arrays = [npy(p) for pair in layers for p in pair]
    for k, p in enumerate(p for pair in layers for p in pair):
        num = np.zeros_like(arrays[k])
        for idx in np.ndindex(num.shape):
            for sign in (1, -1):
                moved = [a.copy() for a in arrays]
                moved[k][idx] += sign * 1e-6
                num[idx] += sign * np_mlp_loss(moved, xa, labels) / 2e-6
        np.testing.assert_allclose(npy(grads[p]), num, rtol=1e-5, atol=1e-6)


def test_param_used_twice_accumulates():
    wa = np.array([[1.0, -2.0], [0.5, 3.0]])
    w = param(wa)
    x = data(np.array([[1.0, 2.0]]))
    # sum(x@w + w*w): x@w (1, 2) is broadcast over w*w's 2 rows, so d/dw = 2 * x.T + 2 * w
    y = autograd.reduce_sum(autograd.add(autograd.matmul(x, w), autograd.mul(w, w)))
    g = autograd.gradients(y)[w]
    np.testing.assert_allclose(npy(g), 2 * np.array([[1.0], [2.0]]) + 2 * wa)


def test_diamond_graph_accumulates():
    # h = relu(x w); y = sum(h * h + sigmoid(h)): h feeds three consumers, w gets one final gradient
    rng = np.random.default_rng(3)
    xa, wa = rng.standard_normal((4, 3)), rng.standard_normal((3, 2))
    w = param(wa)
    h = autograd.relu(autograd.matmul(data(xa), w))
    y = autograd.reduce_sum(autograd.add(autograd.mul(h, h), autograd.sigmoid(h)))
    out = list(autograd.backward(y))
    assert [p for p, _ in out] == [w]
    hn = np.maximum(xa @ wa, 0)
    s = 1 / (1 + np.exp(-hn))
    dh = (2 * hn + s * (1 - s)) * (hn > 0)
    np.testing.assert_allclose(npy(out[0][1]), xa.T @ dh, rtol=1e-12)


def test_shared_intermediate_and_two_params_on_one_op():
    a, b = param([1.0, 2.0]), param([3.0, 4.0])
    s = autograd.add(a, b)
    y = autograd.reduce_sum(autograd.mul(s, s))  # sum((a+b)^2)
    g = autograd.gradients(y)
    np.testing.assert_allclose(npy(g[a]), 2 * np.array([4.0, 6.0]))
    np.testing.assert_allclose(npy(g[b]), 2 * np.array([4.0, 6.0]))


def test_yielded_grads_do_not_alias_each_other_or_the_graph():
    # add(a, b) hands the same dy to both inputs; an optimizer updating one gradient in place (weight
    # decay, an in-place all-reduce) as soon as it arrives must not change the other
    a, b = param(np.ones(3)), param(np.ones(3))
    y = autograd.reduce_sum(autograd.mul(autograd.add(a, b), data(np.array([1.0, 2.0, 3.0]))))
    seen = []
    for _p, g in autograd.backward(y):
        np.testing.assert_allclose(npy(g), [1.0, 2.0, 3.0])
        assert not any(g.data.shares_storage(other.data) for other in seen)
        _core.fill_(g.data, 100.0)  # clobber it at once
        seen.append(g)
    assert len(seen) == 2


def test_in_place_update_during_backward_is_safe():
    # an optimizer changes each parameter as soon as its gradient arrives; gradients still match
    rng = np.random.default_rng(4)
    layers = mlp(rng)
    x, t = data(rng.standard_normal((4, 6))), data(rng.integers(0, 3, 4).astype(np.int32))
    ref = {p.name: npy(g) for p, g in autograd.gradients(mlp_loss(layers, x, t)).items()}
    for p, g in autograd.backward(mlp_loss(layers, x, t)):
        np.testing.assert_allclose(npy(g), ref[p.name], rtol=1e-12)
        tensor.axpy(-0.1, g, p)


def test_dy_scales_and_defaults_to_ones():
    w = param([1.0, 2.0])
    y = autograd.mul(w, data([3.0, 5.0]))  # not a scalar: dy defaults to ones
    np.testing.assert_allclose(npy(autograd.gradients(y)[w]), [3.0, 5.0])
    y = autograd.reduce_sum(autograd.mul(w, data([3.0, 5.0])))
    np.testing.assert_allclose(npy(autograd.gradients(y, 2.0)[w]), [6.0, 10.0])
    y = autograd.mul(w, data([3.0, 5.0]))
    with pytest.raises(ValueError, match="dy has shape"):
        autograd.gradients(y, data(np.ones(3)))


def test_graph_is_kept_for_a_second_backward_and_freed_by_the_next_forward():
    w = param(np.ones((3, 2)))
    h = autograd.matmul(data(np.ones((4, 3))), w)
    z = autograd.mul(h, h)
    probe = weakref.ref(z.creator.a)  # the activation Mul cached for its backward; only the graph holds it
    del h
    loss = autograd.reduce_mean(z)
    first = npy(autograd.gradients(loss)[w])
    np.testing.assert_allclose(npy(autograd.gradients(loss)[w]), first)  # SINGA keeps the graph
    autograd.mul(w, w)  # a new recorded forward pass drops the spent graph's state
    gc.collect()
    assert probe() is None
    assert not hasattr(z.creator, "a") and not hasattr(z.creator, "src")
    with pytest.raises(ValueError, match="freed"):
        autograd.gradients(loss)


def test_backward_can_be_called_directly_on_an_operator():
    op = autograd.Mul()
    op(param([1.0, 2.0]), param([3.0, 4.0]))
    da, db = op.backward(tensor.from_numpy(np.ones(2)).data)
    np.testing.assert_allclose(np.asarray(da), [3.0, 4.0])
    np.testing.assert_allclose(np.asarray(db), [1.0, 2.0])


def test_no_parameter_raises():
    x = tensor.from_numpy(np.ones((2, 2)))  # requires_grad=True by default, but not a parameter
    y = autograd.reduce_sum(autograd.relu(x))
    assert y.creator is not None
    with pytest.raises(ValueError, match="does not depend on any parameter"):
        autograd.gradients(y)


def test_branch_without_params_is_skipped(monkeypatch):
    calls = []
    real = autograd.Sigmoid.backward
    monkeypatch.setattr(autograd.Sigmoid, "backward", lambda self, dy: calls.append(1) or real(self, dy))
    w = param([1.0, 2.0])
    side = autograd.sigmoid(tensor.from_numpy(np.ones(2)))  # data only: no parameter behind it
    y = autograd.reduce_sum(autograd.mul(w, side))
    g = autograd.gradients(y)
    assert list(g) == [w] and calls == []


def test_leaf_parameter_as_y():
    w = param([1.0, 2.0])
    assert [(p, npy(g).tolist()) for p, g in autograd.backward(w)] == [(w, [1.0, 1.0])]


def test_multi_output_with_unused_output():
    w = param(np.arange(6.0).reshape(3, 2))
    parts = autograd.split(w, 0, [1, 2])
    assert [p.shape for p in parts] == [(1, 2), (2, 2)]
    g = autograd.gradients(autograd.reduce_sum(parts[1]))[w]
    np.testing.assert_allclose(npy(g), [[0, 0], [1, 1], [1, 1]])


def test_cast_gradient_returns_to_the_source_dtype():
    w = param([1.0, 2.0, 3.0])
    y = autograd.reduce_sum(autograd.mul(autograd.cast(w, tensor.float32), data(np.float32([1, 2, 3]))))
    assert y.dtype == tensor.float32
    g = autograd.gradients(y)[w]
    assert g.dtype == tensor.float64
    np.testing.assert_allclose(npy(g), [1, 2, 3])


# ---------------------------------------------------------------- losses against numpy
def np_sce(x, onehot):
    s = x - x.max(1, keepdims=True)
    logp = s - np.log(np.exp(s).sum(1, keepdims=True))
    return -(onehot * logp).sum() / len(x), (np.exp(logp) * onehot.sum(1, keepdims=True) - onehot) / len(x)


@pytest.mark.parametrize("kind", ["int32_labels", "int64_labels", "float_onehot", "int32_onehot", "soft"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_cross_entropy_matches_numpy(kind, dtype):
    rng = np.random.default_rng(5)
    xa = (rng.standard_normal((6, 5)) * 30).astype(dtype)  # large logits: needs the stable form
    labels = rng.integers(0, 5, 6)
    onehot = np.eye(5)[labels]
    t = {"int32_labels": labels.astype(np.int32), "int64_labels": labels.astype(np.int64),
         "float_onehot": onehot.astype(dtype), "int32_onehot": onehot.astype(np.int32),
         "soft": rng.dirichlet(np.ones(5), 6) * 1.5}[kind]
    target = np.asarray(t, np.float64) if t.ndim == 2 else onehot
    want_loss, want_grad = np_sce(xa.astype(np.float64), target)
    x = param(xa, dtype=dtype)
    loss = autograd.softmax_cross_entropy(x, data(t))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert loss.shape == (1,) and loss.dtype == tensor.to_dtype(dtype)  # SINGA's losses have shape (1,)
    np.testing.assert_allclose(npy(loss)[0], want_loss, rtol=tol)
    np.testing.assert_allclose(npy(autograd.gradients(loss)[x]), want_grad, rtol=tol, atol=tol)


def test_cross_entropy_and_mse_match_numpy():
    rng = np.random.default_rng(6)
    p = rng.dirichlet(np.ones(4), 3)
    onehot = np.eye(4)[[0, 3, 2]]
    y = param(p)
    loss = autograd.cross_entropy(y, data(onehot.astype(np.int32)))
    np.testing.assert_allclose(npy(loss), [-(onehot * np.log(p)).sum() / 3])
    np.testing.assert_allclose(npy(autograd.gradients(loss)[y]), -onehot / p / 3)
    xa, ta = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    x = param(xa)
    loss = autograd.mse_loss(x, data(ta))
    # SINGA's definition: the mean over every element, gradient 2 * (x - t) / size
    np.testing.assert_allclose(npy(loss), [((xa - ta) ** 2).mean()])
    np.testing.assert_allclose(npy(autograd.gradients(loss)[x]), 2 * (xa - ta) / xa.size)


def test_loss_target_errors():
    x = param(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="softmax_cross_entropy: targets must be"):
        autograd.softmax_cross_entropy(x, data(np.zeros((3, 5))))
    with pytest.raises(ValueError, match="expected \\(batch, classes\\)"):
        autograd.softmax_cross_entropy(param(np.zeros(4)), data(np.zeros(4)))
    with pytest.raises(IndexError, match="one_hot"):
        autograd.softmax_cross_entropy(x, data(np.array([0, 1, 7], np.int32)))


# ---------------------------------------------------------------- dropout
def test_dropout_statistics_and_gradient():
    x = param(np.ones((200, 500)), dtype=np.float32)
    y = autograd.dropout(x, 0.3)
    ya = npy(y)
    kept = ya != 0
    assert abs(kept.mean() - 0.7) < 0.01
    np.testing.assert_allclose(ya[kept], 1 / 0.7, rtol=1e-6)
    g = npy(autograd.gradients(autograd.reduce_sum(y))[x])
    np.testing.assert_array_equal(g, ya)  # d(sum(x * mask))/dx = mask


def test_dropout_is_repeatable_with_a_seed():
    x = param(np.ones((50, 50)))
    device.get_default_device().SetRandSeed(7)
    a = npy(autograd.dropout(x, 0.5))
    device.get_default_device().SetRandSeed(7)
    b = npy(autograd.dropout(x, 0.5))
    np.testing.assert_array_equal(a, b)


def test_dropout_is_identity_in_eval():
    autograd.training = False
    x = tensor.from_numpy(np.arange(12.0).reshape(3, 4))
    y = autograd.dropout(x, 0.9)
    np.testing.assert_array_equal(npy(y), npy(x))
    with pytest.raises(ValueError, match="ratio"):
        autograd.dropout(x, 1.0)


# ---------------------------------------------------------------- errors reach the user
def test_shape_and_dtype_errors_are_clear():
    with pytest.raises(ValueError, match=r"Matmul#\d+: matmul: inner dimensions differ"):
        autograd.matmul(param(np.ones((2, 3))), param(np.ones((4, 5))))
    with pytest.raises(ValueError, match="do not broadcast"):
        autograd.add(param(np.ones((2, 3))), param(np.ones(4)))
    with pytest.raises(TypeError, match="dtypes differ"):
        autograd.mul(param(np.ones(3)), param(np.ones(3), dtype=np.float32))
    with pytest.raises(ValueError, match="add_bias"):
        autograd.add_bias(param(np.ones((2, 3))), param(np.ones(2)))
    with pytest.raises(TypeError, match="tensor.Tensor"):
        autograd.relu(np.ones(3))


# ---------------------------------------------------------------- layers
def test_linear_params_init_and_forward():
    device.get_default_device().SetRandSeed(3)
    layer = autograd.Linear(300, 200)
    params = layer.get_params()
    assert list(params) == ["W", "b"]
    W, b = params["W"], params["b"]
    assert W.shape == (300, 200) and b.shape == (200,) and W.dtype == tensor.float32
    assert all(p.stores_grad and p.requires_grad for p in params.values())
    assert W.name.endswith(".W") and b.name.endswith(".b")
    assert abs(npy(W).std() - np.sqrt(2 / 500)) < 0.002 and not npy(b).any()
    xa = np.random.default_rng(0).standard_normal((4, 300)).astype(np.float32)
    np.testing.assert_allclose(npy(layer(data(xa))), xa @ npy(W), rtol=1e-5, atol=1e-5)
    assert "b" not in autograd.Linear(3, 2, bias=False).get_params()


def test_set_params_copies_in_place_and_checks():
    layer = autograd.Linear(2, 3)
    W = layer.W
    layer.set_params({"W": np.arange(6.0).reshape(2, 3)}, b=tensor.from_numpy(np.ones(3, np.float32)))
    assert layer.W is W  # optimizers keyed by parameter keep working
    np.testing.assert_array_equal(npy(W), np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(npy(layer.b), np.ones(3))
    with pytest.raises(KeyError, match="no parameter 'V'"):
        layer.set_params(V=np.ones(1))
    with pytest.raises(ValueError, match="shape"):
        layer.set_params(W=np.ones((3, 2)))


class TwoLayers(autograd.Layer):
    def __init__(self):
        super().__init__()
        self.fc1 = autograd.Linear(4, 3)
        self.fc2 = autograd.Linear(3, 2)

    def forward(self, x):
        return self.fc2(autograd.relu(self.fc1(x)))


def test_nested_layers_train():
    model = TwoLayers()
    assert list(model.get_params()) == ["fc1.W", "fc1.b", "fc2.W", "fc2.b"]
    model.set_params({"fc1": {"b": np.full(3, 0.5)}})
    np.testing.assert_array_equal(npy(model.fc1.b), np.full(3, 0.5, np.float32))
    rng = np.random.default_rng(0)
    x = data(rng.standard_normal((16, 4)).astype(np.float32))
    t = data((npy(x)[:, 0] > 0).astype(np.int32))
    losses = []
    for _ in range(30):
        loss = autograd.softmax_cross_entropy(model(x), t)
        losses.append(npy(loss)[0])
        for p, g in autograd.backward(loss):
            tensor.axpy(-0.5, g, p)
    assert losses[-1] < 0.5 * losses[0]


def test_a_dropped_graph_is_freed_without_a_new_forward():
    w = param(np.ones((3, 2)))
    h = autograd.matmul(data(np.ones((4, 3))), w)
    z = autograd.mul(h, h)
    probe = weakref.ref(z.creator.a)
    del h
    loss = autograd.reduce_mean(z)
    autograd.gradients(loss)
    del z, loss  # nothing refers to the graph any more: its state goes with it
    gc.collect()
    assert probe() is None
