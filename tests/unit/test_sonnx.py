"""singa_lite.sonnx: export to ONNX (checked by onnxruntime), import (checked against our own and PyTorch's
results), SONNXModel fine-tuning, and the errors. Needs the onnx extra (pip install 'singa_lite[onnx]')."""
import io
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed: pip install 'singa_lite[onnx]'")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed: pip install 'singa_lite[onnx]'")

from singa_lite import autograd, layer, model, opt, sonnx, tensor  # noqa: E402


@pytest.fixture(autouse=True)
def _training_flag():
    was = autograd.training
    yield
    autograd.training = was


def T(a):
    return tensor.from_numpy(np.asarray(a))


def run_ort(m, *xs):
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: x for i, x in zip(m.graph.input, xs)})


class CNN(model.Model):
    def __init__(self):
        super().__init__()
        self.conv1 = layer.Conv2d(3, 8, 3, padding=1)
        self.bn1 = layer.BatchNorm2d(8)
        self.pool1 = layer.MaxPool2d(2, 2)
        self.conv2 = layer.Conv2d(8, 6, 3, stride=2, padding=(1, 0, 1, 0))  # odd padding: one side only
        self.pool2 = layer.AvgPool2d(2, 1, count_include_pad=False)
        self.fc = layer.Linear(10)
        self.drop = layer.Dropout(0.3)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        y = self.pool1(autograd.relu(self.bn1(self.conv1(x))))
        y = self.pool2(autograd.leakyrelu(self.conv2(y), 0.1))
        y = self.fc(self.drop(autograd.flatten(y)))
        return autograd.softmax(y, 1)

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


class MLP(model.Model):
    def __init__(self):
        super().__init__()
        self.fc1 = layer.Linear(16)
        self.fc2 = layer.Linear(4)

    def forward(self, x):
        h = autograd.tanh(self.fc1(x))
        h = autograd.concat([autograd.sigmoid(h), autograd.gelu(h)], 1)
        return autograd.reshape(self.fc2(h), (-1, 2, 2))


def _trained_cnn(steps=3):
    rng = np.random.default_rng(0)
    m = CNN()
    m.set_optimizer(opt.SGD(lr=0.05, momentum=0.9))
    x = T(rng.standard_normal((4, 3, 12, 12)).astype(np.float32))
    y = T(rng.integers(0, 10, 4).astype(np.int32))
    m.compile([x], is_train=True)
    for _ in range(steps):
        m(x, y)
    m.eval()
    return m


def test_a_model_trained_here_runs_in_onnxruntime_with_the_same_outputs():
    m = _trained_cnn()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 3, 12, 12)).astype(np.float32)
    want = tensor.to_numpy(m(T(x)))
    running = tensor.to_numpy(m.bn1.running_mean).copy()
    proto = sonnx.export_model(m, [T(x)])
    assert [n.op_type for n in proto.graph.node] == ["Conv", "BatchNormalization", "Relu", "MaxPool", "Conv",
                                                     "LeakyRelu", "AveragePool", "Flatten", "Dropout", "MatMul",
                                                     "Add", "Softmax"]
    np.testing.assert_array_equal(tensor.to_numpy(m.bn1.running_mean), running)  # the trace changed no state
    got = run_ort(proto, x)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    # and back into singa_lite
    rep = sonnx.prepare(proto)
    autograd.training = False
    np.testing.assert_allclose(rep.run([x])[0], want, rtol=0, atol=1e-6)


