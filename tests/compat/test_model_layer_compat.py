"""SINGA's model.Model and layer constructors that singa_lite follows (singa_lite/model.py, layer.py).

Graph mode is eager here (see model.py's docstring): these tests check it gives bit-identical training,
drives the device's graph calls, and that Model.__call__ passes extra arguments on as SINGA's examples
need. The layer tests cover SINGA's constructor keywords, and the clear errors for those not supported.
"""
import numpy as np
import pytest

from singa_lite import autograd, device, layer, model, opt, tensor


@pytest.fixture(autouse=True)
def _clean_device():
    dev = device.create_cpu_device()
    dev.ResetGraph()
    yield
    dev.EnableGraph(False)
    dev.ResetGraph()
    autograd.training = False


def t(a, dtype=np.float32):
    return tensor.from_numpy(np.asarray(a, dtype))


def rand(*shape, seed=0):
    return t(np.random.default_rng(seed).standard_normal(shape))


class Net(model.Model):
    def __init__(self):
        super().__init__()
        self.conv = layer.Conv2d(3, 3, padding=1, activation="RELU")
        self.bn = layer.BatchNorm2d()
        self.pool = layer.MaxPool2d(2)
        self.flat = layer.Flatten()
        self.fc = layer.Linear(4)
        self.loss = layer.SoftMaxCrossEntropy()
        self.seen = []  # what train_one_batch received besides x and y

    def forward(self, x):
        return self.fc(self.flat(self.pool(self.bn(self.conv(x)))))

    def train_one_batch(self, x, y, option="plain", scale=None):
        self.seen.append((option, scale, device.create_cpu_device().graph_enabled()))
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def trained(use_graph, sequential=False, steps=4):
    device.create_cpu_device().SetRandSeed(3)
    m = Net()
    m.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    x, y = rand(8, 2, 6, 6), t(np.arange(8) % 4, np.int32)
    m.compile([x], is_train=True, use_graph=use_graph, sequential=sequential)
    losses = [tensor.to_numpy(m(x, y)[1]).item() for _ in range(steps)]
    return m, losses


# ---------------------------------------------------------------- graph mode
@pytest.mark.parametrize("sequential", [False, True])
def test_graph_mode_trains_bit_identically_to_eager(sequential):
    eager, eager_losses = trained(False)
    graph, graph_losses = trained(True, sequential)
    assert graph.graph_mode and not eager.graph_mode and graph.sequential == sequential
    assert graph_losses == eager_losses and eager_losses[-1] < eager_losses[0]
    for (k, a), (k2, b) in zip(sorted(eager.get_states().items()), sorted(graph.get_states().items())):
        assert k == k2
        np.testing.assert_array_equal(tensor.to_numpy(a), tensor.to_numpy(b))


def test_graph_mode_step_runs_with_the_device_graph_on_and_ends_with_run_graph():
    dev = device.create_cpu_device()
    m, _ = trained(True, steps=3)
    assert [s[2] for s in m.seen] == [True] * 3  # inside the step
    assert dev.graph_enabled() is False          # restored after it
    assert dev.time_profile()["iterations"] == 3  # one RunGraph per step (compile reset the count)
    m2, _ = trained(False, steps=2)
    assert [s[2] for s in m2.seen] == [False] * 2
    m2.graph(True)
    x, y = rand(8, 2, 6, 6), t(np.arange(8) % 4, np.int32)
    m2(x, y)
    assert m2.seen[-1][2] is True and m2.graph_mode


def test_graph_mode_step_without_a_tensor_input_is_refused():
    m, _ = trained(True, steps=0)
    with pytest.raises(ValueError, match="graph mode expects a Tensor"):
        m("not a tensor", None)


def test_compile_resets_the_device_graph_and_checks_its_inputs():
    dev = device.create_cpu_device()
    dev.RunGraph()
    assert dev.time_profile()["iterations"] == 1
    m = Net()
    m.set_optimizer(opt.SGD(lr=0.1))
    m.compile(rand(2, 2, 6, 6), is_train=False)  # a single Tensor is accepted too
    assert dev.time_profile()["iterations"] == 0 and not m.training and not autograd.training
    assert m.fc.W.shape == (27, 4)  # 3 channels x 3 x 3 after the pooling
    with pytest.raises(TypeError, match="non-empty list of input Tensors"):
        Net().compile([np.zeros((2, 2, 6, 6))])


