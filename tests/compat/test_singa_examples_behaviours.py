"""The SINGA behaviours that its examples/ tree (beyond examples/cnn) relies on, each as a SINGA-style snippet:
gan/vanilla.py (a second backward over the same graph), rnn/char_rnn.py (a model's initialize() on its first
forward, (N, 1) integer labels, truthy tensors, integer indexing that keeps the axis), healthcare (tile with an
int), singa_peft (in-place operators on the raw tensor), model_selection (a loss operator whose backward reads
``float(dy)``). layer.CudnnRNN is tested in tests/unit/test_cudnn_rnn.py.
"""
import numpy as np
import pytest

from singa_lite import autograd, layer, model, opt, tensor
from singa_lite import singa_wrap as singa


@pytest.fixture(autouse=True)
def _training_off_after():
    yield
    autograd.training = False


def t(a, dtype=np.float32):
    return tensor.from_numpy(np.asarray(a, dtype))


def npy(x):
    return tensor.to_numpy(x)


class _MLP(model.Model):
    def __init__(self):
        super().__init__()
        self.fc1 = layer.Linear(8)
        self.fc2 = layer.Linear(3)

    def forward(self, x):
        return self.fc2(autograd.relu(self.fc1(x)))


def test_gan_second_backward_over_the_same_graph():
    # gan_mlp.py's train_one_batch_dis: apply each gradient, then optimizer(loss) runs a second backward.
    rng = np.random.default_rng(0)
    m = _MLP()
    x, y = t(rng.standard_normal((6, 4))), t(rng.integers(0, 3, 6), np.int32)
    sgd = opt.SGD(lr=0.1)
    m.set_optimizer(sgd)
    autograd.training = True
    loss = autograd.softmax_cross_entropy(m.forward(x), y)
    first = {p.name: npy(g) for p, g in autograd.backward(loss)}
    second = {p.name: npy(g) for p, g in autograd.backward(loss)}
    assert first.keys() == second.keys() and len(first) == 4
    for name in first:
        np.testing.assert_array_equal(first[name], second[name])
    before = {p.name: npy(p) for p in m.get_params().values()}
    for p, g in autograd.backward(loss):
        sgd.apply(p.name, p, g)
    once = {p.name: npy(p) for p in m.get_params().values()}
    sgd(loss)  # the example's line: backward and update once more
    for p in m.get_params().values():
        assert not np.array_equal(npy(p), once[p.name]), p.name  # the second backward reached every parameter
    # the last layer's gradients come from cached activations only, so its two steps are the same step
    for name in ("fc2.W", "fc2.b"):
        np.testing.assert_allclose(npy(m.get_params()[name]), before[name] - 2 * 0.1 * first[name], rtol=1e-5,
                                   atol=1e-6)


class _CharRNN(model.Model):
    """char_rnn.py's shape: states made by the model's own initialize(), called by SINGA on the first forward."""

    def __init__(self, vocab, hidden):
        super().__init__()
        self.rnn = layer.LSTM(vocab, hidden)
        self.dense = layer.Linear(hidden, vocab)
        self.loss = layer.SoftMaxCrossEntropy()
        self.optimizer = opt.SGD(0.5)
        self.hidden = hidden
        self.initialized_with = None

    def initialize(self, inputs):
        self.initialized_with = len(inputs)
        batch = inputs[0].shape[0]
        self.hx = tensor.Tensor((batch, self.hidden))
        self.cx = tensor.Tensor((batch, self.hidden))

    def forward(self, inputs):
        xs, hx, cx = self.rnn(inputs, (self.hx, self.cx))
        self.hx.copy_data(hx)
        self.cx.copy_data(cx)
        x = autograd.cat(xs, 0)
        return self.dense(autograd.reshape(x, (-1, self.hidden)))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, autograd.reshape(y, (-1, 1)))
        self.optimizer(loss)
        return out, loss