def test_an_mlp_with_shared_input_and_several_ops_round_trips():
    m = MLP()
    x = np.random.default_rng(2).standard_normal((3, 5)).astype(np.float32)
    m.eval()
    want = tensor.to_numpy(m.forward(T(x)))
    proto = sonnx.export_model(m, T(x))
    assert proto.opset_import[0].version == sonnx.EXPORT_OPSET
    np.testing.assert_allclose(run_ort(proto, x)[0], want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(sonnx.prepare(proto).run([x])[0], want, rtol=0, atol=1e-6)


def _numbers(shape, seed, positive=False):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return np.abs(a) + 0.5 if positive else a


# (name, function of the input tensors, input arrays): each is exported, run by onnxruntime and imported back
OPS = [
    ("matmul_gemm", lambda a, b, c: autograd.gemm(autograd.matmul(a, b), b, c, 0.5, 2.0, 0, 1),
     [_numbers((3, 4), 0), _numbers((4, 4), 1), _numbers((3, 4), 2)]),
    ("add_bias_rows", lambda a, b: autograd.add_bias(a, b, axis=1), [_numbers((3, 4), 0), _numbers((3,), 1)]),
    ("binary", lambda a, b: autograd.div(autograd.sub(autograd.mul(a, b), b), autograd.add(b, b)),
     [_numbers((2, 3), 0), _numbers((2, 3), 1, True)]),
    ("unary", lambda a: autograd.exp(autograd.sin(autograd.sqrt(autograd.abs(a)))), [_numbers((2, 3), 3)]),
    ("activations", lambda a: autograd.add(autograd.elu(a, 0.7), autograd.selu(autograd.softplus(a))),
     [_numbers((4, 3), 4)]),
    ("hardsigmoid_softsign", lambda a: autograd.mul(autograd.hardsigmoid(a, 0.3, 0.4), autograd.softsign(a)),
     [_numbers((4, 3), 5)]),
    ("log_softmax_clip", lambda a: autograd.clip(autograd.log_softmax(a, 0), -1.5, None), [_numbers((4, 3), 6)]),
    ("prelu", lambda a, s: autograd.prelu(a, s), [_numbers((2, 3, 2, 2), 7), _numbers((3, 1, 1), 8)]),
    ("transpose_squeeze", lambda a: autograd.unsqueeze(autograd.squeeze(autograd.transpose(a, (2, 0, 1)), [2]), [0]),
     [_numbers((3, 1, 4), 9)]),
    ("slice_split", lambda a: autograd.cat(list(autograd.split(autograd.slice(a, [1], [5], [1]), 1, [1, 3]))[::-1], 1),
     [_numbers((2, 6), 10)]),
    ("reduce", lambda a: autograd.add(autograd.reduce_sum(a, [1], 0), autograd.reduce_mean(a, [1], 0)),
     [_numbers((3, 4), 11)]),
    ("reduce_all", lambda a: autograd.reduce_sum(a, None, 0), [_numbers((3, 4), 11)]),
    ("tile_expand_pad", lambda a: autograd.pad(autograd.expand(autograd.tile(a, [2, 1]), (3, 4, 3)), "constant",
                                               [0, 1, 0, 0, 0, 1], 0.5), [_numbers((2, 3), 12)]),
    ("gather_where", lambda a: autograd.where(autograd.gather(a, 1, [2, 0]), autograd.slice(a, [0], [2], [1]),
                                              [[1, 0], [0, 1]]), [_numbers((2, 3), 13)]),
    ("global_avg_pool_conv_groups", lambda x, w: autograd.global_avg_pool2d(autograd.conv2d(x, w, None, 1, 1, 1, 2)),
     [_numbers((2, 4, 5, 5), 14), _numbers((6, 2, 3, 3), 15)]),
    ("cast_compare", lambda a, b: autograd.cast(autograd.greater(a, b), tensor.float32),
     [_numbers((3, 3), 16), _numbers((3, 3), 17)]),
    ("depth_space", lambda a: autograd.space_to_depth(autograd.depth_to_space(a, 2), 2), [_numbers((1, 8, 2, 3), 18)]),
    ("upsample", lambda a: autograd.upsample(a, "nearest", [1, 1, 2, 3]), [_numbers((1, 2, 2, 2), 19)]),
    ("embedding", lambda ids, w: autograd.embedding(ids, w), [np.array([[0, 2], [1, 1]], np.int32),
                                                              _numbers((3, 4), 27)]),
    ("scatter_onehot", lambda a: autograd.add(autograd.scatter_elements(a, [[1, 0]], [[5.0, 6.0]], 0),
                                              autograd.onehot(1, autograd.cast(a, tensor.int32), [2], [0.0, 1.0])),
     [np.array([[0.0, 1.0], [1.0, 0.0]], np.float32)]),
]


@pytest.mark.parametrize("name,fn,arrays", OPS, ids=[o[0] for o in OPS])
def test_exported_ops_agree_with_onnxruntime_and_import_back(name, fn, arrays):
    autograd.training = True
    # stores_grad: inputs matched by identity, so one read by several operators is one graph input
    xs = [tensor.Tensor(data=a, requires_grad=True, stores_grad=True) for a in arrays]
    y = fn(*xs)
    want = tensor.to_numpy(y)
    proto = sonnx.to_onnx(xs, [y])
    np.testing.assert_allclose(run_ort(proto, *arrays)[0].reshape(want.shape), want, rtol=1e-5, atol=1e-6)
    autograd.training = False
    got = sonnx.prepare(proto).run(arrays)[0]
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)