# ---------------------------------------------------------------- calling the model
def test_call_passes_extra_arguments_to_train_one_batch_and_forward():
    m, _ = trained(False, steps=0)
    x, y = rand(8, 2, 6, 6), t(np.arange(8) % 4, np.int32)
    m(x, y, "sparseTopK", scale=0.05)
    assert m.seen[-1][:2] == ("sparseTopK", 0.05)

    class Scaled(model.Model):
        def forward(self, x, factor=1.0):
            return autograd.mul(x, factor)

    s = Scaled()
    s.eval()
    np.testing.assert_array_equal(tensor.to_numpy(s(t([1.0, 2.0]), factor=3.0)), [3.0, 6.0])


def test_train_and_eval_switch_what_a_call_runs():
    m, _ = trained(False, steps=0)
    x, y = rand(8, 2, 6, 6), t(np.arange(8) % 4, np.int32)
    m.eval()
    assert not m.training and not autograd.training
    out = m(x)
    assert out.shape == (8, 4) and len(m.seen) == 0  # forward only
    m.train()
    assert m.training and autograd.training
    m(x, y)
    assert len(m.seen) == 1


def test_a_direct_train_one_batch_call_is_one_iteration_even_through_super():
    dev = device.create_cpu_device()

    class Child(Net):
        def train_one_batch(self, x, y):
            return super().train_one_batch(x, y, "child")

    m = Child()
    m.set_optimizer(opt.SGD(lr=0.1))
    x, y = rand(8, 2, 6, 6), t(np.arange(8) % 4, np.int32)
    m.compile([x], is_train=True)
    m.train_one_batch(x, y)
    m(x, y)
    assert dev.time_profile()["iterations"] == 2 and m.seen[-1][0] == "child"


# ---------------------------------------------------------------- layer constructors
def test_conv2d_activation_relu_is_relu_of_the_convolution():
    x = rand(2, 3, 5, 5)
    plain = layer.Conv2d(3, 4, 3, padding=1)
    relu = layer.Conv2d(3, 4, 3, padding=1, activation="RELU")
    relu.set_params({"W": plain.W, "b": rand(4, seed=1)})
    plain.set_params({"b": relu.b})
    got, want = tensor.to_numpy(relu(x)), np.maximum(tensor.to_numpy(plain(x)), 0)
    np.testing.assert_array_equal(got, want)
    assert (want == 0).any() and (want > 0).any()
    with pytest.raises(ValueError, match="activation must be one of NOTSET, RELU"):
        layer.Conv2d(4, 3, activation="TANH")


def test_conv2d_positional_stride_and_padding_and_padding_forms():
    x = rand(1, 3, 7, 7)
    a = layer.Conv2d(3, 4, 3, 2, 1)  # (in_channels, nb_kernels, kernel_size, stride, padding)
    assert (a.stride, a.padding) == ((2, 2), (1, 1)) and a(x).shape == (1, 4, 4, 4)
    b = layer.Conv2d(4, 3, padding=(1, 1, 2, 2))  # ONNX's (top, bottom, left, right), symmetric
    assert b.padding == (1, 2) and b(x).shape == (1, 4, 7, 9)


def conv_reference(x, W, pads):
    """Cross-correlation of x (1, C, H, W) with W (O, C, k, k) after numpy zero padding, stride 1."""
    xp = np.pad(x, ((0, 0), (0, 0), pads[:2], pads[2:]))
    k = W.shape[-1]
    oh, ow = xp.shape[2] - k + 1, xp.shape[3] - k + 1
    out = np.zeros((1, W.shape[0], oh, ow), np.float64)
    for i in range(oh):
        for j in range(ow):
            out[0, :, i, j] = np.tensordot(W, xp[0, :, i:i + k, j:j + k], axes=3)
    return out


def test_conv2d_uneven_padding_pads_the_extra_side_first():
    x = rand(1, 2, 6, 5)
    c = layer.Conv2d(3, 2, padding=(1, 0, 0, 2), bias=False)  # top 1, bottom 0, left 0, right 2
    y = tensor.to_numpy(c(x))
    want = conv_reference(tensor.to_numpy(x), tensor.to_numpy(c.W), (1, 0, 0, 2))
    assert y.shape == want.shape == (1, 3, 6, 6)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
