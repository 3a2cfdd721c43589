"""The transformer's layers: ``LayerNorm``, ``MultiHeadAttention`` and ``TransformerEncoderLayer``.

Semantics follow PyTorch's ``nn.LayerNorm``, ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``
(batch_first), with SINGA's conventions where SINGA's transformer example has them: ``LayerNorm(n_features,
eps)`` with parameters ``Gamma`` / ``Beta``, ``MultiHeadAttention(d_model, n_head)`` returning ``(output,
attention)`` with the per-head attention weights, and integer 0/1 masks (nonzero = not attended). Weights are
stored as singa_lite's ``Linear`` stores them, (in, out): PyTorch's (out, in) matrices load transposed
(docs/api.md shows the mapping).
"""
from __future__ import annotations

import math
import numbers

from .. import ops as F
from .base import Layer
from .basic import Linear

__all__ = ["LayerNorm", "MultiHeadAttention", "TransformerEncoderLayer"]


def _positive_int(v, what: str) -> int:
    if not isinstance(v, numbers.Integral) or isinstance(v, bool):
        raise TypeError(f"{what} must be an int, got {type(v).__name__} {v!r}")
    if v <= 0:
        raise ValueError(f"{what} must be positive, got {v}")
    return int(v)


def _alias(value, alias, names: str, what: str):
    """A required argument given under PyTorch's name or SINGA's example's (d_model, n_head): exactly one."""
    if value is not None and alias is not None:
        raise TypeError(f"{what}: give {names} once (got both spellings)")
    if value is None and alias is None:
        raise TypeError(f"{what}: missing the required argument {names}")
    return value if alias is None else alias


def _probability(v, what: str) -> float:
    if not isinstance(v, numbers.Real) or not 0.0 <= float(v) < 1.0:
        raise ValueError(f"{what} must be a probability in [0, 1), got {v!r}")
    return float(v)