def test_char_rnn_model_initializes_on_first_forward_and_trains_on_column_labels():
    rng = np.random.default_rng(1)
    vocab, batch, steps = 5, 4, 3
    seq = rng.integers(0, vocab, (batch, steps + 1))
    onehot = np.eye(vocab, dtype=np.float32)[seq[:, :steps]]  # (batch, steps, vocab)
    inputs = [t(onehot[:, s]) for s in range(steps)]
    labels = t(np.swapaxes(seq[:, 1:], 0, 1).reshape(-1, 1), np.int32)  # (steps * batch, 1) integers
    m = _CharRNN(vocab, 8)
    m.train()
    losses = []
    for _ in range(50):
        out, loss = m(inputs, labels)
        m.hx.set_value(0.0)
        m.cx.set_value(0.0)
        losses.append(npy(loss)[0])  # SINGA's losses are shape-(1,) tensors
    assert m.initialized_with == steps  # initialize(inputs) ran once, with the forward's own argument
    assert losses[-1] < losses[0] * 0.9, losses
    m.eval()
    y = m(inputs)
    loss = autograd.softmax_cross_entropy(y, labels)[0]  # evaluate(): integer indexing keeps the axis
    assert loss.shape == (1,)
    assert np.isfinite(npy(loss)[0])


def test_softmax_cross_entropy_reads_an_integer_column_as_labels():
    rng = np.random.default_rng(2)
    x = t(rng.standard_normal((5, 4)))
    labels = rng.integers(0, 4, 5)
    col = autograd.softmax_cross_entropy(x, t(labels.reshape(-1, 1), np.int32))
    flat = autograd.softmax_cross_entropy(x, t(labels, np.int32))
    onehot = autograd.softmax_cross_entropy(x, t(np.eye(4)[labels]))
    np.testing.assert_allclose(npy(col), npy(flat), rtol=1e-6)
    np.testing.assert_allclose(npy(col), npy(onehot), rtol=1e-6)
    with pytest.raises(ValueError, match=r"\(5, 1\)"):
        autograd.softmax_cross_entropy(x, t(np.zeros((5, 2)), np.int32))


def test_tensors_are_always_true():
    # char_rnn.py's numpy2tensors: `if labels:` asks whether a tensor was passed
    for a in (np.zeros(3), np.zeros((2, 2)), [0.0], [1.0]):
        assert t(a)
    labels = t(np.zeros((4, 1)))
    assert (labels if labels else None) is labels


def test_integer_index_keeps_the_axis_as_singa():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x = t(a)
    assert x[1].shape == (1, 3, 4)
    np.testing.assert_array_equal(npy(x[1]), a[1:2])
    np.testing.assert_array_equal(npy(x[-1, 2]), a[-1:, 2:3])
    np.testing.assert_array_equal(npy(x[0, 1:3]), a[0:1, 1:3])
    np.testing.assert_array_equal(npy(x[:, :, 3]), a[:, :, 3:4])
    with pytest.raises(IndexError, match="out of bounds"):
        x[2]
    assert [r.shape for r in x] == [(1, 3, 4), (1, 3, 4)]  # iteration stops at the end
    x[0] = 5.0  # assignment keeps numpy's rules: it writes the row
    assert (npy(x)[0] == 5.0).all() and (npy(x)[1] == a[1]).all()


def test_tile_with_an_int_repeats_axis_0():
    # healthcare's model: autograd.tile(x, n) stacks n copies along the first axis, as SINGA's Tile does
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = tensor.Tensor((2, 3), requires_grad=True, stores_grad=True)
    w.copy_from_numpy(a)
    autograd.training = True
    y = autograd.tile(w, 3)
    np.testing.assert_array_equal(npy(y), np.tile(a, (3, 1)))
    np.testing.assert_array_equal(npy(autograd.tile(w, [2])), np.tile(a, (2, 1)))
    np.testing.assert_array_equal(npy(autograd.tile(w, [2, 3])), np.tile(a, (2, 3)))
    np.testing.assert_array_equal(npy(autograd.tile(w, [2, 1, 2])), np.tile(a, (2, 1, 2)))
    g = autograd.gradients(autograd.reduce_sum(y))[w]
    np.testing.assert_array_equal(npy(g), np.full((2, 3), 3.0))


def test_raw_tensor_in_place_operators():
    # singa_peft's LoRA merge: self.base_layer.W.data += delta.data (and -= to unmerge)
    W = t(np.ones((2, 3)))
    delta = t(np.full((2, 3), 0.25))
    raw, view = W.data, W[0:1]
    W.data += delta.data
    assert W.data is raw
    np.testing.assert_array_equal(npy(W), np.full((2, 3), 1.25))
    np.testing.assert_array_equal(npy(view), np.full((1, 3), 1.25))  # in place: views see it
    W.data -= delta.data
    W.data *= 4.0
    W.data /= 2
    W.data -= 1
    np.testing.assert_array_equal(npy(W), np.ones((2, 3)))
    with pytest.raises(TypeError, match="pass its .data"):
        W.data += delta


