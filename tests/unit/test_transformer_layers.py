"""layer.LayerNorm, layer.MultiHeadAttention and layer.TransformerEncoderLayer: values and gradients against
numpy references and against PyTorch with the same weights (float64), masks, dropout, and clear errors for bad
input. The operators underneath (ops.layer_norm, ops.scaled_dot_product_attention) are also cases of
autograd_cases.py (finite differences, float16)."""
import numpy as np
import pytest

from singa_lite import autograd, layer, tensor
from autograd_cases import np_attention, np_layer_norm

pytestmark = pytest.mark.usefixtures("training")


def t64(a, grad=True):
    return tensor.Tensor(data=np.asarray(a, np.float64), requires_grad=grad, stores_grad=grad)


def as64(lay):
    for p in lay.get_params().values():
        p.to_type(tensor.float64)
    return lay


def grads_of(y, weights, params):
    """Gradients of sum(y * weights) for the given Tensors (inputs or parameters), as numpy arrays."""
    g = autograd.gradients(y, tensor.Tensor(data=weights, requires_grad=False))
    return [tensor.to_numpy(g[p]) for p in params]


# ---------------------------------------------------------------- LayerNorm
def test_layer_norm_values_and_gradients_against_numpy():
    rng = np.random.default_rng(0)
    ln = as64(layer.LayerNorm(6, eps=1e-6))
    gamma, beta = rng.standard_normal(6), rng.standard_normal(6)
    ln.set_params({"Gamma": gamma, "Beta": beta})
    a = rng.standard_normal((3, 4, 6)) * 3 + 1
    x = t64(a)
    y = ln(x)
    np.testing.assert_allclose(tensor.to_numpy(y), np_layer_norm(a, gamma, beta, 1, 1e-6), rtol=1e-12, atol=1e-12)
    w = rng.standard_normal(a.shape)
    dx, dg, db = grads_of(y, w, [x, ln.Gamma, ln.Beta])
    xhat = np_layer_norm(a, 1.0, 0.0, 1, 1e-6)
    np.testing.assert_allclose(dg, (w * xhat).sum(axis=(0, 1)), rtol=1e-12)
    np.testing.assert_allclose(db, w.sum(axis=(0, 1)), rtol=1e-12)
    # dx from the closed form: rstd * (g - mean(g) - xhat * mean(g * xhat)), g = w * gamma
    g = w * gamma
    rstd = 1 / np.sqrt(a.var(axis=-1, keepdims=True) + 1e-6)
    want = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    np.testing.assert_allclose(dx, want, rtol=1e-10, atol=1e-12)


def test_layer_norm_options_and_names():
    ln = layer.LayerNorm((3, 4))
    assert set(ln.get_params()) == {"Gamma", "Beta"} and ln.Gamma.shape == (3, 4)
    assert set(layer.LayerNorm(4, bias=False).get_params()) == {"Gamma"}
    plain = as64(layer.LayerNorm(4, elementwise_affine=False))
    assert plain.get_params() == {}
    a = np.random.default_rng(1).standard_normal((5, 4))
    np.testing.assert_allclose(tensor.to_numpy(plain(t64(a))), np_layer_norm(a, 1.0, 0.0, 1), atol=1e-12)


def test_layer_norm_float32_is_close_to_float64():
    a = np.random.default_rng(2).standard_normal((2, 128, 256)) * 10 + 5
    y = layer.LayerNorm(256)(tensor.from_numpy(a.astype(np.float32)))
    assert y.dtype == tensor.float32
    np.testing.assert_allclose(tensor.to_numpy(y), np_layer_norm(a, 1.0, 0.0, 1), atol=2e-5)


def test_layer_norm_bad_input():
    with pytest.raises(ValueError, match=r"last axes must be \(8,\), got shape \(2, 6\)"):
        layer.LayerNorm(8)(tensor.from_numpy(np.ones((2, 6), np.float32)))
    with pytest.raises(ValueError, match="last axes must be"):
        layer.LayerNorm((2, 8))(tensor.from_numpy(np.ones((8,), np.float32)))
    with pytest.raises(TypeError, match="normalized_shape must be an int"):
        layer.LayerNorm(2.5)
    with pytest.raises(ValueError, match="must be positive"):
        layer.LayerNorm(0)
    with pytest.raises(ValueError, match="eps must be a positive number"):
        layer.LayerNorm(4, eps=-1.0)
    with pytest.raises(TypeError, match="layer_norm: x must be a tensor.Tensor"):
        autograd.layer_norm(np.ones(4), 4)


