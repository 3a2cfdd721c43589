"""SINGA's ``layer.CudnnRNN``: a multi-layer, optionally bidirectional vanilla RNN, LSTM or GRU whose weights
are one flat parameter ``W`` in cuDNN's layout. SINGA runs it on cuDNN only; here it runs through cuDNN's RNN API
on a GPU and through our own recurrence of autograd operators elsewhere, so SINGA's scripts built on it (its IMDB
and QA-bot examples) train on a CPU too, with the same weights and results.

    rnn = layer.CudnnRNN(hidden_size=64, rnn_mode="lstm", batch_first=True, return_sequences=False)
    y = rnn(x)                      # x (batch, seq, features) -> y (batch, hidden * directions)

Arguments as SINGA's: ``rnn_mode`` is "lstm", "gru", "tanh" (or "vanilla") or "relu"; ``return_sequences``
gives every step's output (seq, batch, hidden * directions), batch first when ``batch_first``; otherwise the
last step's, ``y[-1]`` (for a bidirectional layer that is the forward direction's last output next to the
backward direction's output for step seq-1, as cuDNN's). ``forward(x, hx=None, cx=None, seq_lengths=None)``:
hx / cx are (num_layers * directions, batch, hidden), zeros when not given; with ``use_mask=True``,
``seq_lengths`` (an int tensor, one length per sequence) marks padding: padded steps output zeros and leave
the state as it was, as cuDNN's padded calls do. ``dropout`` applies to the outputs of every layer but
the last, while training.

The layout of ``W`` (cuDNN's canonical one, which torch's ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` also use): for
each pseudo-layer (layer 0 forward, layer 0 backward, layer 1 forward, ...) the input matrices of the G gates,
stacked as one (G * hidden, input) row-major block, then the recurrent matrices (G * hidden, hidden), then
the G input biases and the G recurrent biases (G * hidden each). G = 4 for LSTM with the gates in the order
input, forget, cell candidate, output; 3 for GRU (reset, update, new); 1 for a vanilla RNN. A layer's input is
the features for layer 0 and hidden * directions after. The equations are cuDNN's (GRU: the new gate is
tanh(W_n x + b_Wn + r * (R_n h + b_Rn)), h = (1 - z) * n + z * h_prev). ``W`` starts uniform in
[-1/sqrt(hidden), 1/sqrt(hidden)], as SINGA's.

Which path runs is decided per call (``rnn.path`` says which ran last): "cudnn" when the input is a float16 /
float32 / float64 tensor on a GPU and cuDNN can be used (``_core.cudnn_available()``), unless dropout between
layers is due (training, ``dropout > 0`` and more than one layer: cuDNN's dropout draws its own random masks,
so that case takes the operators on the GPU); "operators" otherwise. The cuDNN path is csrc/cuda/cudnn_rnn.h:
it asks cuDNN where it keeps each matrix and bias and hands ``W`` over as it is when that is the layout above
(else it copies it block by block), so both paths read the same ``W``. The CPU path is checked against torch
(tests/unit/test_cudnn_rnn.py); the cuDNN path against the CPU path in tests/gpu/test_cudnn_rnn_gpu.py.
"""
from __future__ import annotations

import math

import numpy as np

from .. import _core, engine, ops as F
from ..engine import Operator
from ..tensor import Tensor, to_numpy
from .base import Layer

__all__ = ["CudnnRNN", "CudnnRNNOp"]

_GATES = {"lstm": 4, "gru": 3, "tanh": 1, "vanilla": 1, "relu": 1}
_CUDNN_DTYPES = ("float16", "float32", "float64")


