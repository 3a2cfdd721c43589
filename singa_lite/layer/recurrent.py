"""SINGA's recurrent layers, RNN and LSTM (``layer.RNN``, ``layer.LSTM``).

RNN and LSTM are SINGA's step-by-step recurrences written with autograd operators (matmul, add_bias,
tanh / relu / sigmoid), so they run on any device and their gradients come from the operators':

    rnn = layer.RNN(input_size, hidden_size)           # tanh(x Wx + h Wh + b)
    hs, h = rnn([x0, x1, x2], h0)                      # xs: a list of (batch, input_size) tensors
    lstm = layer.LSTM(input_size, hidden_size)
    hs, h, c = lstm([x0, x1, x2], (h0, c0))

Parameters are created on the first call (as SINGA does), on the first input's device. Only SINGA's
single-layer, unidirectional form is supported: num_layers > 1, bidirectional, batch_first and dropout are
refused by name.
"""
from __future__ import annotations

from .. import ops as F
from ..tensor import Tensor
from .base import Layer

__all__ = ["RNN", "LSTM"]


def _seq(xs, what: str) -> list:
    if isinstance(xs, Tensor) or not isinstance(xs, (list, tuple)) or not xs:
        raise TypeError(f"{what}: the inputs must be a non-empty list of (batch, features) tensors, one per "
                        f"time step, got {type(xs).__name__}")
    for i, x in enumerate(xs):
        if not isinstance(x, Tensor) or x.ndim() != 2:
            raise ValueError(f"{what}: step {i} must be a 2-d (batch, features) Tensor, got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
        if x.shape[0] != xs[0].shape[0]:
            raise ValueError(f"{what}: step {i} has batch {x.shape[0]}, step 0 has {xs[0].shape[0]}")
    return list(xs)


def _refuse_unsupported(what, num_layers, bias, batch_first, dropout, bidirectional):
    bad = {k: v for k, v in (("num_layers", num_layers != 1), ("bias", not bias), ("batch_first", batch_first),
                             ("dropout", dropout != 0), ("bidirectional", bidirectional)) if v}
    if bad:
        raise NotImplementedError(f"{what}: only SINGA's single-layer, unidirectional recurrence with bias is "
                                  f"implemented; remove {sorted(bad)}")


class RNN(Layer):
    """h_t = nonlinearity(x_t Wx + h_{t-1} Wh + b); Wx (input_size, hidden_size) and Wh ~ N(0, 1), b = 0
    (SINGA's initialisation). ``forward(xs, h0)`` returns ``(hs, h_last)``."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0, bidirectional=False):
        super().__init__()
        _refuse_unsupported("RNN", num_layers, bias, batch_first, dropout, bidirectional)
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        self.input_size, self.hidden_size, self.nonlinearity = int(input_size), int(hidden_size), nonlinearity

    def initialize(self, xs, h0):
        dev = _seq(xs, "RNN")[0].device
        self._param((self.input_size, self.hidden_size), "Wx").to_device(dev).gaussian(0.0, 1.0)
        self._param((self.hidden_size, self.hidden_size), "Wh").to_device(dev).gaussian(0.0, 1.0)
        self._param((self.hidden_size,), "b").to_device(dev)

    def forward(self, xs, h0):
        xs = _seq(xs, "RNN")
        self.device_check(xs[0])
        h, hs = h0, []
        for x in xs:
            h = self.step_forward(x, h, self.Wx, self.Wh, self.b)
            hs.append(h)
        return hs, h

    def step_forward(self, x, h, Wx, Wh, b):  # noqa: N803 - SINGA's names
        y = F.add_bias(F.add(F.matmul(h, Wh), F.matmul(x, Wx)), b, axis=0)
        return F.tanh(y) if self.nonlinearity == "tanh" else F.relu(y)


_GATES = ("i", "f", "o", "g")  # input, forget and output gates, candidate


class LSTM(Layer):
    """SINGA's LSTM step: i, f, o = sigmoid(x Wx_* + Bx_* + h Wh_* + Bh_*), g = tanh(same with *_g),
    c_t = f * c_{t-1} + i * g, h_t = o * tanh(c_t). Weights ~ N(0, 0.01), biases 0, one (Wx, Wh, Bx, Bh)
    per gate named as SINGA's (Wx_i, ..., Bh_g). ``forward(xs, (h0, c0))`` returns ``(hs, h_last, c_last)``."""

    def __init__(self, input_size, hidden_size, nonlinearity="tanh", num_layers=1, bias=True,
                 batch_first=False, dropout=0, bidirectional=False):
        super().__init__()
        _refuse_unsupported("LSTM", num_layers, bias, batch_first, dropout, bidirectional)
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)

    def initialize(self, xs, h0_c0):
        dev = _seq(xs, "LSTM")[0].device
        for g in _GATES:
            self._param((self.input_size, self.hidden_size), f"Wx_{g}").to_device(dev).gaussian(0.0, 0.01)
            self._param((self.hidden_size, self.hidden_size), f"Wh_{g}").to_device(dev).gaussian(0.0, 0.01)
        for g in _GATES:
            self._param((self.hidden_size,), f"Bx_{g}").to_device(dev)
            self._param((self.hidden_size,), f"Bh_{g}").to_device(dev)

    def forward(self, xs, h0_c0):
        xs = _seq(xs, "LSTM")
        if not isinstance(h0_c0, (tuple, list)) or len(h0_c0) != 2:
            raise TypeError("LSTM: the state must be a pair (h0, c0)")
        self.device_check(xs[0])
        (h, c), hs = h0_c0, []
        for x in xs:
            h, c = self.step_forward(x, h, c)
            hs.append(h)
        return hs, h, c

    def _gate(self, x, h, g):
        p = self.__dict__
        y1 = F.add_bias(F.matmul(x, p[f"Wx_{g}"]), p[f"Bx_{g}"], axis=0)
        y2 = F.add_bias(F.matmul(h, p[f"Wh_{g}"]), p[f"Bh_{g}"], axis=0)
        return F.add(y1, y2)

    def step_forward(self, x, h, c):
        i, f, o = (F.sigmoid(self._gate(x, h, g)) for g in "ifo")
        g = F.tanh(self._gate(x, h, "g"))
        c = F.add(F.mul(f, c), F.mul(i, g))
        return F.mul(o, F.tanh(c)), c