class LayerNorm(Layer):
    """Normalises over the trailing axes ``normalized_shape`` (an int: the last axis), then scales by ``Gamma``
    (ones) and shifts by ``Beta`` (zeros): ``LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True,
    bias=True)``, PyTorch's arguments; SINGA's example spells it ``LayerNorm(n_features, eps)``. The variance is
    the biased one; one operator forward and backward (``ops.layer_norm``)."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 name: str | None = None):
        super().__init__(name)
        if isinstance(normalized_shape, numbers.Integral) and not isinstance(normalized_shape, bool):
            normalized_shape = (normalized_shape,)
        if not isinstance(normalized_shape, (tuple, list)) or not normalized_shape:
            raise TypeError(f"LayerNorm: normalized_shape must be an int or a non-empty tuple of ints, got "
                            f"{normalized_shape!r}")
        self.normalized_shape = tuple(_positive_int(s, "LayerNorm: normalized_shape") for s in normalized_shape)
        if not isinstance(eps, numbers.Real) or not eps > 0:
            raise ValueError(f"LayerNorm: eps must be a positive number, got {eps!r}")
        self.eps, self.elementwise_affine, self.bias = float(eps), bool(elementwise_affine), bool(bias)
        if self.elementwise_affine:
            self._param(self.normalized_shape, "Gamma").set_value(1.0)
            if self.bias:
                self._param(self.normalized_shape, "Beta")
        object.__setattr__(self, "_initialized", True)

    def forward(self, x):
        n = len(self.normalized_shape)
        if len(x.shape) < n or tuple(x.shape[len(x.shape) - n:]) != self.normalized_shape:
            raise ValueError(f"{self.name}: the input's last axes must be {self.normalized_shape}, got shape "
                             f"{tuple(x.shape)}")
        affine = self.elementwise_affine
        return F.layer_norm(x, self.normalized_shape, self.Gamma if affine else None,
                            self.Beta if affine and self.bias else None, self.eps)


class MultiHeadAttention(Layer):
    """Multi-head attention on (batch, sequence, embed_dim) tensors: ``MultiHeadAttention(embed_dim, num_heads,
    dropout=0.0, bias=True, causal=False, batch_first=True)``.

    ``forward(query, key=None, value=None, attn_mask=None, key_padding_mask=None, need_weights=True,
    is_causal=False)`` returns ``(output, weights)``: output (batch, Lq, embed_dim), weights the per-head
    attention (batch, num_heads, Lq, Lk) (SINGA's example returns these; PyTorch averages them over heads by
    default), or None when need_weights is False. key defaults to query, value to key. Self-attention (key and
    value the query) projects Q, K and V in one GEMM.

    Masks (``ops.attention_mask``): attn_mask (Lq, Lk), (batch, Lq, Lk), (batch, heads, Lq, Lk) or (batch *
    heads, Lq, Lk); boolean / integer ones mark what may not be attended (True / nonzero), floating ones are
    added to the scores. key_padding_mask (batch, Lk): True / nonzero = padding. ``causal=True`` (or
    ``is_causal=True`` for one call) lets query i attend keys 0..i only. dropout applies to the attention
    weights while training.

    SINGA's example's keywords ``MultiHeadAttention(d_model=512, n_head=8)`` work too.

    Parameters: ``in_proj_W`` (embed_dim, 3 * embed_dim) and ``in_proj_b`` (3 * embed_dim,) = [Q | K | V] (the
    transpose of PyTorch's ``in_proj_weight``), and the output projection ``out_proj`` (a ``Linear``)."""

    def __init__(self, embed_dim: int | None = None, num_heads: int | None = None, dropout: float = 0.0,
                 bias: bool = True, causal: bool = False, batch_first: bool = True, name: str | None = None, *,
                 d_model: int | None = None, n_head: int | None = None):
        super().__init__(name)
        embed_dim = _alias(embed_dim, d_model, "embed_dim (or d_model)", "MultiHeadAttention")
        num_heads = _alias(num_heads, n_head, "num_heads (or n_head)", "MultiHeadAttention")
        self.embed_dim = _positive_int(embed_dim, "MultiHeadAttention: embed_dim")
        self.num_heads = _positive_int(num_heads, "MultiHeadAttention: num_heads")
        if self.embed_dim % self.num_heads:
            raise ValueError(f"MultiHeadAttention: num_heads {num_heads} must divide embed_dim {embed_dim} "
                             f"(each head gets embed_dim / num_heads features)")
        self.head_dim = self.embed_dim // self.num_heads
        self.dropout = _probability(dropout, "MultiHeadAttention: dropout")
        self.bias, self.causal, self.batch_first = bool(bias), bool(causal), bool(batch_first)
        e = self.embed_dim
        limit = math.sqrt(6.0 / (e + 3 * e))  # Xavier-uniform, as PyTorch initialises its in_proj_weight
        self._param((e, 3 * e), "in_proj_W").uniform(-limit, limit)
        if self.bias:
            self._param((3 * e,), "in_proj_b")
        self.out_proj = Linear(e, e, bias=self.bias)
        object.__setattr__(self, "_initialized", True)

    def forward(self, query, key=None, value=None, attn_mask=None, key_padding_mask=None, need_weights=True,
                is_causal=False):
        key = query if key is None else key
        value = key if value is None else value
        if not self.batch_first:
            query, key, value = (F.transpose(t, (1, 0, 2)) for t in (query, key, value))
        for what, t in (("query", query), ("key", key), ("value", value)):
            if len(t.shape) != 3 or t.shape[2] != self.embed_dim:
                layout = "(batch, sequence" if self.batch_first else "(sequence, batch"
                raise ValueError(f"{self.name}: {what} must be {layout}, embed_dim={self.embed_dim}), got shape "
                                 f"{tuple(t.shape)}")
        b, lq, e = query.shape
        if key.shape[0] != b or value.shape[0] != b or key.shape[1] != value.shape[1]:
            raise ValueError(f"{self.name}: query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                             f"{tuple(value.shape)} must share the batch, and key and value the sequence length")
        lk = key.shape[1]
        mask = F.attention_mask(b, self.num_heads, lq, lk, query, attn_mask, key_padding_mask,
                                self.causal or is_causal, self.name)
        op = F.ScaledDotProductAttention(self.num_heads, 1.0 / math.sqrt(self.head_dim), mask, self.dropout,
                                         bool(need_weights))
        if key is query and value is query:
            ys = op(self._project(query, 0, 3 * e))
        else:
            ys = op(*(self._project(t, i * e, (i + 1) * e) for i, t in enumerate((query, key, value))))
        y = self.out_proj(ys[0])
        if not self.batch_first:
            y = F.transpose(y, (1, 0, 2))
        return y, (ys[1] if need_weights else None)

    def _project(self, x, start: int, stop: int):
        w, b = self.in_proj_W, self.in_proj_b if self.bias else None
        if stop - start != w.shape[1]:
            w = F.slice(w, [start], [stop], [1])
            b = None if b is None else F.slice(b, [start], [stop], [0])
        y = F.matmul(x, w)
        return y if b is None else F.add(y, b)


class TransformerEncoderLayer(Layer):
    """One encoder layer as PyTorch's ``nn.TransformerEncoderLayer``: self-attention and a feed-forward block
    (linear1, activation, dropout, linear2), each with a residual connection, dropout and layer normalisation;
    ``norm_first=False`` normalises after each residual add (the original transformer), ``True`` before each
    block (pre-norm).

    ``TransformerEncoderLayer(d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
    layer_norm_eps=1e-5, batch_first=True, norm_first=False, bias=True)``; activation "relu", "gelu" (the erf
    form) or a function of a Tensor. ``forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False)``
    returns a tensor of src's shape (PyTorch's; SINGA's example layer also returned the attention weights).
    ``n_head=`` is accepted for nhead (SINGA's example's keyword). Sublayers: ``self_attn``, ``linear1``,
    ``linear2``, ``norm1``, ``norm2`` (PyTorch's names)."""

    def __init__(self, d_model: int, nhead: int | None = None, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = True, norm_first: bool = False,
                 bias: bool = True, name: str | None = None, *, n_head: int | None = None):
        super().__init__(name)
        nhead = _alias(nhead, n_head, "nhead (or n_head)", "TransformerEncoderLayer")
        self.d_model = _positive_int(d_model, "TransformerEncoderLayer: d_model")
        self.dim_feedforward = _positive_int(dim_feedforward, "TransformerEncoderLayer: dim_feedforward")
        self.dropout = _probability(dropout, "TransformerEncoderLayer: dropout")
        if isinstance(activation, str):
            if activation not in ("relu", "gelu"):
                raise ValueError(f"TransformerEncoderLayer: activation must be 'relu', 'gelu' or a function, got "
                                 f"{activation!r}")
            self.activation = getattr(F, activation)
        elif callable(activation):
            self.activation = activation
        else:
            raise TypeError(f"TransformerEncoderLayer: activation must be 'relu', 'gelu' or a function, got "
                            f"{type(activation).__name__}")
        self.batch_first, self.norm_first = bool(batch_first), bool(norm_first)
        self.self_attn = MultiHeadAttention(self.d_model, nhead, dropout=self.dropout, bias=bias)
        self.linear1 = Linear(self.d_model, self.dim_feedforward, bias=bias)
        self.linear2 = Linear(self.dim_feedforward, self.d_model, bias=bias)
        self.norm1 = LayerNorm(self.d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(self.d_model, eps=layer_norm_eps, bias=bias)
        object.__setattr__(self, "_initialized", True)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src if self.batch_first else F.transpose(src, (1, 0, 2))
        if len(x.shape) != 3 or x.shape[2] != self.d_model:
            layout = "(batch, sequence" if self.batch_first else "(sequence, batch"
            raise ValueError(f"{self.name}: src must be {layout}, d_model={self.d_model}), got shape "
                             f"{tuple(src.shape)}")
        if self.norm_first:
            x = F.add(x, self._attention(self.norm1(x), src_mask, src_key_padding_mask, is_causal))
            x = F.add(x, self._feed_forward(self.norm2(x)))
        else:
            x = self.norm1(F.add(x, self._attention(x, src_mask, src_key_padding_mask, is_causal)))
            x = self.norm2(F.add(x, self._feed_forward(x)))
        return x if self.batch_first else F.transpose(x, (1, 0, 2))

    def _attention(self, x, mask, padding, is_causal):
        y = self.self_attn(x, attn_mask=mask, key_padding_mask=padding, need_weights=False, is_causal=is_causal)[0]
        return self._drop(y)

    def _feed_forward(self, x):
        return self._drop(self.linear2(self._drop(self.activation(self.linear1(x)))))

    def _drop(self, x):
        return F.dropout(x, self.dropout) if self.dropout > 0.0 else x
