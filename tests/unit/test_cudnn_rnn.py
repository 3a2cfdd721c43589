"""layer.CudnnRNN on the CPU: cuDNN's flat weight layout and equations (checked against torch's nn.LSTM / GRU /
RNN, which use the same layout, and against our own layer.LSTM), masks, shapes, errors, and that it trains."""
import numpy as np
import pytest

from singa_lite import autograd, layer, model, opt, tensor

TORCH_NAMES = {"W": "weight_ih", "R": "weight_hh", "bW": "bias_ih", "bR": "bias_hh"}


@pytest.fixture(autouse=True)
def _training_off_after():
    yield
    autograd.training = False


def t(a, dtype=np.float32):
    return tensor.from_numpy(np.asarray(a, dtype))


def npy(x):
    return tensor.to_numpy(x)


def blocks(rnn, flat, input_size):
    """{(pseudo_layer, kind): array} from the flat W."""
    return {(p, kind): flat[off:off + int(np.prod(shape))].reshape(shape)
            for p, kind, off, shape in rnn.param_layout(input_size)}


@pytest.mark.parametrize("mode", ["lstm", "gru", "tanh", "relu"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_matches_torch_outputs_and_gradients(mode, bidirectional, num_layers):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 4)).astype(np.float32)  # (batch, seq, features)
    h0 = rng.standard_normal((num_layers * (2 if bidirectional else 1), 3, 6)).astype(np.float32)
    rnn = layer.CudnnRNN(hidden_size=6, rnn_mode=mode, num_layers=num_layers, bidirectional=bidirectional,
                         batch_first=True, return_sequences=True)
    autograd.training = True
    y = rnn(t(x), t(h0))
    if mode == "lstm":
        ref = torch.nn.LSTM(4, 6, num_layers=num_layers, bidirectional=bidirectional, batch_first=True)
    elif mode == "gru":
        ref = torch.nn.GRU(4, 6, num_layers=num_layers, bidirectional=bidirectional, batch_first=True)
    else:
        ref = torch.nn.RNN(4, 6, num_layers=num_layers, bidirectional=bidirectional, batch_first=True,
                           nonlinearity=mode)
    dirs = 2 if bidirectional else 1
    W = npy(rnn.W)
    assert W.size == sum(p.numel() for p in ref.parameters())  # cuDNN's weights_size
    for (p, kind), a in blocks(rnn, W, 4).items():
        name = f"{TORCH_NAMES[kind]}_l{p // dirs}" + ("_reverse" if p % dirs else "")
        getattr(ref, name).data = torch.from_numpy(a.copy())
    th0 = torch.from_numpy(h0)
    ty = ref(torch.from_numpy(x), (th0, torch.zeros_like(th0)) if mode == "lstm" else th0)[0]
    np.testing.assert_allclose(npy(y), ty.detach().numpy(), rtol=1e-5, atol=1e-6)
    g = npy(autograd.gradients(autograd.reduce_sum(autograd.mul(y, y)))[rnn.W])
    (ty * ty).sum().backward()
    for (p, kind), a in blocks(rnn, g, 4).items():
        name = f"{TORCH_NAMES[kind]}_l{p // dirs}" + ("_reverse" if p % dirs else "")
        np.testing.assert_allclose(a, getattr(ref, name).grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


def test_lstm_matches_layer_lstm():
    rng = np.random.default_rng(1)
    T, B, I, H = 4, 2, 3, 5
    xs = [t(rng.standard_normal((B, I))) for _ in range(T)]
    h0, c0 = t(rng.standard_normal((B, H))), t(rng.standard_normal((B, H)))
    lstm = layer.LSTM(I, H)
    hs, h, c = lstm(xs, (h0, c0))
    p = {k: npy(v) for k, v in lstm.__dict__.items() if isinstance(v, tensor.Tensor) and v.stores_grad}
    for k in p:  # our LSTM starts at N(0, 0.01) and zero biases; make the comparison sensitive to every one
        p[k] = rng.standard_normal(p[k].shape).astype(np.float32)
        getattr(lstm, k).copy_from_numpy(p[k])
    hs, h, c = lstm(xs, (h0, c0))
    rnn = layer.CudnnRNN(hidden_size=H, rnn_mode="lstm", batch_first=False, return_sequences=True)
    x = t(np.stack([npy(v) for v in xs]))  # (seq, batch, features)
    rnn(x)  # creates W
    order = "ifgo"  # cuDNN's gate order
    flat = np.concatenate([np.concatenate([p[f"Wx_{g}"].T for g in order]).ravel(),
                           np.concatenate([p[f"Wh_{g}"].T for g in order]).ravel(),
                           np.concatenate([p[f"Bx_{g}"] for g in order]),
                           np.concatenate([p[f"Bh_{g}"] for g in order])])
    assert flat.size == rnn.W.size()
    rnn.W.copy_from_numpy(flat.astype(np.float32))
    y = rnn(x, t(npy(h0)[None]), t(npy(c0)[None]))
    np.testing.assert_allclose(npy(y), np.stack([npy(v) for v in hs]), rtol=1e-5, atol=1e-6)


def test_last_step_and_layouts():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 3, 4)).astype(np.float32)  # (seq, batch, features)
    seq = layer.CudnnRNN(hidden_size=6, rnn_mode="gru", batch_first=False, bidirectional=True)
    last = layer.CudnnRNN(hidden_size=6, rnn_mode="gru", batch_first=False, bidirectional=True,
                          return_sequences=False)
    ys = seq(t(x))
    last(t(x))
    last.W.copy_from_numpy(npy(seq.W))
    assert ys.shape == (5, 3, 12)
    np.testing.assert_allclose(npy(last(t(x))), npy(ys)[-1], rtol=1e-6)  # y[-1], as cuDNN's
    first = layer.CudnnRNN(hidden_size=6, rnn_mode="gru", batch_first=True)
    first(t(np.swapaxes(x, 0, 1)))
    first.W.copy_from_numpy(npy(seq.W)[:first.W.size()])  # pseudo-layer 0 (forward) comes first
    # its weights unidirectional: the forward half of the bidirectional output
    np.testing.assert_allclose(npy(first(t(np.swapaxes(x, 0, 1)))), np.swapaxes(npy(ys)[:, :, :6], 0, 1),
                               rtol=1e-5, atol=1e-6)