def test_conv2d_and_pooling_same_padding_keep_the_size(mode):
    x = rand(1, 2, 9, 9)
    assert layer.Conv2d(3, 5, pad_mode=mode)(x).shape == (1, 3, 9, 9)
    assert layer.Conv2d(3, 3, stride=3, pad_mode=mode)(x).shape == (1, 3, 3, 3)
    assert layer.MaxPool2d(3, 1, pad_mode=mode)(x).shape == (1, 2, 9, 9)
    assert layer.Conv2d(3, 3, padding=4, pad_mode="VALID")(x).shape == (1, 3, 7, 7)
    # an even kernel needs one pixel on one side: after (UPPER) or before (LOWER), as ONNX / SINGA
    x8 = rand(1, 2, 8, 8)
    c = layer.Conv2d(3, 2, pad_mode=mode, bias=False)
    y = tensor.to_numpy(c(x8))
    pads = (0, 1, 0, 1) if mode == "SAME_UPPER" else (1, 0, 1, 0)
    np.testing.assert_allclose(y, conv_reference(tensor.to_numpy(x8), tensor.to_numpy(c.W), pads),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="pad_mode must be one of"):
        layer.MaxPool2d(2, pad_mode="SAME")


def test_pooling_uneven_padding_never_lets_the_padding_win():
    x = t(-np.arange(1, 17, dtype=np.float32).reshape(1, 1, 4, 4))  # all negative: zero padding would win
    y = tensor.to_numpy(layer.MaxPool2d(2, 1, padding=(0, 1, 0, 1))(x))
    xn = tensor.to_numpy(x)[0, 0]
    xp = np.pad(xn, ((0, 1), (0, 1)), constant_values=-np.inf)
    want = np.array([[xp[i:i + 2, j:j + 2].max() for j in range(4)] for i in range(4)])
    np.testing.assert_array_equal(y[0, 0], want)
    avg = tensor.to_numpy(layer.AvgPool2d(2, 1, padding=(1, 0, 1, 0))(x))[0, 0]
    zp = np.pad(xn, ((1, 0), (1, 0)))
    np.testing.assert_allclose(avg, [[zp[i:i + 2, j:j + 2].mean() for j in range(4)] for i in range(4)], rtol=1e-6)
    excl = tensor.to_numpy(layer.AvgPool2d(2, 1, padding=(1, 0, 1, 0), count_include_pad=False)(x))[0, 0]
    inside = np.pad(np.ones((4, 4)), ((1, 0), (1, 0)))  # 1 where a window position holds data
    want = [[zp[i:i + 2, j:j + 2].sum() / inside[i:i + 2, j:j + 2].sum() for j in range(4)] for i in range(4)]
    np.testing.assert_allclose(excl, want, rtol=1e-6)


def test_conv2d_cudnn_keywords_only_at_their_defaults():
    layer.Conv2d(4, 3, cudnn_prefer="fastest", workspace_MB_limit=1024)
    with pytest.raises(NotImplementedError, match="cudnn_prefer='limited_workspace'"):
        layer.Conv2d(4, 3, cudnn_prefer="limited_workspace")
    with pytest.raises(TypeError, match="unexpected keyword argument 'kernel'"):
        layer.Conv2d(4, 3, kernel=3)


def test_separable_conv2d_is_depthwise_then_pointwise():
    x = rand(2, 3, 6, 6)
    sep = layer.SeparableConv2d(5, 3, padding=1)
    y = sep(x)
    assert y.shape == (2, 5, 6, 6)
    assert sep.depthwise_conv.W.shape == (3, 1, 3, 3) and sep.point_conv.W.shape == (5, 3, 1, 1)
    assert set(sep.get_params()) == {"depthwise_conv.W", "point_conv.W"}  # bias=False, SINGA's default
    want = sep.point_conv(sep.depthwise_conv(x))
    np.testing.assert_array_equal(tensor.to_numpy(y), tensor.to_numpy(want))


def test_pooling_layers():
    x = rand(2, 3, 4, 6)
    np.testing.assert_array_equal(tensor.to_numpy(layer.Pooling2d(2, is_max=False)(x)),
                                  tensor.to_numpy(layer.AvgPool2d(2)(x)))
    np.testing.assert_array_equal(tensor.to_numpy(layer.Pooling2d(2)(x)), tensor.to_numpy(layer.MaxPool2d(2)(x)))
    x1 = rand(2, 3, 1, 8)
    got = tensor.to_numpy(layer.MaxPool1d(2)(x1))
    np.testing.assert_array_equal(got, tensor.to_numpy(x1).reshape(2, 3, 1, 4, 2).max(-1))
    assert layer.AvgPool1d(4, 2)(x1).shape == (2, 3, 1, 3)