class CudnnRNN(Layer):
    """SINGA's cuDNN-layout recurrent layer, on any device (see the module doc)."""

    def __init__(self, hidden_size, activation="tanh", num_layers=1, bias=True, batch_first=True, dropout=0,
                 bidirectional=False, rnn_mode="lstm", use_mask=False, return_sequences=True):
        super().__init__()
        if rnn_mode not in _GATES:
            raise ValueError(f"CudnnRNN: rnn_mode must be one of {sorted(_GATES)}, got {rnn_mode!r}")
        if int(num_layers) < 1:
            raise ValueError(f"CudnnRNN: num_layers must be >= 1, got {num_layers}")
        if not 0 <= dropout < 1:
            raise ValueError(f"CudnnRNN: dropout must be in [0, 1), got {dropout}")
        if not bias:
            raise NotImplementedError("CudnnRNN: bias=False is not supported (SINGA's CudnnRNN requires the bias "
                                      "too); remove bias=False")
        # SINGA's examples pass bidirectional="False" (a string) from their command lines; SINGA reads any
        # non-empty string as True, and so do we, to give the same model.
        self.rnn_mode, self.hidden_size, self.num_layers = rnn_mode, int(hidden_size), int(num_layers)
        self.dropout, self.bidirectional = float(dropout), 1 if bidirectional else 0
        self.return_sequences, self.batch_first, self.use_mask = bool(return_sequences), bool(batch_first), \
            bool(use_mask)
        self.gates = _GATES[rnn_mode]
        self.activation = activation
        self.path = None  # "cudnn" or "operators": which ran the last forward

    # ----- the flat weight's layout
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    def param_layout(self, input_size: int) -> list:
        """[(pseudo_layer, kind, offset, shape)] for kind in "W", "R", "bW", "bR", in W's order."""
        G, H, out = self.gates, self.hidden_size, []
        off = 0
        for layer in range(self.num_layers):
            n_in = input_size if layer == 0 else H * self.directions()
            for d in range(self.directions()):
                p = layer * self.directions() + d
                for kind, shape in (("W", (G * H, n_in)), ("R", (G * H, H)), ("bW", (G * H,)), ("bR", (G * H,))):
                    out.append((p, kind, off, shape))
                    off += int(np.prod(shape))
        return out

    def weights_size(self, input_size: int) -> int:
        _, _, off, shape = self.param_layout(input_size)[-1]
        return off + int(np.prod(shape))

    # ----- layer protocol
    def initialize(self, x, hx=None, cx=None, seq_lengths=None):
        x = _check_input(x, self.batch_first)
        self.input_size = x.shape[2]
        k = 1.0 / math.sqrt(self.hidden_size)
        self._param((self.weights_size(self.input_size),), "W").to_device(x.device).uniform(-k, k)

    def forward(self, x, hx=None, cx=None, seq_lengths=None):
        x = _check_input(x, self.batch_first)
        if x.shape[2] != self.input_size:
            raise ValueError(f"CudnnRNN: the input has {x.shape[2]} features, the layer was built for "
                             f"{self.input_size}")
        self.device_check(x)
        if self._use_cudnn(x):
            self.path = "cudnn"
            return self._forward_cudnn(x, hx, cx, seq_lengths)
        self.path = "operators"
        if self.batch_first:
            x = F.transpose(x, (1, 0, 2))
        T, B, H = x.shape[0], x.shape[1], self.hidden_size
        hx = self._state(hx, "hx", B, x)
        cx = self._state(cx, "cx", B, x) if self.rnn_mode == "lstm" else None
        masks = self._masks(seq_lengths, T, B, x) if self.use_mask else None
        parts = {}
        for p, kind, off, shape in self.param_layout(self.input_size):
            flat = F.slice(self.W, [off], [off + int(np.prod(shape))], [0])
            parts[p, kind] = F.reshape(flat, shape)
        seq = x
        for layer in range(self.num_layers):
            outs = []
            for d in range(self.directions()):
                p = layer * self.directions() + d
                outs.append(self._run(seq, parts, p, _pick(hx, p), None if cx is None else _pick(cx, p), masks,
                                      reverse=d == 1))
            seq = outs[0] if len(outs) == 1 else F.cat(outs, 2)
            if self.dropout and layer < self.num_layers - 1 and engine.training:
                seq = F.dropout(seq, self.dropout)
        if self.return_sequences:
            return F.transpose(seq, (1, 0, 2)) if self.batch_first else seq
        return F.reshape(F.slice(seq, [T - 1], [T], [0]), (B, H * self.directions()))

    # ----- the cuDNN path
    def _use_cudnn(self, x) -> bool:
        dropping = self.dropout > 0 and self.num_layers > 1 and engine.training
        return (x.data.device.is_cuda() and x.data.dtype.name in _CUDNN_DTYPES and not dropping
                and _core.cudnn_available())

    def _forward_cudnn(self, x, hx, cx, seq_lengths):
        T, B = (x.shape[1], x.shape[0]) if self.batch_first else (x.shape[0], x.shape[1])
        inputs = [x, self.W]
        has_hx, has_cx = hx is not None, cx is not None and self.rnn_mode == "lstm"
        if has_hx:
            inputs.append(self._state(hx, "hx", B, x))
        if has_cx:
            inputs.append(self._state(cx, "cx", B, x))
        lengths = self._lengths(seq_lengths, T, B).tolist() if self.use_mask else []
        record = engine.training and any(t.requires_grad for t in inputs)
        spec = (self.rnn_mode, self.hidden_size, self.num_layers, bool(self.bidirectional), self.batch_first)
        y = CudnnRNNOp(spec, lengths, has_hx, has_cx, record)(*inputs)[0]
        if self.return_sequences:
            return y
        H = self.hidden_size * self.directions()
        last = F.slice(y, [T - 1], [T], [1 if self.batch_first else 0])
        return F.reshape(last, (B, H))

    # ----- helpers
    def _state(self, s, what, B, x):
        want = (self.num_layers * self.directions(), B, self.hidden_size)
        if s is None:
            return Tensor(want, device=x.device, dtype=x.dtype, requires_grad=False, stores_grad=False)
        if not isinstance(s, Tensor) or tuple(s.shape) != want:
            raise ValueError(f"CudnnRNN: {what} must be a Tensor of shape (num_layers * directions, batch, "
                             f"hidden) = {want}, got {getattr(s, 'shape', type(s).__name__)}")
        return s

    def _lengths(self, seq_lengths, T, B) -> np.ndarray:
        if not isinstance(seq_lengths, Tensor):
            raise TypeError("CudnnRNN: use_mask=True needs seq_lengths, a Tensor of one length per sequence, got "
                            f"{type(seq_lengths).__name__}")
        lengths = to_numpy(seq_lengths).reshape(-1).astype(np.int64)
        if lengths.shape != (B,) or lengths.min() < 1 or lengths.max() > T:
            raise ValueError(f"CudnnRNN: seq_lengths must hold {B} lengths in [1, {T}], got {lengths.tolist()}")
        return lengths

    def _masks(self, seq_lengths, T, B, x):
        lengths = self._lengths(seq_lengths, T, B)
        on = (np.arange(T)[:, None] < lengths[None, :]).astype(np.float32)  # (T, B)
        return [_const(on[t].reshape(B, 1), x) for t in range(T)]

    def _run(self, seq, parts, p, h, c, masks, reverse):
        """One direction of one layer over the sequence (seq, batch, features) -> (seq, batch, hidden)."""
        T, B, G, H = seq.shape[0], seq.shape[1], self.gates, self.hidden_size
        Wt, Rt = F.transpose(parts[p, "W"], (1, 0)), F.transpose(parts[p, "R"], (1, 0))
        xw = F.add_bias(F.matmul(F.reshape(seq, (T * B, seq.shape[2])), Wt), parts[p, "bW"], axis=0)
        xw = F.reshape(xw, (T, B, G * H))  # every step's input projection at once
        ys = [None] * T
        for t in (range(T - 1, -1, -1) if reverse else range(T)):
            xt = F.reshape(F.slice(xw, [t], [t + 1], [0]), (B, G * H))
            hr = F.add_bias(F.matmul(h, Rt), parts[p, "bR"], axis=0)
            h_new, c_new = self._cell(xt, hr, h, c)
            if masks is not None:  # padded steps keep the state and output zeros
                m = masks[t]
                h_new = F.add(h, F.mul(m, F.sub(h_new, h)))
                if c is not None:
                    c_new = F.add(c, F.mul(m, F.sub(c_new, c)))
                ys[t] = F.mul(m, h_new)
            else:
                ys[t] = h_new
            h, c = h_new, c_new
        return F.cat([F.reshape(y, (1, B, H)) for y in ys], 0)

    def _cell(self, xt, hr, h, c):
        mode, H = self.rnn_mode, self.hidden_size
        if mode == "lstm":
            gi, gf, gg, go = F.split(F.add(xt, hr), 1, [H] * 4)
            i, f, o = F.sigmoid(gi), F.sigmoid(gf), F.sigmoid(go)
            c = F.add(F.mul(f, c), F.mul(i, F.tanh(gg)))
            return F.mul(o, F.tanh(c)), c
        if mode == "gru":
            xr, xz, xn = F.split(xt, 1, [H] * 3)
            hr_, hz, hn = F.split(hr, 1, [H] * 3)
            r, z = F.sigmoid(F.add(xr, hr_)), F.sigmoid(F.add(xz, hz))
            n = F.tanh(F.add(xn, F.mul(r, hn)))
            return F.add(n, F.mul(z, F.sub(h, n))), None  # (1 - z) * n + z * h
        y = F.add(xt, hr)
        return (F.relu(y) if mode == "relu" else F.tanh(y)), None