def test_batchnorm_exports_its_running_statistics_and_onnx_momentum():
    bn = layer.BatchNorm2d(3, momentum=0.2)
    x = _numbers((4, 3, 2, 2), 20)
    autograd.training = True
    bn(T(x))  # moves the running statistics off 0 / 1
    autograd.training = False
    want = tensor.to_numpy(bn(T(x)))
    proto = sonnx.export_model(bn, T(x))
    node = proto.graph.node[0]
    assert node.op_type == "BatchNormalization"
    assert onnx.helper.get_attribute_value(next(a for a in node.attribute if a.name == "momentum")) == \
        pytest.approx(0.8)
    np.testing.assert_allclose(run_ort(proto, x)[0], want, rtol=0, atol=1e-5)


def _torch_cnn():
    torch = pytest.importorskip("torch", reason="the parity extra (torch) is not installed")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                              torch.nn.MaxPool2d(2), torch.nn.Conv2d(4, 4, 3, stride=2, padding=1), torch.nn.Tanh(),
                              torch.nn.Flatten(), torch.nn.Linear(16, 10))
    with torch.no_grad():  # non-trivial running statistics
        net[1].running_mean.uniform_(-0.5, 0.5)
        net[1].running_var.uniform_(0.5, 1.5)
    net.eval()
    x = torch.randn(3, 1, 8, 8)
    f = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript exporter: the torch.export one needs onnxscript
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(net, (x,), f, dynamo=False, input_names=["x"], output_names=["y"],
                          do_constant_folding=False, dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return net, x, onnx.load_from_string(f.getvalue())


def test_a_pytorch_export_runs_here_with_pytorchs_outputs():
    net, x, proto = _torch_cnn()
    assert "BatchNormalization" in [n.op_type for n in proto.graph.node]
    want = net(x).detach().numpy()
    autograd.training = False
    got = sonnx.prepare(proto).run([x.numpy()])[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_sonnx_model_fine_tunes_a_cut_pytorch_model_with_a_new_head():
    _, _, proto = _torch_cnn()

    class Tuned(sonnx.SONNXModel):
        def __init__(self, proto):
            super().__init__(proto)
            self.head = layer.Linear(3)

        def forward(self, x):
            return self.head(super().forward(x, last_layers=-3)[0])  # all but the classifier (Gemm)

        def train_one_batch(self, x, y):
            out = self.forward(x)
            loss = autograd.softmax_cross_entropy(out, y)
            self.optimizer(loss)
            return out, loss

    rng = np.random.default_rng(3)
    x = T(rng.standard_normal((6, 1, 8, 8)).astype(np.float32))
    y = T(rng.integers(0, 3, 6).astype(np.int32))
    m = Tuned(proto)
    m.set_optimizer(opt.SGD(lr=0.1))
    m.compile([x], is_train=True)
    params = m.get_params()
    # the imported weights (the classifier's Gemm, cut off, is never created) and the new head
    assert sorted(params) == sorted(["w_0_weight", "w_0_bias", "w_1_weight", "w_1_bias", "w_4_weight",
                                     "w_4_bias", "head.W", "head.b"]), sorted(params)
    assert sorted(m.get_states()) == sorted(list(params) + ["w_1_running_mean", "w_1_running_var"])
    before = tensor.to_numpy(params["w_0_weight"]).copy()
    losses = [float(tensor.to_numpy(m(x, y)[1])[0]) for _ in range(15)]
    assert losses[-1] < 0.5 * losses[0], losses
    assert not np.allclose(tensor.to_numpy(params["w_0_weight"]), before)  # the imported weights trained


def test_last_layers_follows_singas_arithmetic():
    autograd.training = True
    x = T(_numbers((2, 3), 21))
    a = autograd.relu(x)
    b = autograd.exp(a)
    c = autograd.tanh(b)
    proto = sonnx.to_onnx([x], [c])
    rep = sonnx.prepare(proto)
    rep.is_graph = True
    for last, want in ((None, c), (-2, c), (-3, b), (-1, a), (0, a), (1, b)):
        got = rep.run([x], last_layers=last)[0]
        np.testing.assert_allclose(tensor.to_numpy(got), tensor.to_numpy(want), rtol=1e-6)
    with pytest.raises(sonnx.SonnxError, match="out of range"):
        rep.run([x], last_layers=3)
    got, aux = rep.run([x], aux_output=[proto.graph.node[0].output[0]])
    np.testing.assert_allclose(tensor.to_numpy(aux), tensor.to_numpy(a), rtol=1e-6)


def test_errors_say_what_was_expected():
    autograd.training = True
    x, w = T(_numbers((2, 3), 22)), T(_numbers((3, 2), 23))
    y = autograd.matmul(x, w)
    with pytest.raises(sonnx.SonnxError, match="more data inputs than the 1 tensors given"):
        sonnx.to_onnx([x], [y])
    loss = autograd.mse_loss(y, T(np.zeros((2, 2), np.float32)))
    with pytest.raises(sonnx.SonnxError, match="MeanSquareError.*no ONNX form"):
        sonnx.to_onnx([x, w], [loss])
    autograd.training = False
    with pytest.raises(sonnx.SonnxError, match="no recorded graph"):
        sonnx.to_onnx([x, w], [autograd.matmul(x, w)])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Einsum", ["a"], ["b"], equation="ii")], "g",
                                   [onnx.helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [2, 2])],
                                   [onnx.helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [])])
    bad = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    with pytest.raises(sonnx.SonnxError, match="Einsum is not supported"):
        sonnx.prepare(bad)
    relu = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["a"], ["b"])], "g",
                                  [onnx.helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [2])],
                                  [onnx.helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [2])])
    rep = sonnx.prepare(onnx.helper.make_model(relu, opset_imports=[onnx.helper.make_opsetid("", 13)]))
    with pytest.raises(sonnx.SonnxError, match="1 inputs .* got 2 values"):
        rep.run([np.zeros(2, np.float32)] * 2)
    with pytest.raises(TypeError, match="expected an onnx.ModelProto"):
        sonnx.prepare(42)


