"""SINGA's loss operators (re-exported by ``autograd`` and used by ``layer``'s loss layers).

Every loss returns a tensor of shape (1,), as SINGA's do (``tensor.to_numpy(loss)[0]`` is the value;
``float(loss)`` and ``loss.item()`` work too). ``backward`` takes ``dy`` as the engine passes it or, called
directly as SINGA scripts do, None / a number (SINGA's default ``dy=1.0``).
Bad shapes raise ``raw.CompatError``: a ValueError that is also the AssertionError SINGA raises.
"""
from __future__ import annotations

from .. import _core
from ..engine import CTensor, Operator
from ..raw import CompatError, grad_like, mask
from ..tensor import Tensor
from .common import raw_log_softmax

__all__ = [
    'BinaryCrossEntropy', 'CrossEntropy', 'MeanSquareError', 'RankingLoss', 'SoftMaxCrossEntropy', '_targets',
    'binary_cross_entropy', 'cross_entropy', 'mse_loss', 'ranking_loss', 'softmax_cross_entropy',
]


def _loss(total: CTensor, scale: float) -> CTensor:
    """A full sum (0-d) times scale, as SINGA's shape (1,)."""
    return _core.mul_scalar(total, scale, out=total).reshape([1])


def _dy(dy, like: CTensor) -> CTensor:
    """The loss's incoming gradient as a 0-d tensor (it broadcasts over the input's gradient)."""
    return grad_like(dy, (1,), like.dtype, like.device).reshape([])


def _on_device_of(t: CTensor, x: CTensor) -> CTensor:
    """Targets are data, not parameters: made on the host (labels from a loader), they go to the predictions'
    device rather than failing the step, as SINGA scripts that build labels with tensor.from_numpy expect."""
    return t if t.device == x.device else t.to(x.device)


def _like(t: CTensor, x: CTensor) -> CTensor:
    """t on x's device, in x's dtype."""
    t = _on_device_of(t, x)
    return t if t.dtype == x.dtype else t.cast(x.dtype)


def _targets(t: CTensor, x: CTensor, op: str):
    """t as a (N, C) tensor in x's dtype, and whether each row is known to sum to 1.

    Integer labels of shape (N,) or (N, 1) (SINGA's column of labels, as its char-RNN example passes) become
    one-hot rows; other integer or bool (N, C) tensors are one-hot already (SINGA scripts pass int32 one-hot);
    floating (N, C) targets may be soft. With C == 1 a (N, 1) integer column is read as labels: the only
    valid label, 0, and the only valid one-hot row, [1], give the same one-hot target."""
    if x.ndim != 2:
        raise CompatError(f"{op}: expected (batch, classes) predictions, got shape {x.shape}")
    t = _on_device_of(t, x)
    integral = not t.dtype.is_floating
    if integral and t.shape[0] == x.shape[0] and (t.ndim == 1 or (t.ndim == 2 and t.shape[1] == 1)):
        labels = t if t.ndim == 1 else t.reshape([t.shape[0]])
        return _core.one_hot(labels, x.shape[1], x.dtype), True
    if t.shape != x.shape:
        raise CompatError(f"{op}: targets must be integer class labels of shape ({x.shape[0]},) or "
                          f"({x.shape[0]}, 1), or one-hot / "
                          f"probability rows of shape {x.shape}; got shape {t.shape} ({t.dtype.name})")
    return _like(t, x), integral


class CrossEntropy(Operator):
    """-sum(t * log(y)) / N for probabilities y of shape (N, C) and targets t (one-hot or labels)."""

    def forward(self, y, t):
        self.y = y
        self.t = _targets(t, y, "cross_entropy")[0]
        loss = _core.log(y)
        _core.mul(loss, self.t, out=loss)
        return _loss(_core.sum(loss), -1.0 / y.shape[0])

    def backward(self, dy=None):
        g = _core.div(self.t, self.y)
        _core.mul_scalar(g, -1.0 / self.y.shape[0], out=g)
        return _core.mul(g, _dy(dy, g), out=g), None


cross_entropy = CrossEntropy.apply