def _check_input(x, batch_first: bool):
    if not isinstance(x, Tensor) or x.ndim() != 3:
        order = "(batch, seq, features)" if batch_first else "(seq, batch, features)"
        raise ValueError(f"CudnnRNN: the input must be a 3-d Tensor {order}, got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    return x


def _pick(s: Tensor, p: int) -> Tensor:
    return F.reshape(F.slice(s, [p], [p + 1], [0]), (s.shape[1], s.shape[2]))


def _const(a: np.ndarray, like: Tensor) -> Tensor:
    return Tensor(data=a, device=like.device, dtype=like.dtype, requires_grad=False, stores_grad=False)


class CudnnRNNOp(Operator):
    """The whole recurrence as one operator on cuDNN (csrc/cuda/cudnn_rnn.h): inputs (x, W) then hx and cx when
    given; output y. ``spec`` is (mode, hidden_size, num_layers, bidirectional, batch_first); ``lengths`` [] or one
    length per sequence; ``record``: a training forward, which keeps cuDNN's reserve space for the backward."""

    def __init__(self, spec, lengths, has_hx, has_cx, record, name=None):
        super().__init__(name)
        self.spec, self.lengths = tuple(spec), list(lengths)
        self.has_hx, self.has_cx, self.record = bool(has_hx), bool(has_cx), bool(record)

    def forward(self, x, W, *states):
        hx = states[0] if self.has_hx else None
        cx = states[-1] if self.has_cx else None
        y, _hy, _cy, reserve = _core.cudnn_rnn_forward(x, W, hx, cx, *self.spec, self.lengths, self.record)
        if self.record:
            self.saved = (x, W, hx, cx, y, reserve)
        return y

    def backward(self, dy):
        if not self.record:
            raise RuntimeError(f"{self.name}: the forward ran without recording (autograd.training was False or no "
                               "input required a gradient), so cuDNN kept nothing for a backward")
        x, W, hx, cx, y, reserve = self.saved
        needs = tuple(self.__dict__.get("needs_grad", (True, True))) + (True,) * 2
        # cuDNN's backward writes into the reserve space; the graph outlives its backward (a second one may
        # follow), so each backward works on a copy and the forward's stays intact (torch clones it likewise
        # when the graph is retained).
        dx, dhx, dcx, dW = _core.cudnn_rnn_backward(x, W, hx, cx, y, dy, reserve.clone(), *self.spec,
                                                    self.lengths, bool(needs[1]))
        grads = [dx, dW]
        if self.has_hx:
            grads.append(dhx)
        if self.has_cx:
            grads.append(dcx)
        return tuple(grads)
