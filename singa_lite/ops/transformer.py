"""The transformer's operators: layer normalisation over the trailing axes, and scaled dot-product attention over
heads of (batch, sequence, embedding) tensors (what ``layer.LayerNorm``, ``layer.MultiHeadAttention`` and
``layer.TransformerEncoderLayer`` build on).

Each is one operator with its own backward, not a chain of element-wise operators: fewer passes over the
activations and one autograd record instead of a dozen (docs/benchmarks/training.md measures both).

Attention works on the (batch, sequence, heads * head_dim) layout the projections produce: the heads are strided
views of it (GEMM takes the strides, nothing is copied in), so there is no reshape-transpose-copy per head as in a
composed version. Masks are additive biases broadcast to (batch, heads, Lq, Lk): boolean and integer masks mark
the positions that may *not* be attended (True / nonzero), as PyTorch's boolean masks and SINGA's transformer
example do, and become the dtype's most negative finite value; floating masks are added to the scores as they
are (PyTorch's float masks). A query whose every key is masked gets uniform weights (SINGA's fill behaves the
same; PyTorch gives nan there).
"""
from __future__ import annotations

import numbers

import numpy as np

from .. import _core, engine
from ..engine import CTensor, Operator
from ..raw import from_host, to_host
from ..tensor import Tensor

__all__ = ["ScaledDotProductAttention", "_LayerNorm", "attention_mask", "layer_norm", "scaled_dot_product_attention"]


# ---------------------------------------------------------------- layer normalisation
class _LayerNorm(Operator):
    """y = (x - mean) / sqrt(var + eps) * gamma + beta over the last ``ndim`` axes (biased variance, as PyTorch and
    SINGA); gamma and beta, when given, have the shape of those axes."""

    def __init__(self, ndim: int = 1, eps: float = 1e-5):
        super().__init__()
        self.ndim, self.eps = int(ndim), float(eps)

    def forward(self, x, gamma=None, beta=None):
        if x.ndim < self.ndim:
            raise ValueError(f"layer_norm: normalises the last {self.ndim} axes, got an input of shape {x.shape}")
        norm_shape = list(x.shape[x.ndim - self.ndim:])
        for what, p in (("gamma", gamma), ("beta", beta)):
            if p is not None and list(p.shape) != norm_shape:
                raise ValueError(f"layer_norm: {what} has shape {p.shape}, expected the normalised axes' "
                                 f"{tuple(norm_shape)} (input {x.shape})")
        cols = int(np.prod(norm_shape))
        self.xshape, self.has = x.shape, (gamma is not None, beta is not None)
        self.fused = _fused(x)
        if self.fused:  # one pass per row in C++ (csrc/cpu/layer_norm.cpp)
            y, self.mean, self.rstd = _core.layer_norm_forward(x, cols, gamma, beta, self.eps)
            self.x, self.gamma = x, gamma
            return y
        x2 = x.reshape([-1, cols])
        xc = _core.sub(x2, _core.mean(x2, [1], True))
        var = _core.mean(_core.square(xc), [1], True)
        rstd = _core.reciprocal(_core.sqrt(_core.add_scalar(var, self.eps, out=var), out=var), out=var)
        xhat = _core.mul(xc, rstd, out=xc)
        self.xhat, self.rstd = xhat, rstd
        self.gamma = None if gamma is None else gamma.reshape([1, cols])
        y = xhat if gamma is None else _core.mul(xhat, self.gamma)
        if beta is not None:
            y = _core.add(y, beta.reshape([1, cols]), out=None if gamma is None else y)
        return y.reshape(list(x.shape))

    def backward(self, dy):
        if self.fused:
            dx, dg, db = _core.layer_norm_backward(self.x, dy, self.mean, self.rstd, self.gamma, self.has[1])
            norm_shape = list(self.xshape[len(self.xshape) - self.ndim:])
            return (dx,) + tuple(t.reshape(norm_shape) for t in (dg, db) if t is not None)
        xhat, rstd = self.xhat, self.rstd
        cols = xhat.shape[1]
        dy2 = dy.reshape([-1, cols])
        g = dy2 if self.gamma is None else _core.mul(dy2, self.gamma)
        # dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), per row
        gx = _core.mul(g, xhat)
        b = _core.mean(gx, [1], True)
        dx = _core.sub(g, _core.mean(g, [1], True))
        _core.sub(dx, _core.mul(xhat, b, out=gx), out=dx)
        _core.mul(dx, rstd, out=dx)
        out = [dx.reshape(list(self.xshape))]
        norm_shape = list(self.xshape[len(self.xshape) - self.ndim:])
        if self.has[0]:
            out.append(_core.sum(_core.mul(dy2, xhat), [0]).reshape(norm_shape))
        if self.has[1]:
            out.append(_core.sum(dy2, [0]).reshape(norm_shape))
        return tuple(out)


