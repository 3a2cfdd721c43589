"""layer.CudnnRNN on the GPU through cuDNN's RNN API (csrc/cuda/cudnn_rnn.h) against the same layer on the CPU (our
own LSTM / GRU / RNN of autograd operators, itself checked against torch in tests/unit/test_cudnn_rnn.py), with the
same flat weight W, inputs and initial states: outputs and the gradients of x, W, hx and cx, for every mode, one and
two layers, one and two directions, both data layouts, padded sequences, float64 / float32 / float16; cuDNN's weight
layout against ours; an IMDB-style classifier (SINGA's examples/rnn) trained a few steps on each device.

Inputs are made on the host and copied, so both sides see identical bits. Tolerances are relative to the largest
reference value: |gpu - cpu| <= tol * max|cpu|. float16 runs on the GPU in float16 (cuDNN computes in float32) and is
compared with the CPU in float32 on the same float16 values. Marked `gpu`; skipped (with the reason) where cuDNN
cannot be loaded: install nvidia-cudnn-cu13 (or -cu12)."""
import zlib

import numpy as np
import pytest

from singa_lite import _core, autograd, device, layer, model, opt, tensor

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("training")]  # training: tests/conftest.py

NP = {"float16": np.float16, "float32": np.float32, "float64": np.float64}
TOL = {"float16": 3e-2, "float32": 1e-4, "float64": 1e-10}
MODES = ["lstm", "gru", "tanh", "relu"]


@pytest.fixture(scope="module")
def gpu():
    if not _core.cudnn_available():
        pytest.skip(f"cuDNN not usable: {_core.cudnn_unavailable_reason()}")
    return device.create_cuda_gpu_on(0)


@pytest.fixture
def cpu():
    return device.get_default_device()


def on(dev, a, dtype, grad=True):
    return tensor.Tensor(data=np.asarray(a).astype(NP[dtype]), device=dev, requires_grad=grad, stores_grad=grad)


def npy(t):
    return tensor.to_numpy(t).astype(np.float64)


def close(got, ref, tol, what):
    scale = max(float(np.abs(ref).max()), 1e-30)
    err = float(np.abs(got - ref).max())
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    assert err <= tol * scale, f"{what}: max |gpu - cpu| = {err:.3g} > {tol} * {scale:.3g}"


def run(dev, dtype, spec, W, x, hx, cx, R, lengths=None):
    """(path, y, {name: grad}) of sum(y * R) for a CudnnRNN(**spec) with flat weight W on `dev`."""
    rnn = layer.CudnnRNN(**spec)
    xt = on(dev, x, dtype)
    args = [xt] + [on(dev, s, dtype) for s in (hx, cx) if s is not None]
    kw = {} if lengths is None else {"seq_lengths": tensor.from_numpy(np.asarray(lengths, np.int32))}
    rnn(*args, **kw)  # creates W on dev
    rnn.W.copy_from_numpy(np.asarray(W).astype(NP[dtype]))
    y = rnn(*args, **kw)
    path = rnn.path
    Rt = on(dev, R, dtype, grad=False)
    grads = autograd.gradients(autograd.reduce_sum(autograd.mul(y, Rt)))
    named = {"x": xt, "W": rnn.W}
    if hx is not None:
        named["hx"] = args[1]
    if cx is not None:
        named["cx"] = args[2]
    return path, npy(y), {k: npy(grads[t]) for k, t in named.items()}


def case(rng, mode, num_layers, bidirectional, batch_first, B=3, T=5, F=4, H=6, states=True):
    D = 2 if bidirectional else 1
    spec = dict(hidden_size=H, rnn_mode=mode, num_layers=num_layers, bidirectional=bidirectional,
                batch_first=batch_first, return_sequences=True)
    n = layer.CudnnRNN(**spec)
    W = rng.uniform(-0.5, 0.5, n.weights_size(F))
    x = rng.standard_normal((B, T, F) if batch_first else (T, B, F))
    hx = rng.standard_normal((num_layers * D, B, H)) * 0.5 if states else None
    cx = rng.standard_normal((num_layers * D, B, H)) * 0.5 if states and mode == "lstm" else None
    R = rng.standard_normal((B, T, H * D) if batch_first else (T, B, H * D))
    return spec, W, x, hx, cx, R


def compare(gpu, cpu, dtype, spec, W, x, hx, cx, R, lengths=None):
    ref_dtype = "float32" if dtype == "float16" else dtype
    if dtype == "float16":  # the CPU sees the float16 values, in float32
        W, x, hx, cx, R = (None if a is None else np.asarray(a).astype(np.float16) for a in (W, x, hx, cx, R))
    p_cpu, y_cpu, g_cpu = run(cpu, ref_dtype, spec, W, x, hx, cx, R, lengths)
    p_gpu, y_gpu, g_gpu = run(gpu, dtype, spec, W, x, hx, cx, R, lengths)
    assert (p_cpu, p_gpu) == ("operators", "cudnn")
    close(y_gpu, y_cpu, TOL[dtype], "y")
    for k in g_cpu:
        close(g_gpu[k], g_cpu[k], TOL[dtype], f"d{k}")
    return y_gpu


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("batch_first", [True, False])
def test_matches_cpu_path(gpu, cpu, mode, num_layers, bidirectional, batch_first):
    rng = np.random.default_rng(zlib.crc32(f"{mode}{num_layers}{bidirectional}{batch_first}".encode()))
    compare(gpu, cpu, "float32", *case(rng, mode, num_layers, bidirectional, batch_first))