class SoftMaxCrossEntropy(Operator):
    """Mean over the batch of -sum(t * log_softmax(x)); x are logits (N, C); t integer labels (N,),
    or one-hot / probability rows (N, C) of any dtype. t is a constructor argument, as in SINGA."""

    def __init__(self, t):
        super().__init__()
        if not isinstance(t, Tensor):
            raise TypeError(f"softmax_cross_entropy: the targets must be a tensor.Tensor, got {type(t).__name__}")
        self.traw = t.data

    def forward(self, x):
        self.t, self.rows_sum_to_one = _targets(self.traw, x, "softmax_cross_entropy")
        self.logp = raw_log_softmax(x, 1)
        return _loss(_core.sum(_core.mul(self.logp, self.t)), -1.0 / x.shape[0])

    def backward(self, dy=None):
        g = _core.exp(self.logp)  # (softmax * rowsum(t) - t) / N * dy
        if not self.rows_sum_to_one:
            _core.mul(g, _core.sum(self.t, [1], True), out=g)
        _core.sub(g, self.t, out=g)
        _core.mul_scalar(g, 1.0 / g.shape[0], out=g)
        return _core.mul(g, _dy(dy, g), out=g)


def softmax_cross_entropy(x, t):
    return SoftMaxCrossEntropy(t)(x)[0]


class MeanSquareError(Operator):
    """mean((x - t)^2) over every element, as SINGA (and torch.nn.MSELoss); the gradient is
    2 * (x - t) / x.size. t is a constructor argument, as in SINGA, and gets no gradient; it has x's shape
    or broadcasts to it."""

    def __init__(self, t):
        super().__init__()
        if not isinstance(t, Tensor):
            raise TypeError(f"mse_loss: the target must be a tensor.Tensor, got {type(t).__name__}")
        self.traw = t.data

    def forward(self, x):
        t = self.traw
        if _broadcast(x.shape, t.shape) != tuple(x.shape):
            raise CompatError(f"mse_loss: the target's shape {t.shape} must equal (or broadcast to) the "
                              f"prediction's shape {x.shape}")
        self.n = max(x.numel, 1)
        self.err = _core.sub(x, _like(t, x))
        return _loss(_core.sum(_core.square(self.err)), 1.0 / self.n)

    def backward(self, dy=None):
        g = _core.mul_scalar(self.err, 2.0 / self.n)
        return _core.mul(g, _dy(dy, g), out=g)


def mse_loss(x, t):
    return MeanSquareError(t)(x)[0]


class BinaryCrossEntropy(Operator):
    """-sum(t * log(x) + (1 - t) * log(1 - x)) / N for probabilities x (N = x.shape[0]) and targets t of
    x's shape. SINGA nudges x by 1e-4 inside the logs; this is the exact formula."""

    def forward(self, x, t):
        if tuple(t.shape) != tuple(x.shape):
            raise CompatError(f"binary_cross_entropy: targets of shape {t.shape} for predictions of shape "
                              f"{x.shape}; they must match")
        self.x, self.t = x, _like(t, x)
        self.batch = x.shape[0] if x.ndim else 1
        pos = _core.mul(self.t, _core.log(x))
        neg = _core.mul(_core.sub_scalar(self.t, 1.0, True), _core.log(_core.sub_scalar(x, 1.0, True)))
        return _loss(_core.sum(_core.add(pos, neg)), -1.0 / self.batch)

    def backward(self, dy=None):  # (x - t) / (x (1 - x)) / N
        den = _core.mul(self.x, _core.sub_scalar(self.x, 1.0, True))
        g = _core.div(_core.sub(self.x, self.t), den)
        _core.mul_scalar(g, 1.0 / self.batch, out=g)
        return _core.mul(g, _dy(dy, g), out=g), None


binary_cross_entropy = BinaryCrossEntropy.apply


class RankingLoss(Operator):
    """sum(max(0, neg - pos + M)) / N (N = pos.shape[0]): a margin loss asking each pos to beat its neg
    by M."""

    def __init__(self, M=0.2):
        super().__init__()
        self.M = float(M)

    def forward(self, pos, neg):
        if tuple(pos.shape) != tuple(neg.shape):
            raise CompatError(f"ranking_loss: pos {pos.shape} and neg {neg.shape} must have the same shape")
        self.n = pos.shape[0] if pos.ndim else 1
        val = _core.add_scalar(_core.sub(neg, pos), self.M)
        self.active = mask(_core.gt_scalar(val, 0.0), pos.dtype)
        return _loss(_core.sum(_core.mul(val, self.active)), 1.0 / self.n)

    def backward(self, dy=None):
        g = _core.mul_scalar(self.active, 1.0 / self.n)
        _core.mul(g, _dy(dy, g), out=g)
        return _core.neg(g), g


def ranking_loss(pos, neg, M=0.2):
    return RankingLoss(M)(pos, neg)[0]


def _broadcast(a, b):
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(reversed(out))