def _fused(x: CTensor) -> bool:
    """Whether the C++ kernel takes x: float32 / float64 on the CPU, in a build that has it."""
    return (x.device.is_cpu() and x.dtype in (_core.DType.float32, _core.DType.float64)
            and hasattr(_core, "layer_norm_forward"))


def layer_norm(x, normalized_shape, gamma=None, beta=None, eps=1e-5):
    """Layer normalisation of x over its trailing axes ``normalized_shape`` (an int or a tuple, which x's last
    axes must equal), scaled by gamma and shifted by beta when given."""
    shape = _shape_tuple(normalized_shape, "layer_norm: normalized_shape")
    if not isinstance(x, Tensor):
        raise TypeError(f"layer_norm: x must be a tensor.Tensor, got {type(x).__name__}")
    if tuple(x.shape[len(x.shape) - len(shape):]) != shape or len(x.shape) < len(shape):
        raise ValueError(f"layer_norm: the input's last axes must be normalized_shape {shape}, got an input of "
                         f"shape {tuple(x.shape)}")
    if beta is not None and gamma is None:
        raise ValueError("layer_norm: beta without gamma is not supported; pass gamma=ones")
    xs = [t for t in (x, gamma, beta) if t is not None]
    return _LayerNorm(len(shape), eps)(*xs)[0]


def _shape_tuple(v, what: str) -> tuple:
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        v = (v,)
    if not isinstance(v, (tuple, list)) or not v or not all(
            isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in v):
        raise TypeError(f"{what} must be a positive int or a non-empty tuple of them, got {v!r}")
    if any(i <= 0 for i in v):
        raise ValueError(f"{what} must be positive, got {tuple(v)}")
    return tuple(int(i) for i in v)


# ---------------------------------------------------------------- scaled dot-product attention
def _heads(t: CTensor, which: int, parts: int, heads: int) -> CTensor:
    """(B, L, parts * E) -> the `which`-th part as a (B, H, L, E / H) view (no copy)."""
    b, n, width = t.shape
    d = width // parts // heads
    return t.reshape([b, n, parts, heads, d]).select(2, which).transpose([0, 2, 1, 3])