@pytest.mark.parametrize("dtype", ["float64", "float16"])
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_other_dtypes(gpu, cpu, dtype, mode):
    rng = np.random.default_rng(7)
    compare(gpu, cpu, dtype, *case(rng, mode, 2, True, True))


@pytest.mark.parametrize("mode", MODES)
def test_without_initial_states(gpu, cpu, mode):
    rng = np.random.default_rng(8)
    compare(gpu, cpu, "float32", *case(rng, mode, 2, True, True, states=False))


@pytest.mark.parametrize("batch_first", [True, False])
def test_padded_sequences(gpu, cpu, batch_first):
    """use_mask: padded steps output zeros and keep the state, in both directions, on both paths."""
    rng = np.random.default_rng(9)
    spec, W, x, hx, cx, R = case(rng, "lstm", 2, True, batch_first, B=4, T=6)
    spec["use_mask"] = True
    lengths = [6, 2, 4, 1]
    y = compare(gpu, cpu, "float32", spec, W, x, hx, cx, R, lengths)
    for b, n in enumerate(lengths):
        pad = y[b, n:] if batch_first else y[n:, b]
        assert (pad == 0).all()


@pytest.mark.parametrize("bidirectional", [False, True])
def test_last_step_output(gpu, cpu, bidirectional):
    """return_sequences=False: y[-1] of the sequence (SINGA's imdb model reads this)."""
    rng = np.random.default_rng(10)
    spec, W, x, hx, cx, _ = case(rng, "lstm", 1, bidirectional, True)
    spec["return_sequences"] = False
    R = rng.standard_normal((3, 6 * (2 if bidirectional else 1)))
    compare(gpu, cpu, "float32", spec, W, x, hx, cx, R)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_layers,bidirectional", [(1, False), (2, True), (3, False)])
def test_weight_layout_is_ours(gpu, mode, num_layers, bidirectional):
    """cudnnGetRNNWeightParams puts every matrix and bias where W's layout (the layer's param_layout) has it, so W
    goes to cuDNN without a copy. Should a cuDNN version pack differently, the ops convert block by block (and
    test_matches_cpu_path still holds); this test then says so."""
    F = 5
    rnn = layer.CudnnRNN(hidden_size=7, rnn_mode=mode, num_layers=num_layers, bidirectional=bidirectional)
    info = _core.cudnn_rnn_weight_layout(mode, 7, num_layers, bidirectional, F, _core.DType.float32,
                                         _core.Device("cuda:0"))
    assert info["ours_numel"] == rnn.weights_size(F)
    G, H = rnn.gates, 7
    ours = {(p, kind): off for p, kind, off, _ in rnn.param_layout(F)}
    for b in info["blocks"]:
        p, lin = b["pseudo_layer"], b["lin_id"]
        kind, g = ("W", lin) if lin < G else ("R", lin - G)
        width = b["matrix_numel"] // H
        assert b["ours_matrix"] == ours[p, kind] + g * H * width
        assert b["ours_bias"] == ours[p, "bW" if lin < G else "bR"] + g * H
    moved = [b for b in info["blocks"] if (b["cudnn_matrix"], b["cudnn_bias"]) != (b["ours_matrix"], b["ours_bias"])]
    assert info["same"] and not moved and info["cudnn_numel"] == info["ours_numel"], (
        f"cuDNN {_core.cudnn_version()} packs RNN weights differently (weight space {info['cudnn_numel']} elements, "
        f"ours {info['ours_numel']}; first moved blocks {moved[:3]}): the ops copy W in and dW out per call")


def test_second_backward_over_the_same_graph(gpu):
    """The graph outlives its backward (SINGA's gan example differentiates it twice); cuDNN's backward writes into
    its reserve space, which CudnnRNNOp therefore hands it a copy of: both backwards give the same gradients."""
    rng = np.random.default_rng(14)
    spec, W, x, hx, cx, R = case(rng, "lstm", 2, True, True)
    rnn = layer.CudnnRNN(**spec)
    xt, ht, ct = (on(gpu, a, "float32") for a in (x, hx, cx))
    rnn(xt, ht, ct)
    rnn.W.copy_from_numpy(W.astype(np.float32))
    loss = autograd.reduce_sum(autograd.mul(rnn(xt, ht, ct), on(gpu, R, "float32", grad=False)))
    assert rnn.path == "cudnn"
    first = {id(p): npy(g) for p, g in autograd.gradients(loss).items()}
    second = {id(p): npy(g) for p, g in autograd.gradients(loss).items()}
    assert first.keys() == second.keys() and len(first) == 4
    for k in first:
        np.testing.assert_array_equal(second[k], first[k])