# ---------------------------------------------------------------- MultiHeadAttention
def mha_reference(m, q, k, v, bias=0.0):
    w_in, b_in = tensor.to_numpy(m.in_proj_W), tensor.to_numpy(m.in_proj_b)
    e = m.embed_dim
    qp, kp, vp = q @ w_in[:, :e] + b_in[:e], k @ w_in[:, e:2 * e] + b_in[e:2 * e], v @ w_in[:, 2 * e:] + b_in[2 * e:]
    o = np_attention(qp, kp, vp, m.num_heads, bias)
    return o @ tensor.to_numpy(m.out_proj.W) + tensor.to_numpy(m.out_proj.b)


def test_multi_head_attention_against_numpy_self_and_cross():
    rng = np.random.default_rng(3)
    m = as64(layer.MultiHeadAttention(8, 2))
    m.set_params({"in_proj_b": rng.standard_normal(24), "out_proj.b": rng.standard_normal(8)})
    a = rng.standard_normal((2, 5, 8))
    y, w = m(t64(a))
    assert w.shape == (2, 2, 5, 5)
    np.testing.assert_allclose(tensor.to_numpy(y), mha_reference(m, a, a, a), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(tensor.to_numpy(w).sum(-1), np.ones((2, 2, 5)), rtol=1e-12)
    kv = rng.standard_normal((2, 7, 8))
    y, w = m(t64(a), t64(kv), need_weights=False)
    assert w is None
    np.testing.assert_allclose(tensor.to_numpy(y), mha_reference(m, a, kv, kv), rtol=1e-10, atol=1e-12)


def test_multi_head_attention_masks():
    rng = np.random.default_rng(4)
    m = as64(layer.MultiHeadAttention(6, 3))
    a = rng.standard_normal((2, 4, 6))
    pad = np.array([[False, False, True, True], [False, False, False, False]])
    blocked = np.triu(np.ones((4, 4), bool), 1) | pad[:, None, None, :]
    want = mha_reference(m, a, a, a, np.where(blocked, -np.inf, 0.0))
    y, w = m(t64(a), key_padding_mask=tensor.from_numpy(pad), is_causal=True)
    np.testing.assert_allclose(tensor.to_numpy(y), want, rtol=1e-10, atol=1e-12)
    assert (tensor.to_numpy(w)[np.broadcast_to(blocked, w.shape)] == 0).all()
    # the same through attn_mask in SINGA's (batch, Lq, Lk) 0/1 integer form, and through causal=True
    singa_mask = (np.triu(np.ones((4, 4)), 1)[None] + pad[:, None, :] > 0).astype(np.int32)
    y2, _ = m(t64(a), attn_mask=tensor.from_numpy(singa_mask))
    np.testing.assert_allclose(tensor.to_numpy(y2), want, rtol=1e-10, atol=1e-12)
    causal = as64(layer.MultiHeadAttention(6, 3, causal=True))
    causal.set_params({k: tensor.to_numpy(v) for k, v in m.get_params().items()})
    y3, _ = causal(t64(a), key_padding_mask=pad)
    np.testing.assert_allclose(tensor.to_numpy(y3), want, rtol=1e-10, atol=1e-12)
    # a float mask is added to the scores (PyTorch's float masks), per (batch * heads)
    add = rng.standard_normal((6, 4, 4))
    y4, _ = m(t64(a), attn_mask=add)
    np.testing.assert_allclose(tensor.to_numpy(y4), mha_reference(m, a, a, a, add.reshape(2, 3, 4, 4)),
                               rtol=1e-10, atol=1e-12)


def test_attention_dropout_trains_and_is_identity_in_evaluation():
    m = layer.MultiHeadAttention(16, 4, dropout=0.5)
    x = tensor.from_numpy(np.random.default_rng(5).standard_normal((2, 32, 16)).astype(np.float32))
    _, w = m(x)
    wn = tensor.to_numpy(w)
    zeros = (wn == 0).mean()
    assert 0.4 < zeros < 0.6, zeros  # 2 * 4 * 32 * 32 weights, each zeroed with probability 0.5
    kept = m(x)[1]
    assert not np.array_equal(tensor.to_numpy(kept), wn)  # a new mask each call
    autograd.training = False
    y1, w1 = m(x)
    y2, _ = m(x)
    np.testing.assert_array_equal(tensor.to_numpy(y1), tensor.to_numpy(y2))
    np.testing.assert_allclose(tensor.to_numpy(w1).sum(-1), 1.0, rtol=1e-5)


def test_attention_weights_get_gradients():
    # need_weights' output is differentiable: a loss on the weights alone reaches the projections
    m = as64(layer.MultiHeadAttention(4, 2))
    x = t64(np.random.default_rng(6).standard_normal((1, 3, 4)))
    _, w = m(x)
    g = autograd.gradients(autograd.reduce_sum(autograd.mul(w, w)))
    assert m.in_proj_W in g and np.abs(tensor.to_numpy(g[m.in_proj_W])).sum() > 0


def test_multi_head_attention_bad_input():
    with pytest.raises(ValueError, match="num_heads 3 must divide embed_dim 8"):
        layer.MultiHeadAttention(8, 3)
    with pytest.raises(TypeError, match="embed_dim must be an int"):
        layer.MultiHeadAttention(8.0, 2)
    with pytest.raises(ValueError, match=r"dropout must be a probability in \[0, 1\)"):
        layer.MultiHeadAttention(8, 2, dropout=1.0)
    m = layer.MultiHeadAttention(8, 2)
    x = tensor.from_numpy(np.ones((2, 5, 8), np.float32))
    with pytest.raises(ValueError, match=r"query must be \(batch, sequence, embed_dim=8\), got shape \(2, 5, 6\)"):
        m(tensor.from_numpy(np.ones((2, 5, 6), np.float32)))
    with pytest.raises(ValueError, match="must share the batch"):
        m(x, tensor.from_numpy(np.ones((3, 5, 8), np.float32)))
    with pytest.raises(ValueError, match=r"attn_mask has shape \(4, 4\); expected \(Lq, Lk\) = \(5, 5\)"):
        m(x, attn_mask=np.zeros((4, 4), bool))
    with pytest.raises(ValueError, match=r"key_padding_mask has shape \(2, 4\), expected \(batch, Lk\)"):
        m(x, key_padding_mask=np.zeros((2, 4), bool))
    with pytest.raises(TypeError, match="key_padding_mask must be boolean or integer"):
        m(x, key_padding_mask=np.zeros((2, 5), np.float32))
    with pytest.raises(TypeError, match="attn_mask must be a tensor.Tensor or a numpy array"):
        m(x, attn_mask=[[0] * 5] * 5)


# ---------------------------------------------------------------- TransformerEncoderLayer
def test_singa_example_keywords():
    m = layer.MultiHeadAttention(d_model=8, n_head=2)
    assert (m.embed_dim, m.num_heads, m.head_dim) == (8, 2, 4)
    assert layer.TransformerEncoderLayer(8, n_head=4, dim_feedforward=16).self_attn.num_heads == 4
    with pytest.raises(TypeError, match="give embed_dim \\(or d_model\\) once"):
        layer.MultiHeadAttention(8, 2, d_model=8)
    with pytest.raises(TypeError, match="missing the required argument num_heads \\(or n_head\\)"):
        layer.MultiHeadAttention(8)


def test_encoder_layer_names_and_bad_arguments():
    enc = layer.TransformerEncoderLayer(8, 2, 16)
    assert set(enc.get_params()) == {
        "self_attn.in_proj_W", "self_attn.in_proj_b", "self_attn.out_proj.W", "self_attn.out_proj.b",
        "linear1.W", "linear1.b", "linear2.W", "linear2.b", "norm1.Gamma", "norm1.Beta", "norm2.Gamma",
        "norm2.Beta"}
    with pytest.raises(ValueError, match="activation must be 'relu', 'gelu' or a function"):
        layer.TransformerEncoderLayer(8, 2, activation="swish")
    with pytest.raises(ValueError, match="num_heads 3 must divide embed_dim 8"):
        layer.TransformerEncoderLayer(8, 3)
    with pytest.raises(ValueError, match=r"src must be \(batch, sequence, d_model=8\), got shape \(2, 3, 4\)"):
        enc(tensor.from_numpy(np.ones((2, 3, 4), np.float32)))


def test_encoder_layer_trains():
    # a few SGD steps on a fixed batch lower the loss: every parameter is wired into the graph
    from singa_lite import opt

    rng = np.random.default_rng(7)
    enc, head = layer.TransformerEncoderLayer(16, 4, 32, dropout=0.0), layer.Linear(16, 3)
    x = tensor.from_numpy(rng.standard_normal((4, 6, 16)).astype(np.float32))
    y = tensor.from_numpy(rng.integers(0, 3, 24).astype(np.int32))
    sgd = opt.SGD(lr=0.05, momentum=0.9)
    losses = []
    for _ in range(15):
        out = autograd.reshape(head(enc(x)), [-1, 3])
        loss = autograd.softmax_cross_entropy(out, y)
        losses.append(float(tensor.to_numpy(loss)[0]))
        sgd(loss)
    assert losses[-1] < 0.5 * losses[0], losses


# ---------------------------------------------------------------- against PyTorch, same weights
TORCH_NAMES = {"in_proj_W": "in_proj_weight", "in_proj_b": "in_proj_bias", "W": "weight", "b": "bias",
               "Gamma": "weight", "Beta": "bias"}


def torch_name(name: str) -> str:
    head, _, last = name.rpartition(".")
    return f"{head}.{TORCH_NAMES[last]}" if head else TORCH_NAMES[last]


def copy_from_torch(ours, theirs):
    """Our layer's parameters from a torch module's (matrices transposed: ours are (in, out))."""
    sd = {k: v.detach().double().numpy() for k, v in theirs.state_dict().items()}
    ours.set_params({name: sd[torch_name(name)].T if p.ndim() == 2 else sd[torch_name(name)]
                     for name, p in ours.get_params().items()})


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_torch(norm_first, activation):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    theirs = torch.nn.TransformerEncoderLayer(12, 3, 20, dropout=0.0, activation=activation, batch_first=True,
                                              norm_first=norm_first).double()
    ours = as64(layer.TransformerEncoderLayer(12, 3, 20, dropout=0.0, activation=activation, norm_first=norm_first))
    copy_from_torch(ours, theirs)
    rng = np.random.default_rng(8)
    a = rng.standard_normal((2, 5, 12))
    mask = np.triu(np.ones((5, 5), bool), 1)
    pad = np.array([[False] * 4 + [True], [False] * 5])
    x = t64(a)
    y = ours(x, src_mask=mask, src_key_padding_mask=pad)
    xt = torch.tensor(a, requires_grad=True)
    yt = theirs(xt, src_mask=torch.tensor(mask), src_key_padding_mask=torch.tensor(pad))
    np.testing.assert_allclose(tensor.to_numpy(y), yt.detach().numpy(), rtol=1e-9, atol=1e-12)
    w = rng.standard_normal(a.shape)
    params = ours.get_params()
    got = grads_of(y, w, [x] + list(params.values()))
    (yt * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(got[0], xt.grad.numpy(), rtol=1e-9, atol=1e-12)
    tp = dict(theirs.named_parameters())
    for name, g in zip(params, got[1:]):
        want = tp[torch_name(name)].grad.numpy()
        np.testing.assert_allclose(g, want.T if g.ndim == 2 else want, rtol=1e-8, atol=1e-11, err_msg=name)


def test_multi_head_attention_matches_torch_cross_attention_and_sequence_first():
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    theirs = torch.nn.MultiheadAttention(8, 4).double()  # sequence first, PyTorch's default
    ours = as64(layer.MultiHeadAttention(8, 4, batch_first=False))
    copy_from_torch(ours, theirs)
    rng = np.random.default_rng(9)
    q, kv = rng.standard_normal((3, 2, 8)), rng.standard_normal((6, 2, 8))
    y, w = ours(t64(q), t64(kv))
    yt, wt = theirs(torch.tensor(q), torch.tensor(kv), torch.tensor(kv))  # weights averaged over heads
    np.testing.assert_allclose(tensor.to_numpy(y), yt.detach().numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(tensor.to_numpy(w).mean(axis=1), wt.detach().numpy(), rtol=1e-9, atol=1e-12)


def test_layer_norm_matches_torch_float32():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(10)
    a = (rng.standard_normal((4, 16, 32)) * 4 + 2).astype(np.float32)
    gamma, beta = rng.standard_normal(32).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    theirs = torch.nn.LayerNorm(32)
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(gamma))
        theirs.bias.copy_(torch.tensor(beta))
    ours = layer.LayerNorm(32)
    ours.set_params({"Gamma": gamma, "Beta": beta})
    x = tensor.Tensor(data=a, requires_grad=True, stores_grad=True)
    y = ours(x)
    xt = torch.tensor(a, requires_grad=True)
    yt = theirs(xt)
    np.testing.assert_allclose(tensor.to_numpy(y), yt.detach().numpy(), rtol=1e-5, atol=1e-5)
    w = rng.standard_normal(a.shape).astype(np.float32)
    dx, dg = grads_of(y, w, [x, ours.Gamma])
    (yt * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dg, theirs.weight.grad.numpy(), rtol=1e-4, atol=1e-3)


# ---------------------------------------------------------------- the fused CPU layer norm
def layer_norm_run(a, gamma, beta, w):
    x = tensor.Tensor(data=a, requires_grad=True, stores_grad=True)
    g = tensor.Tensor(data=gamma, requires_grad=True, stores_grad=True)
    b = tensor.Tensor(data=beta, requires_grad=True, stores_grad=True)
    y = autograd.layer_norm(x, a.shape[-1], g, b)
    return [tensor.to_numpy(y)] + grads_of(y, w, [x, g, b])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_layer_norm_equals_the_composed_passes(monkeypatch, dtype):
    from singa_lite import _core
    from singa_lite.ops import transformer

    if not hasattr(_core, "layer_norm_forward"):
        pytest.skip("this build of _core has no fused layer norm")
    rng = np.random.default_rng(11)
    a = (rng.standard_normal((3, 70, 37)) * 5 + 3).astype(dtype)  # 210 rows: several blocks and a partial one
    gamma, beta, w = (rng.standard_normal(s).astype(dtype) for s in ((37,), (37,), a.shape))
    fused = layer_norm_run(a, gamma, beta, w)
    monkeypatch.setattr(transformer, "_fused", lambda x: False)
    composed = layer_norm_run(a, gamma, beta, w)
    tol = 2e-4 if dtype == np.float32 else 1e-11
    for f, c, what in zip(fused, composed, ("y", "dx", "dgamma", "dbeta")):
        assert f.dtype == dtype
        np.testing.assert_allclose(f, c, rtol=tol, atol=tol, err_msg=what)


def test_fused_layer_norm_gives_the_same_bits_for_any_thread_count():
    from singa_lite import device

    rng = np.random.default_rng(12)
    a = rng.standard_normal((64, 32, 256)).astype(np.float32)
    gamma, beta, w = (rng.standard_normal(s).astype(np.float32) for s in ((256,), (256,), a.shape))
    before = device.get_num_threads()
    try:
        runs = []
        for n in (1, 2, 3):
            device.set_num_threads(n)
            runs.append(layer_norm_run(a, gamma, beta, w))
    finally:
        device.set_num_threads(before)
    for other in runs[1:]:
        for x, y in zip(runs[0], other):
            np.testing.assert_array_equal(x, y)


def test_fused_kernels_give_the_same_bits_on_every_instruction_set_level():
    # layer norm (forward and backward) and the blocked float32 bernoulli_ are compiled per level (cpu/isa.h)
    from singa_lite import _core

    levels = ["baseline", "avx2", "avx512"]
    supported = levels[: levels.index(_core.build_info()["cpu_isa"]["best"]) + 1]
    rng = np.random.default_rng(13)
    a = rng.standard_normal((300, 77)).astype(np.float32)
    gamma, beta, w = (rng.standard_normal(s).astype(np.float32) for s in ((77,), (77,), a.shape))
    dev = tensor.from_numpy(a).data.device
    before = _core.get_isa()
    seen = {}
    try:
        for level in supported:
            _core.set_isa(level)
            ln = layer_norm_run(a, gamma, beta, w)
            mask = _core.Tensor([10_007], _core.DType.float32, dev)
            _core.manual_seed(dev, 3)
            _core.bernoulli_(mask, 0.3)
            drawn = np.asarray(tensor.to_numpy(tensor.Tensor(data=mask)))
            seen[level] = b"".join(x.tobytes() for x in ln) + drawn.tobytes()
    finally:
        _core.set_isa(before)
    assert len(set(seen.values())) == 1, list(seen)