def test_export_after_backward_gives_the_forward_pass_and_a_new_pass_is_refused_with_the_reason():
    # SINGA keeps the graph after backward (its retraining and transfer-learning tests export then); a new
    # recorded forward pass drops the old graph's state, and exporting the old outputs then says why.
    autograd.training = True
    w = tensor.Tensor(data=_numbers((3, 2), 24), requires_grad=True, stores_grad=True, name="w")
    x = T(_numbers((2, 3), 25))
    y = autograd.matmul(x, w)
    list(autograd.backward(autograd.reduce_sum(y, None, 0)))
    m = sonnx.to_onnx([x], [y])
    np.testing.assert_allclose(run_ort(m, tensor.to_numpy(x))[0], tensor.to_numpy(y), rtol=1e-6)
    autograd.matmul(x, w)  # the next step's forward pass
    with pytest.raises(sonnx.SonnxError, match="new forward pass"):
        sonnx.to_onnx([x], [y])


def test_run_node_runs_one_node():
    node = onnx.helper.make_node("Softmax", ["x"], ["y"], axis=0)
    x = _numbers((3, 2), 26)
    out = sonnx.run_node(node, [x])
    e = np.exp(x - x.max(0))
    np.testing.assert_allclose(out["y"], e / e.sum(0), rtol=1e-6)