def test_inference_and_dropout_paths(gpu, cpu):
    rng = np.random.default_rng(11)
    spec, W, x, hx, cx, _ = case(rng, "gru", 2, False, True)
    spec["dropout"] = 0.5
    rnn = layer.CudnnRNN(**spec)
    xt = on(gpu, x, "float32", grad=False)
    rnn(xt)
    rnn.W.copy_from_numpy(W.astype(np.float32))
    y_train = rnn(xt)
    assert rnn.path == "operators"  # dropout between layers while training: cuDNN would draw its own masks
    autograd.training = False
    y_eval = npy(rnn(xt))
    assert rnn.path == "cudnn"
    ref = layer.CudnnRNN(**spec)
    xc = on(cpu, x, "float32", grad=False)
    ref(xc)
    ref.W.copy_from_numpy(W.astype(np.float32))
    close(y_eval, npy(ref(xc)), TOL["float32"], "y (inference)")
    assert y_train.shape == y_eval.shape


def test_bad_arguments_are_refused_clearly(gpu):
    rnn = layer.CudnnRNN(hidden_size=4, rnn_mode="lstm")
    x = on(gpu, np.zeros((2, 3, 5)), "float32")
    rnn(x)
    with pytest.raises(ValueError, match=r"\(1, 2, 4\)"):
        rnn(x, on(gpu, np.zeros((1, 3, 4)), "float32"))
    with pytest.raises(ValueError, match="cpu"):
        rnn(x, on(device.get_default_device(), np.zeros((1, 2, 4)), "float32"))
    w = rnn.W.data
    with pytest.raises(ValueError, match="flat weight"):
        _core.cudnn_rnn_forward(x.data, w.slice(0, 0, 10), None, None, "lstm", 4, 1, False, True, [], False)
    with pytest.raises(ValueError, match="sequence length"):
        _core.cudnn_rnn_forward(x.data, w, None, None, "lstm", 4, 1, False, True, [3, 4], False)
    y, hy, cy, reserve = _core.cudnn_rnn_forward(x.data, w, None, None, "lstm", 4, 1, False, True, [], True)
    assert reserve is not None and cy is not None and tuple(hy.shape) == (1, 2, 4)
    with pytest.raises(ValueError, match="reserve"):
        _core.cudnn_rnn_backward(x.data, w, None, None, y, y, reserve.slice(0, 0, 1), "lstm", 4, 1, False, True, [],
                                 True)
    with pytest.raises(ValueError, match="mode"):
        _core.cudnn_rnn_forward(x.data, w, None, None, "lsmt", 4, 1, False, True, [], False)


class _Classifier(model.Model):
    """The shape of SINGA's examples/rnn/imdb_model.py: a (bidirectional) LSTM over embedded words, its last step
    into a linear layer."""

    def __init__(self):
        super().__init__()
        self.rnn = layer.CudnnRNN(hidden_size=16, batch_first=True, rnn_mode="lstm", return_sequences=False,
                                  num_layers=1, dropout=0.9, bidirectional=True)
        self.fc = layer.Linear(2)

    def forward(self, x):
        return self.fc(self.rnn(x))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = autograd.softmax_cross_entropy(out, y)
        self.optimizer(loss)
        return out, loss


def test_imdb_style_training_matches_cpu(gpu, cpu):
    rng = np.random.default_rng(12)
    x = rng.standard_normal((16, 7, 8)).astype(np.float32)
    y = (x[:, :, 0].sum(axis=1) > 0).astype(np.int32)
    losses = {}
    for name, dev in (("cpu", cpu), ("gpu", gpu)):
        m = _Classifier()
        m.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
        xt, yt = on(dev, x, "float32", grad=False), tensor.Tensor(data=y, device=dev, requires_grad=False)
        m.compile([xt], is_train=True, use_graph=False)
        for p, init in zip((m.rnn.W, m.fc.W, m.fc.b), _initial(m, rng_seed=13)):
            p.copy_from_numpy(init)
        m.train()
        losses[name] = [float(npy(m(xt, yt)[1]).ravel()[0]) for _ in range(8)]
        assert m.rnn.path == ("cudnn" if name == "gpu" else "operators")
    np.testing.assert_allclose(losses["gpu"], losses["cpu"], rtol=1e-3, atol=1e-4)
    assert losses["gpu"][-1] < losses["gpu"][0]


def _initial(m, rng_seed):
    rng = np.random.default_rng(rng_seed)
    return [rng.uniform(-0.25, 0.25, tuple(p.shape)).astype(np.float32) for p in (m.rnn.W, m.fc.W, m.fc.b)]