def test_positional_forms_of_batchnorm_and_linear():
    bn = layer.BatchNorm2d(3, 0.5)
    assert bn.momentum == 0.5 and bn.scale.shape == (3,)
    with pytest.raises(ValueError, match="momentum must be in"):
        layer.BatchNorm2d(momentum=1.5)
    lin = layer.Linear(3, 4, False)  # (in_features, out_features, bias)
    assert set(lin.get_params()) == {"W"} and lin(rand(2, 3)).shape == (2, 4)


def test_small_layers_add_cat_reshape_cross_entropy():
    a, b = rand(2, 3), rand(2, 3, seed=1)
    na, nb = tensor.to_numpy(a), tensor.to_numpy(b)
    np.testing.assert_array_equal(tensor.to_numpy(layer.Add()(a, b)), na + nb)
    np.testing.assert_array_equal(tensor.to_numpy(layer.Cat(1)([a, b])), np.concatenate([na, nb], 1))
    assert layer.Reshape()(a, (3, -1)).shape == (3, 2)
    with pytest.raises(TypeError, match="Cat: expected a list"):
        layer.Cat()(a)
    p = t([[0.25, 0.75], [0.5, 0.5]])
    np.testing.assert_allclose(tensor.to_numpy(layer.CrossEntropy()(p, t([[0, 1], [1, 0]]))).item(),
                               -(np.log(0.75) + np.log(0.5)) / 2, rtol=1e-6)
    bce = tensor.to_numpy(layer.BinaryCrossEntropy()(p, t([[0, 1], [1, 0]]))).item()
    np.testing.assert_allclose(bce, -(np.log(0.75) * 2 + np.log(0.5) * 2) / 2, rtol=1e-6)


def test_register_layers_names_sublayers_as_singa_does():
    class Blocks(layer.Layer):
        def __init__(self):
            super().__init__()
            self.register_layers(layer.Linear(3), layer.ReLU(), layer.Linear(2))

        def forward(self, x):
            return self.Linear_2(self.ReLU_1(self.Linear_0(x)))

    m = Blocks()
    assert m(rand(4, 5)).shape == (4, 2)
    assert set(m.get_params()) == {"Linear_0.W", "Linear_0.b", "Linear_2.W", "Linear_2.b"}
    with pytest.raises(TypeError, match="not a Layer"):
        m.register_layers({"x": 3})


def test_dtype_check_casts_to_the_first_dtype():
    a, b = rand(2), t([1, 2], np.int32)
    layer.Layer().dtype_check(a, b)
    assert b.dtype == a.dtype == tensor.float32


def test_optimizer_device_check_moves_tensors_to_the_first_ones_device():
    a, b = rand(2), rand(2, seed=1)
    sgd = opt.SGD(lr=0.1)
    sgd.device_check(a, b)  # all on the CPU already: nothing moves
    assert b.device == a.device
    if device.cuda_is_available():
        g = rand(2).to_device(device.create_cuda_gpu())
        sgd.device_check(g, b)
        assert b.device == g.device
    with pytest.raises(TypeError, match="device_check: expected Tensors"):
        sgd.device_check(a, np.zeros(2))


# ---------------------------------------------------------------- autograd.gradients keys
def test_gradients_are_readable_by_parameter_and_by_its_id_as_singa_keys_them():
    autograd.training = True
    lin = layer.Linear(3, 2)
    grads = autograd.gradients(autograd.reduce_sum(lin(rand(4, 3))))
    assert set(grads) == {lin.W, lin.b}
    for p in (lin.W, lin.b):
        assert grads[id(p)] is grads[p] and id(p) in grads and grads.get(id(p)) is grads[p]
    other = rand(2)
    assert id(other) not in grads and grads.get(id(other)) is None
    with pytest.raises(KeyError):
        grads[id(other)]


def test_a_float16_input_trains_float16_parameters_as_singa_does():
    m, _ = trained(False, steps=0)
    x16 = rand(8, 2, 6, 6).as_type(tensor.float16)
    y = t(np.arange(8) % 4, np.int32)
    before = tensor.to_numpy(m.fc.W).astype(np.float16)
    out, loss = m(x16, y)
    assert out.dtype == loss.dtype == tensor.float16
    assert all(p.dtype == tensor.float16 for p in m.get_params().values())
    assert not np.array_equal(tensor.to_numpy(m.fc.W), before)  # the float16 step updated it
    ints = t([[1, 2]], np.int32)  # an integer input (indices) leaves a layer's dtype alone
    lin = layer.Linear(2, 3)
    lin.device_check(ints)
    assert lin.W.dtype == tensor.float32