class ScaledDotProductAttention(Operator):
    """softmax(Q K^T * scale + mask) V per head; Q, K, V are (B, L, E) with E = heads * head_dim, or one packed
    (B, L, 3E) tensor [Q | K | V] (self-attention after one projection). Outputs (B, Lq, E) and, with
    ``need_weights``, the (B, H, Lq, Lk) attention weights (after dropout's mask: what multiplied V).

    `mask` is a raw additive bias broadcastable to (B, H, Lq, Lk) (see :func:`attention_mask`), `dropout` the
    probability of zeroing a weight while training (the rest scaled by 1 / (1 - dropout))."""

    def __init__(self, num_heads: int, scale: float, mask: CTensor | None = None, dropout: float = 0.0,
                 need_weights: bool = False):
        super().__init__()
        self.heads, self.scale, self.mask = int(num_heads), float(scale), mask
        self.dropout, self.need_weights = float(dropout), bool(need_weights)

    def forward(self, *xs):
        h = self.heads
        if len(xs) == 1:
            (qkv,) = xs
            self.packed, self.xmeta = True, (qkv.shape, qkv.dtype, qkv.device)
            q, k, v = (_heads(qkv, i, 3, h) for i in range(3))
        else:
            self.packed, self.xmeta = False, None
            q, k, v = (_heads(t if t.is_contiguous() else t.contiguous(), 0, 1, h) for t in xs)
        self.q, self.k, self.v = q, k, v
        s = _core.matmul(q, k.transpose([0, 1, 3, 2]))  # (B, H, Lq, Lk)
        _core.mul_scalar(s, self.scale, out=s)
        if self.mask is not None:
            _core.add(s, self.mask, out=s)
        _core.sub(s, _core.max(s, [3], True), out=s)
        _core.exp(s, out=s)
        _core.div(s, _core.sum(s, [3], True), out=s)
        self.p, self.drop = s, None
        if engine.training and self.dropout > 0.0:
            self.drop = CTensor(list(s.shape), s.dtype, s.device)
            _core.bernoulli_(self.drop, 1.0 - self.dropout)
            _core.mul_scalar(self.drop, 1.0 / (1.0 - self.dropout), out=self.drop)
            self.pd = _core.mul(s, self.drop)
        else:
            self.pd = s
        b, _, lq, d = q.shape
        o = CTensor([b, lq, h, d], s.dtype, s.device)
        _core.matmul(self.pd, v, out=o.transpose([0, 2, 1, 3]))
        o = o.reshape([b, lq, h * d])
        return (o, self.pd) if self.need_weights else o

    def backward(self, do, dw=None):
        q, k, v, p, pd = self.q, self.k, self.v, self.p, self.pd
        b, h, lq, d = q.shape
        do = do.reshape([b, lq, h, d]).transpose([0, 2, 1, 3])
        dp = _core.matmul(do, v.transpose([0, 1, 3, 2]))  # d(weights after dropout)
        if dw is not None:
            _core.add(dp, dw, out=dp)
        if self.drop is not None:
            _core.mul(dp, self.drop, out=dp)
        # softmax's backward: ds = p * (dp - sum(dp * p)), then the scale
        row = _core.sum(_core.mul(dp, p), [3], True)
        _core.sub(dp, row, out=dp)
        _core.mul(dp, p, out=dp)
        _core.mul_scalar(dp, self.scale, out=dp)
        if self.packed:
            shape, dtype, dev = self.xmeta
            g = CTensor(list(shape), dtype, dev)
            dq, dk, dv = (_heads(g, i, 3, h) for i in range(3))
        else:
            dq, dk, dv = (CTensor([t.shape[0], t.shape[2], h, d], t.dtype, t.device).transpose([0, 2, 1, 3])
                          for t in (q, k, v))
        _core.matmul(dp, k, out=dq)
        _core.matmul(dp.transpose([0, 1, 3, 2]), q, out=dk)
        _core.matmul(pd.transpose([0, 1, 3, 2]), do, out=dv)
        if self.packed:
            return g
        return tuple(t.transpose([0, 2, 1, 3]).reshape([t.shape[0], t.shape[2], h * d]) for t in (dq, dk, dv))


def attention_mask(batch: int, heads: int, lq: int, lk: int, like: Tensor, attn_mask=None, key_padding_mask=None,
                   is_causal: bool = False, what: str = "attention"):
    """The additive bias (a raw tensor broadcastable to (batch, heads, lq, lk), in like's dtype and device) for
    the given masks, or None when there are none.

    attn_mask: (lq, lk), (batch, lq, lk) (SINGA's transformer example), (batch, heads, lq, lk) or
    (batch * heads, lq, lk) (PyTorch's); key_padding_mask: (batch, lk), True / nonzero = a padding key;
    is_causal: query i attends keys 0..i only. Boolean and integer masks mark what may not be attended; a
    floating attn_mask is added to the scores."""
    if attn_mask is None and key_padding_mask is None and not is_causal:
        return None
    np_dtype = np.float64 if like.data.dtype == _core.DType.float64 else np.float32
    fill = np.finfo(np.float16 if like.data.dtype == _core.DType.float16 else np_dtype).min
    added, blocked = np.zeros((1, 1, lq, lk), np_dtype), np.zeros((1, 1, lq, lk), bool)
    if attn_mask is not None:
        m = _host(attn_mask, f"{what}: attn_mask")
        shapes = {2: (lq, lk), 3: (batch, lq, lk), 4: (batch, heads, lq, lk)}
        if m.ndim == 3 and heads > 1 and m.shape == (batch * heads, lq, lk):
            m = m.reshape(batch, heads, lq, lk)
        elif m.ndim not in shapes or m.shape != shapes[m.ndim]:
            raise ValueError(f"{what}: attn_mask has shape {m.shape}; expected (Lq, Lk) = {(lq, lk)}, (batch, Lq, "
                             f"Lk) = {(batch, lq, lk)}, (batch, heads, Lq, Lk) = {(batch, heads, lq, lk)} or "
                             f"(batch * heads, Lq, Lk) = {(batch * heads, lq, lk)}")
        m = m.reshape((1, 1) + m.shape) if m.ndim == 2 else m[:, None] if m.ndim == 3 else m
        if m.dtype.kind == "f":
            added = added + m.astype(np_dtype)
        else:
            blocked = blocked | (m != 0)
    if key_padding_mask is not None:
        m = _host(key_padding_mask, f"{what}: key_padding_mask")
        if m.shape != (batch, lk):
            raise ValueError(f"{what}: key_padding_mask has shape {m.shape}, expected (batch, Lk) = {(batch, lk)}")
        if m.dtype.kind == "f":
            raise TypeError(f"{what}: key_padding_mask must be boolean or integer (True / nonzero = padding), got "
                            f"{m.dtype}")
        blocked = blocked | (m != 0)[:, None, None, :]
    if is_causal:
        blocked = blocked | np.triu(np.ones((lq, lk), bool), 1)
    bias = np.where(blocked, fill, added).astype(np_dtype)
    return from_host(bias, like.data.device, like.data.dtype)