class _SumLoss(autograd.Operator):
    """model_selection's SumError, SINGA's way: the loss is the sum of x; backward scales ones by float(dy)."""

    def forward(self, x):
        self.x_shape = x.shape()
        return singa.SumAll(x)

    def backward(self, dy=1.0):
        dx = tensor.Tensor(self.x_shape)
        dx.copy_from_numpy(np.ones(self.x_shape, dtype=np.float32))
        dx.data *= float(dy)  # SINGA hands the root operator dy = 1.0, a float
        return dx.data


def test_a_root_loss_operator_reads_its_dy_as_a_float():
    rng = np.random.default_rng(5)
    x = t(rng.standard_normal((4, 3)))
    w = t(rng.standard_normal((3, 2)))
    w.requires_grad = w.stores_grad = True
    autograd.training = True
    loss = _SumLoss()(autograd.matmul(x, w))[0]
    np.testing.assert_allclose(npy(loss).reshape(-1), [(npy(x) @ npy(w)).sum()], rtol=1e-5)
    grads = {id(p): npy(g) for p, g in autograd.backward(loss)}
    # d sum(x @ w) / dw = x^T @ ones
    np.testing.assert_allclose(grads[id(w)], npy(x).T @ np.ones((4, 2), np.float32), rtol=1e-5)
    # a given dy reaches the root operator as its number too
    grads = {id(p): npy(g) for p, g in autograd.backward(loss, dy=2.0)}
    np.testing.assert_allclose(grads[id(w)], 2 * npy(x).T @ np.ones((4, 2), np.float32), rtol=1e-5)


def test_float_of_a_one_element_raw_tensor():
    assert float(t([2.5]).data) == 2.5
    assert float(t([[7]], np.int32).data) == 7.0
    with pytest.raises(TypeError, match=r"only a one-element raw tensor converts to a float.*\(2, 2\)"):
        float(t(np.ones((2, 2))).data)


def test_a_one_element_raw_tensor_operand_is_read_as_its_number():
    # SINGA's Tensor operators read a non-Tensor operand with float(); cnn_ms/msmlp's loss does dx *= dy with
    # the root dy, which here is a one-element raw tensor
    dx = t(np.ones((2, 3)))
    dx *= t([2.0]).data
    np.testing.assert_array_equal(npy(dx), np.full((2, 3), 2.0))
    np.testing.assert_array_equal(npy(dx + t([[1.0]]).data), np.full((2, 3), 3.0))
    assert (t([1, 2], np.int32) * t([0.5]).data).dtype == tensor.float32  # a float operand, as a number is
    with pytest.raises(TypeError, match=r"raw tensor operand must have one element.*\(2, 3\)"):
        dx * t(np.ones((2, 3))).data


def test_a_backward_that_returns_a_tensor_is_refused_by_name():
    class TensorGrad(autograd.Operator):  # msmlp's SumError as SINGA has it: returns the tensor.Tensor
        def forward(self, x):
            self.shape = x.shape()
            return singa.SumAll(x)

        def backward(self, dy=1.0):
            dx = tensor.Tensor(self.shape)
            dx.set_value(1.0)
            dx *= dy
            return dx

    w = t(np.ones((3, 2)))
    w.requires_grad = w.stores_grad = True
    autograd.training = True
    loss = TensorGrad()(autograd.matmul(t(np.ones((4, 3))), w))[0]
    with pytest.raises(TypeError, match=r"TensorGrad#\d+\.backward returned a Tensor for input 0.*return its \.data"):
        list(autograd.backward(loss))


def test_a_layer_forward_called_directly_initializes_first():
    class Scale(layer.Layer):
        def initialize(self, x):
            self.w = tensor.Tensor((x.shape[1],), requires_grad=True, stores_grad=True).set_value(2.0)

        def forward(self, x):
            return autograd.mul(x, self.w)

    s = Scale()
    y = s.forward(t(np.ones((2, 3))))  # SINGA's LayerMeta initializes here too, not only in __call__
    np.testing.assert_array_equal(npy(y), np.full((2, 3), 2.0))
    s.w.set_value(3.0)
    np.testing.assert_array_equal(npy(s(t(np.ones((2, 3))))), np.full((2, 3), 3.0))  # once only