@pytest.mark.parametrize("opset,node,inputs,want", [
    # Softmax before 13: over every axis from `axis` of the input flattened there
    (11, onnx.helper.make_node("Softmax", ["x"], ["y"], axis=1), [_numbers((2, 3, 4), 30)],
     lambda x: (lambda e: e / e.sum(1, keepdims=True))(np.exp(x.reshape(2, 12))).reshape(2, 3, 4)),
    (13, onnx.helper.make_node("Softmax", ["x"], ["y"], axis=1), [_numbers((2, 3, 4), 30)],
     lambda x: np.exp(x) / np.exp(x).sum(1, keepdims=True)),
    (11, onnx.helper.make_node("Squeeze", ["x"], ["y"], axes=[1]), [_numbers((2, 1, 3), 31)],
     lambda x: x.reshape(2, 3)),
    (11, onnx.helper.make_node("ReduceSum", ["x"], ["y"], axes=[0], keepdims=0), [_numbers((2, 3), 32)],
     lambda x: x.sum(0)),
    (6, onnx.helper.make_node("Clip", ["x"], ["y"], min=-0.2, max=0.3), [_numbers((2, 3), 33)],
     lambda x: np.clip(x, -0.2, 0.3)),
    (9, onnx.helper.make_node("Slice", ["x"], ["y"], starts=[1], ends=[100], axes=[1]), [_numbers((2, 4), 34)],
     lambda x: x[:, 1:]),
    (13, onnx.helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"]),
     [_numbers((2, 5), 35), np.array([-1]), np.array([-100]), np.array([1]), np.array([-2])],
     lambda x, *_: x[:, ::-2]),
    (11, onnx.helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
     [_numbers((1, 1, 6, 6), 36)],
     lambda x: np.array([[[[x[0, 0, i:i + 3, j:j + 3].max() for j in (0, 2, 4)] for i in (0, 2, 4)]]])),
    (13, onnx.helper.make_node("Div", ["a", "b"], ["y"]), [np.array([7, -7, 6, -1], np.int32),
                                                           np.array([2, 2, -4, 3], np.int32)],
     lambda a, b: np.array([3, -3, -1, 0], np.int32)),
    (11, onnx.helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2], auto_pad="SAME_UPPER"),
     [_numbers((1, 2, 5), 37)], lambda x: np.stack([x[..., i:i + 2].mean(-1) for i in range(5)], -1)),
])
def test_import_reads_each_opsets_form(opset, node, inputs, want):
    autograd.training = False
    got = list(sonnx.run_node(node, inputs, opset_version=opset).values())[0]
    np.testing.assert_allclose(got, want(*inputs), rtol=1e-5, atol=1e-6)


def test_a_fine_tuned_import_saves_and_loads_its_states(tmp_path):
    _, x, proto = _torch_cnn()
    autograd.training = True
    m = sonnx.SONNXModel(proto)
    m.set_optimizer(opt.SGD(lr=0.1))
    tx = T(x.numpy())
    m.compile([tx], is_train=True)
    loss = autograd.reduce_sum(autograd.mul(m.forward(tx)[0], m.forward(tx)[0]), None, 0)
    m.optimizer(loss)  # one step: the weights differ from the file's
    m.eval()
    want = tensor.to_numpy(m(tx)[0])
    m.save_states(str(tmp_path / "tuned.zip"))
    again = sonnx.SONNXModel(proto)
    again.compile([tx], is_train=False)
    assert not np.allclose(tensor.to_numpy(again(tx)[0]), want)
    again.load_states(str(tmp_path / "tuned.zip"))
    np.testing.assert_allclose(tensor.to_numpy(again(tx)[0]), want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("attrs", [dict(mode="linear"),
                                   dict(mode="cubic", coordinate_transformation_mode="align_corners"),
                                   dict(mode="nearest", coordinate_transformation_mode="half_pixel",
                                        nearest_mode="round_prefer_ceil")])
def test_resize_modes_agree_with_onnxruntime_and_train(attrs):
    x = _numbers((1, 2, 3, 4), 40)
    node = onnx.helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
    graph = onnx.helper.make_graph([node], "g",
                                   [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 3, 4])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2, 6, 3])],
                                   [onnx.numpy_helper.from_array(np.array([1, 1, 2, 0.75], np.float32), "scales")])
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    want = run_ort(proto, x)[0]
    autograd.training = True
    tx = tensor.Tensor(data=x, requires_grad=True, stores_grad=True)
    rep = sonnx.prepare(proto)
    rep.is_graph = True
    y = rep.run([tx])[0]
    np.testing.assert_allclose(tensor.to_numpy(y), want, rtol=1e-5, atol=1e-5)
    grads = autograd.gradients(autograd.reduce_sum(y, None, 0))  # through the interpolation matrices
    assert grads[tx].shape == tx.shape