def _host(m, what: str) -> np.ndarray:
    if isinstance(m, Tensor):
        return np.asarray(to_host(m.data))
    if isinstance(m, np.ndarray):
        return m
    raise TypeError(f"{what} must be a tensor.Tensor or a numpy array, got {type(m).__name__}")


def scaled_dot_product_attention(q, k=None, v=None, num_heads=1, attn_mask=None, key_padding_mask=None,
                                 dropout=0.0, is_causal=False, scale=None, need_weights=False):
    """Attention of (B, Lq, E) queries over (B, Lk, E) keys and values, E split into num_heads heads:
    softmax(Q K^T * scale + mask) V per head, scale = 1 / sqrt(E / num_heads) unless given. ``q`` alone is a
    packed (B, L, 3E) [Q | K | V]. Returns (B, Lq, E), or (output, weights) with need_weights (weights (B, H,
    Lq, Lk)). Masks: see :func:`attention_mask`."""
    xs = (q,) if k is None and v is None else (q, k, v)
    for x in xs:
        if not isinstance(x, Tensor):
            raise TypeError(f"scaled_dot_product_attention: inputs must be tensor.Tensor, got {type(x).__name__}")
        if len(x.shape) != 3:
            raise ValueError(f"scaled_dot_product_attention: inputs must be (batch, sequence, embedding), got "
                             f"shape {tuple(x.shape)}")
    if not isinstance(num_heads, numbers.Integral) or num_heads < 1:
        raise ValueError(f"scaled_dot_product_attention: num_heads must be a positive int, got {num_heads!r}")
    if len(xs) == 1:
        b, lq, width = q.shape
        if width % 3:
            raise ValueError(f"scaled_dot_product_attention: a packed q must have 3 * E features, got {width}")
        e, lk = width // 3, lq
    else:
        if k is None or v is None:
            raise TypeError("scaled_dot_product_attention: give q, k and v, or a packed q alone")
        b, lq, e = q.shape
        lk = k.shape[1]
        if k.shape[0] != b or v.shape[0] != b or k.shape[2] != e or v.shape[2] != e or v.shape[1] != lk:
            raise ValueError(f"scaled_dot_product_attention: q {tuple(q.shape)}, k {tuple(k.shape)} and v "
                             f"{tuple(v.shape)} must share the batch and E, and k and v the length")
    if e % num_heads:
        raise ValueError(f"scaled_dot_product_attention: num_heads {num_heads} must divide E = {e}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"scaled_dot_product_attention: dropout must be in [0, 1), got {dropout}")
    scale = 1.0 / np.sqrt(e // num_heads) if scale is None else float(scale)
    mask = attention_mask(b, num_heads, lq, lk, q, attn_mask, key_padding_mask, is_causal,
                          "scaled_dot_product_attention")
    ys = ScaledDotProductAttention(num_heads, scale, mask, dropout, need_weights)(*xs)
    return ys if need_weights else ys[0]