def test_masked_steps_keep_the_state_and_output_zeros():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 6, 4)).astype(np.float32)  # (batch, seq, features)
    lengths = np.array([6, 2, 4])
    rnn = layer.CudnnRNN(hidden_size=5, rnn_mode="lstm", bidirectional=True, use_mask=True)
    y = npy(rnn(t(x), seq_lengths=t(lengths, np.int32)))
    plain = layer.CudnnRNN(hidden_size=5, rnn_mode="lstm", bidirectional=True)
    for b, n in enumerate(lengths):
        plain(t(x[b:b + 1, :n]))  # creates W
        plain.W.copy_from_numpy(npy(rnn.W))
        ref = npy(plain(t(x[b:b + 1, :n])))  # the sequence alone, unpadded
        np.testing.assert_allclose(y[b, :n], ref[0], rtol=1e-5, atol=1e-6)
        assert (y[b, n:] == 0).all()
    with pytest.raises(ValueError, match="lengths in"):
        rnn(t(x), seq_lengths=t([6, 0, 4], np.int32))
    with pytest.raises(TypeError, match="seq_lengths"):
        rnn(t(x))


def test_bad_arguments_are_refused_clearly():
    with pytest.raises(ValueError, match="rnn_mode"):
        layer.CudnnRNN(4, rnn_mode="gur")
    with pytest.raises(ValueError, match="dropout"):
        layer.CudnnRNN(4, dropout=1.0)
    rnn = layer.CudnnRNN(4)
    with pytest.raises(ValueError, match="3-d"):
        rnn(t(np.zeros((2, 3))))
    rnn(t(np.zeros((2, 3, 5))))
    with pytest.raises(ValueError, match="5"):
        rnn(t(np.zeros((2, 3, 7))))
    with pytest.raises(ValueError, match=r"\(1, 2, 4\)"):
        rnn(t(np.zeros((2, 3, 5))), t(np.zeros((2, 4))))


class _Classifier(model.Model):
    """The shape of SINGA's examples/rnn/imdb_model.py."""

    def __init__(self):
        super().__init__()
        self.rnn = layer.CudnnRNN(hidden_size=8, batch_first=True, rnn_mode="lstm", return_sequences=False,
                                  num_layers=2, dropout=0.1, bidirectional=True)
        self.fc = layer.Linear(2)

    def forward(self, x):
        return self.fc(self.rnn(x))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = autograd.softmax_cross_entropy(out, y)
        self.optimizer(loss)
        return out, loss


def test_trains():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((16, 5, 3)).astype(np.float32)
    y = (x[:, :, 0].sum(axis=1) > 0).astype(np.int32)  # the sign of a sum over the sequence
    m = _Classifier()
    m.set_optimizer(opt.SGD(lr=0.1, momentum=0.9))
    m.train()
    losses = [float(npy(m(t(x), t(y, np.int32))[1])[0]) for _ in range(40)]
    assert losses[-1] < 0.5 * losses[0], losses
    m.eval()
    assert (npy(m(t(x))).argmax(axis=1) == y).mean() >= 0.9


def test_cpu_inputs_take_the_operator_path():
    # cuDNN's path needs a CUDA input (tests/gpu/test_cudnn_rnn_gpu.py runs it); on the CPU the operators run
    rnn = layer.CudnnRNN(hidden_size=3, rnn_mode="gru")
    assert rnn.path is None
    rnn(t(np.zeros((2, 4, 5))))
    assert rnn.path == "operators"
