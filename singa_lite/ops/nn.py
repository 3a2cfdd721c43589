"""The layers' operators: convolution, pooling, batch normalisation, dropout and embedding (re-exported by
``singa.autograd``).

All images are NCHW. The operators follow the contract of :class:`engine.Operator`: ``forward`` and
``backward`` work on raw ``_core.Tensor``s, and the functions below take and return ``tensor.Tensor``s.

float32 convolutions on the CPU run on oneDNN when it is loaded (the ``onednn-cpu-gomp`` wheel, a dependency on
x86-64 Linux; singa_lite/_runtime/onednn.py finds it, csrc/cpu/onednn.h runs it): one cached oneDNN primitive per
pass and shape, in the blocked layouts oneDNN picks, our NCHW tensors reordered in and out. Its forward and input
gradient give the same bits for any thread count in our tests; its weight gradient splits the batch sum over
threads, so it may differ between thread counts in the last bits (each count repeats its own).
``SINGA_LITE_ONEDNN=0`` (or ``_core.set_onednn_enabled(False)``) keeps the algorithm below, which does not
depend on the thread count.

Otherwise (other dtypes, other platforms) convolution is im2col + GEMM. ``cols = im2col(x)`` has shape (K, N*L) with
K = C*kh*kw and L = OH*OW: every image's columns side by side, so each group is one GEMM for the whole batch,
``W.reshape(OC, K) @ cols`` of shape (OC, N*L), which one pass turns into NCHW while adding the bias. The backward
reuses the cached cols, with dy in the same (OC, N*L) layout: ``dW = dy @ cols^T`` (the transposed view goes to BLAS
as a flag), ``db`` = the sum of dy over (N, H, W) and ``dx = col2im(W^T @ dy)``, the latter skipped when x needs no
gradient (a network's data input). Groups slice W, cols and y along their channel axes (views, no copies).
docs/benchmarks/training.md measures the training step and these kernels.

Batch normalisation's training passes on the CPU (float32 / float64) are fused per channel in C++
(csrc/cpu/batch_norm.cpp: statistics, then the affine map; backward: two sums, then dx), with sums in a fixed order,
so any thread count gives the same bits. Batch normalisation follows SINGA (``src/model/operation/batchnorm.cc``:
its CPU path computes ``running = running * (1 - factor) + batch_stat * factor`` with ``factor = momentum``, and its
cuDNN path passes ``momentum`` as cuDNN's exponentialAverageFactor, which means the same thing):

    running_mean = (1 - momentum) * running_mean + momentum * batch_mean
    running_var  = (1 - momentum) * running_var  + momentum * batch_var_unbiased

so SINGA's ``momentum`` is the weight of the *new* batch, exactly like PyTorch's ``momentum`` (SINGA's
layers default to 0.9, PyTorch to 0.1). The batch is normalised with the biased variance; the running
variance takes the unbiased one (times M / (M - 1), M = N*H*W), as SINGA, cuDNN and PyTorch do.

On a GPU, when cuDNN can be used (``_core.cudnn_available()``: loaded, a GPU visible, not switched off with
``SINGA_LITE_CUDNN=0``), convolution, max / average pooling and batch normalisation run through cuDNN
(csrc/cuda/cudnn_ops.h says how each maps onto it); otherwise, and always on the CPU, they run as described above.
Which path an operator took is decided in its forward and kept for its backward.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .. import _core
from .. import engine
from .._runtime import onednn as _onednn
from ..engine import CTensor, Operator
from ..raw import from_host, grad_like, pair, to_host, zeros
from ..singa_wrap.handles import BatchNormHandle, ConvHandle, PoolingHandle
from ..tensor import Tensor

__all__ = ["conv2d", "max_pool2d", "avg_pool2d", "global_avg_pool2d", "globalaveragepool", "batchnorm_2d",
           "pooling_2d", "_Conv2d", "_MaxPool2d", "_AvgPool2d", "GlobalAveragePool", "_BatchNorm2d", "Dropout",
           "dropout", "Embedding", "embedding"]


# ---------------------------------------------------------------- argument helpers
def _odd(v, op: str) -> tuple | None:
    """SINGA's odd_padding (top, bottom, left, right): extra rows / columns on one side only, added to the
    symmetric padding (SAME_UPPER / SAME_LOWER with an odd total). None when all are zero."""
    if (not isinstance(v, (tuple, list)) or len(v) != 4
            or not all(isinstance(e, numbers.Integral) and not isinstance(e, bool) and e >= 0 for e in v)):
        raise ValueError(f"{op}: odd_padding must be four ints >= 0 (top, bottom, left, right), got {v!r}")
    return tuple(int(e) for e in v) if any(v) else None


def _pad_edges(x: CTensor, odd: tuple, value: float) -> CTensor:
    """x (N, C, H, W) inside a new tensor with `odd` extra rows / columns filled with value."""
    top, bottom, left, right = odd
    N, C, H, W = x.shape
    out = CTensor([N, C, H + top + bottom, W + left + right], x.dtype, x.device)
    _core.fill_(out, value)
    _core.copy_(out.slice(2, top, top + H, 1).slice(3, left, left + W, 1), x)
    return out


def _crop_edges(dx: CTensor, odd: tuple) -> CTensor:
    """The gradient of _pad_edges: dx without the extra rows / columns."""
    top, bottom, left, right = odd
    H, W = dx.shape[2] - top - bottom, dx.shape[3] - left - right
    return dx.slice(2, top, top + H, 1).slice(3, left, left + W, 1).contiguous()


def _needs(op) -> tuple:
    """Which input gradients backward computes: the engine's choice, or all of them when a script calls
    op.backward(dy) itself (as SINGA's tests do); padded so an absent bias reads False."""
    return tuple(op.__dict__.get("needs_grad", (True, True, True))) + (False,) * 3


def _out_size(op, size, k, s, p, d, axis, x_shape):
    span = d * (k - 1) + 1
    if size + 2 * p < span:
        raise ValueError(f"{op}: the padded input {axis} ({size} + 2*{p}) of x {tuple(x_shape)} is smaller "
                         f"than the kernel's extent {span}")
    return (size + 2 * p - span) // s + 1


def _check_nchw(op: str, x: CTensor, name="x"):
    if x.ndim != 4:
        raise ValueError(f"{op}: expected {name} of shape (N, C, H, W), got shape {tuple(x.shape)}")


_CUDNN_DTYPES = ("float16", "float32", "float64")


def _use_cudnn(x: CTensor, *numels: int) -> bool:
    """Run this op through cuDNN? x on a GPU, a float dtype, every tensor involved (numels) non-empty and within
    the 32-bit sizes of cuDNN's descriptors, and cuDNN usable (asked last: it is a call into C++)."""
    return (x.device.is_cuda() and x.dtype.name in _CUDNN_DTYPES and all(0 < n < 2 ** 31 for n in numels)
            and _core.cudnn_available())


def _use_onednn(x: CTensor, y_numel: int) -> bool:
    """Run this convolution through oneDNN? A float32 CPU tensor, a non-empty result, and oneDNN loaded and
    usable (singa_lite/_runtime/onednn.py; asked last)."""
    return x.device.is_cpu() and x.dtype.name == "float32" and x.numel > 0 and y_numel > 0 and _onednn.ready()


# ---------------------------------------------------------------- convolution
class _Conv2d(Operator):
    """y = conv(x, W) (+ b): inputs (x, W) or (x, W, b); see the module docstring for the algorithm."""

    def __init__(self, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, name=None,
                 odd_padding=(0, 0, 0, 0)):
        super().__init__(name)
        self.odd = _odd(odd_padding, "conv2d")
        self.stride = pair(stride, "conv2d: stride", 1)
        self.padding = pair(padding, "conv2d: padding", 0)
        self.dilation = pair(dilation, "conv2d: dilation", 1)
        if not isinstance(groups, numbers.Integral) or isinstance(groups, bool) or groups < 1:
            raise ValueError(f"conv2d: groups must be a positive int, got {groups!r}")
        self.groups = int(groups)

    def _check(self, x, W, b):
        _check_nchw("conv2d", x)
        if W.ndim != 4:
            raise ValueError(f"conv2d: expected W of shape (OC, C/groups, kh, kw), got shape {tuple(W.shape)}")
        N, C, H, Wd = x.shape
        OC, Cg, kh, kw = W.shape
        g = self.groups
        if C % g:
            raise ValueError(f"conv2d: groups={g} does not divide the {C} input channels of x {tuple(x.shape)}")
        if OC % g:
            raise ValueError(f"conv2d: groups={g} does not divide the {OC} output channels of W "
                             f"{tuple(W.shape)}")
        if Cg * g != C:
            raise ValueError(f"conv2d: x {tuple(x.shape)} has {C} channels but W {tuple(W.shape)} expects "
                             f"{Cg * g} (W.shape[1]={Cg} x groups={g})")
        if b is not None and tuple(b.shape) != (OC,):
            raise ValueError(f"conv2d: b must have shape ({OC},) for W {tuple(W.shape)}, got {tuple(b.shape)}")
        if W.dtype != x.dtype or (b is not None and b.dtype != x.dtype):
            raise TypeError(f"conv2d: x, W and b must share a dtype, got {x.dtype.name}, {W.dtype.name}"
                            + ("" if b is None else f", {b.dtype.name}"))
        (sh, sw), (ph, pw), (dh, dw) = self.stride, self.padding, self.dilation
        oh = _out_size("conv2d", H, kh, sh, ph, dh, "height", x.shape)
        ow = _out_size("conv2d", Wd, kw, sw, pw, dw, "width", x.shape)
        return oh, ow

    def forward(self, x, W, b=None):
        if self.odd:  # zero rows / columns on one side; backward crops dx back to x's shape
            _check_nchw("conv2d", x)
            x = _pad_edges(x, self.odd, 0.0)
        oh, ow = self._check(x, W, b)
        N = x.shape[0]
        OC, Cg, kh, kw = W.shape
        self.cudnn = _use_cudnn(x, x.numel, W.numel, N * OC * oh * ow)
        self.onednn = not self.cudnn and _use_onednn(x, N * OC * oh * ow)
        if self.onednn:
            y = _core.onednn_conv2d_forward(x, W, b, self.stride, self.padding, self.dilation, self.groups)
            self.x, self.W, self.has_bias = x, W, b is not None
            return y
        if self.cudnn:
            y = _core.cudnn_conv2d_forward(x, W, self.stride, self.padding, self.dilation, self.groups)
            if b is not None:
                _core.add(y, b.reshape([1, OC, 1, 1]), out=y)
            self.x, self.W, self.has_bias = x, W, b is not None
            return y
        g, NL = self.groups, N * oh * ow
        OCg, Kg = OC // g, Cg * kh * kw
        self.kernel = [kh, kw]
        # cols [K, N*L]: every image's columns side by side, so each group is one GEMM for the whole batch.
        cols = _core.im2col(x, self.kernel, self.stride, self.padding, self.dilation)
        W2 = W.reshape([OC, Kg])
        if g == 1:
            y2 = _core.matmul(W2, cols)  # (OC, N*L)
        else:
            y2 = CTensor([OC, NL], x.dtype, x.device)
            for i in range(g):
                _core.matmul(W2.slice(0, i * OCg, (i + 1) * OCg), cols.slice(0, i * Kg, (i + 1) * Kg),
                             out=y2.slice(0, i * OCg, (i + 1) * OCg))
        self.cols, self.W2, self.x_shape, self.has_bias = cols, W2, list(x.shape), b is not None
        # (OC, N, L) -> (N, OC, L): one pass over the output puts it in NCHW order, adding the bias on the way
        # (an add reading the transposed view writes a contiguous result).
        y_nol = y2.reshape([OC, N, oh * ow]).transpose([1, 0, 2])
        y = _core.add(y_nol, b.reshape([1, OC, 1])) if b is not None else y_nol.contiguous()
        return y.reshape([N, OC, oh, ow])

    def backward(self, dy):
        if self.onednn:
            grads = self._backward_onednn(dy)
        else:
            grads = self._backward_cudnn(dy) if self.cudnn else self._backward_im2col(dy)
        if self.odd and grads[0] is not None:
            grads = (_crop_edges(grads[0], self.odd),) + tuple(grads[1:])
        return grads

    def _backward_im2col(self, dy):
        N, OC, oh, ow = dy.shape
        Kg = self.W2.shape[1]  # C/groups * kh * kw; cols have K = groups * Kg rows
        g = self.groups
        OCg, K = OC // g, Kg * g
        # dy in the forward's (OC, N*L) layout; then dW, db and dcols are each one GEMM / reduction per group.
        dy2 = dy.reshape([N, OC, oh * ow]).transpose([1, 0, 2]).contiguous().reshape([OC, N * oh * ow])
        need = _needs(self)
        dx = dW = db = None
        if need[1]:  # dW = dy2 @ cols^T; the transposed view goes to BLAS as a flag, not a copy
            if g == 1:
                # Computed as (cols @ dy2^T)^T: OpenBLAS runs the tall product (K rows) 10-20 % faster than the
                # wide one (OC rows) for these shapes; the (K, OC) result is small to transpose.
                dW = _core.matmul(self.cols, dy2.transpose([1, 0])).transpose([1, 0]).contiguous()
            else:
                dW = CTensor([OC, Kg], dy.dtype, dy.device)
                for i in range(g):
                    _core.matmul(dy2.slice(0, i * OCg, (i + 1) * OCg),
                                 self.cols.slice(0, i * Kg, (i + 1) * Kg).transpose([1, 0]),
                                 out=dW.slice(0, i * OCg, (i + 1) * OCg))
            dW = dW.reshape([OC, Kg // (self.kernel[0] * self.kernel[1]), *self.kernel])
        if self.has_bias and need[2]:
            db = _core.sum(dy2, [1], False)
        if need[0]:
            W2T = self.W2.transpose([1, 0])
            if g == 1:
                dcols = _core.matmul(W2T, dy2)  # (K, N*L)
            else:
                dcols = CTensor([K, dy2.shape[1]], dy.dtype, dy.device)
                for i in range(g):
                    _core.matmul(W2T.slice(1, i * OCg, (i + 1) * OCg), dy2.slice(0, i * OCg, (i + 1) * OCg),
                                 out=dcols.slice(0, i * Kg, (i + 1) * Kg))
            dx = _core.col2im(dcols, self.x_shape, self.kernel, self.stride, self.padding, self.dilation)
        return (dx, dW, db) if self.has_bias else (dx, dW)

    def _backward_onednn(self, dy):
        need = _needs(self)
        args = (self.stride, self.padding, self.dilation, self.groups)
        x, W = self.x, self.W
        dx = _core.onednn_conv2d_backward_data(W, dy, list(x.shape), *args) if need[0] else None
        dW = db = None
        if need[1] or (self.has_bias and need[2]):
            dW, db = _core.onednn_conv2d_backward_weights(x, dy, list(W.shape), self.has_bias and need[2], *args)
            dW = dW if need[1] else None
        return (dx, dW, db) if self.has_bias else (dx, dW)

    def _backward_cudnn(self, dy):
        need = _needs(self)
        args = (self.stride, self.padding, self.dilation, self.groups)
        x, W = self.x, self.W
        dx = _core.cudnn_conv2d_backward_data(W, dy, list(x.shape), *args) if need[0] else None
        dW = _core.cudnn_conv2d_backward_filter(x, dy, list(W.shape), *args) if need[1] else None
        db = _core.sum(dy, [0, 2, 3], False) if self.has_bias and need[2] else None
        return (dx, dW, db) if self.has_bias else (dx, dW)


def conv2d(*args, **kwargs):
    """2-D convolution (cross-correlation, as every framework), in two spellings:

    ``conv2d(x, W, b=None, stride=1, padding=0, dilation=1, groups=1, odd_padding=(0, 0, 0, 0))``: x (N, C, H,
    W), W (OC, C/groups, kh, kw), b (OC,) or None -> (N, OC, OH, OW); stride / padding / dilation an int or an
    (h, w) pair; odd_padding (top, bottom, left, right) adds zero rows / columns on one side only (SINGA's
    SAME_UPPER / SAME_LOWER).

    ``conv2d(handle, x, W, b=None, odd_padding=(0, 0, 0, 0))``: SINGA's, the geometry taken from a
    ``singa_wrap.ConvHandle``."""
    if args and isinstance(args[0], ConvHandle):
        return _conv2d_with_handle(*args, **kwargs)
    return _conv2d(*args, **kwargs)


def _conv2d(x, W, b=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, odd_padding=(0, 0, 0, 0)):
    op = _Conv2d(stride, padding, dilation, groups, odd_padding=odd_padding)
    return (op(x, W) if b is None else op(x, W, b))[0]


def _conv2d_with_handle(handle, x, W, b=None, odd_padding=(0, 0, 0, 0)):
    if tuple(W.shape[2:]) != (handle.kernel_h, handle.kernel_w):
        raise ValueError(f"conv2d: W {W.shape} has a {tuple(W.shape[2:])} kernel, the handle "
                         f"{(handle.kernel_h, handle.kernel_w)}")
    return _conv2d(x, W, b, (handle.stride_h, handle.stride_w), (handle.pad_h, handle.pad_w), 1, handle.group,
                   odd_padding)


# ---------------------------------------------------------------- pooling
def _pool_args(op, kernel, stride, padding, odd_padding):
    """(kernel, stride, padding, odd) of a pooling. The kernels pad at most half the kernel on each side;
    padding beyond that (SINGA and ONNX allow up to kernel - 1, e.g. SINGA's AvgPool2d(3, 1, 2)) is added to
    the explicit odd padding, which pads both sides alike here."""
    k = pair(kernel, f"{op}: kernel", 1)
    s = k if stride is None else pair(stride, f"{op}: stride", 1)
    p = pair(padding, f"{op}: padding", 0)
    if p[0] >= k[0] or p[1] >= k[1]:
        raise ValueError(f"{op}: padding {tuple(p)} must be smaller than the kernel {tuple(k)}: a window would "
                         f"hold padding only")
    odd = _odd(odd_padding, op) or (0, 0, 0, 0)
    extra = [max(p[0] - k[0] // 2, 0), max(p[1] - k[1] // 2, 0)]
    if any(extra):
        p = [p[0] - extra[0], p[1] - extra[1]]
        odd = (odd[0] + extra[0], odd[1] + extra[0], odd[2] + extra[1], odd[3] + extra[1])
    return k, list(s), p, _odd(odd, op)


def _check_pool_input(op, x, k, s, p):
    """Checks x against the pooling geometry; returns the output's (height, width)."""
    _check_nchw(op, x)
    return (_out_size(op, x.shape[2], k[0], s[0], p[0], 1, "height", x.shape),
            _out_size(op, x.shape[3], k[1], s[1], p[1], 1, "width", x.shape))


class _MaxPool2d(Operator):
    """Max over each kernel window; padded positions never win. The gradient goes to each window's maximum
    (the first one on ties)."""

    def __init__(self, kernel, stride=None, padding=0, name=None, odd_padding=(0, 0, 0, 0)):
        super().__init__(name)
        self.kernel, self.stride, self.padding, self.odd = _pool_args("max_pool2d", kernel, stride, padding,
                                                                      odd_padding)

    def forward(self, x):
        if self.odd:  # -inf rows / columns never win a window
            _check_nchw("max_pool2d", x)
            x = _pad_edges(x, self.odd, float("-inf"))
        oh, ow = _check_pool_input("max_pool2d", x, self.kernel, self.stride, self.padding)
        self.cudnn = _use_cudnn(x, x.numel, x.shape[0] * x.shape[1] * oh * ow)
        if self.cudnn:  # cuDNN's backward finds each window's maximum again from x and y
            self.y = _core.cudnn_pool2d_forward(x, "max", self.kernel, self.stride, self.padding)
            self.x = x
            return self.y
        y, self.argmax = _core.max_pool2d(x, self.kernel, self.stride, self.padding)
        self.x_shape = list(x.shape)
        return y

    def backward(self, dy):
        if self.cudnn:
            dx = _core.cudnn_pool2d_backward(self.x, self.y, dy, "max", self.kernel, self.stride, self.padding)
        else:
            dx = _core.max_pool2d_backward(dy, self.argmax, self.x_shape)
        return _crop_edges(dx, self.odd) if self.odd else dx


def max_pool2d(x, kernel, stride=None, padding=0, odd_padding=(0, 0, 0, 0)):
    """Max pooling; stride defaults to the kernel. kernel / stride / padding: an int or an (h, w) pair;
    odd_padding (top, bottom, left, right): extra padding on one side only (SINGA's SAME_UPPER / LOWER)."""
    return _MaxPool2d(kernel, stride, padding, odd_padding=odd_padding)(x)[0]


class _AvgPool2d(Operator):
    """Mean over each kernel window; with count_include_pad the divisor is the full kernel size, else the
    number of positions inside the input. odd_padding (top, bottom, left, right) pads one side more."""

    def __init__(self, kernel, stride=None, padding=0, count_include_pad=True, name=None,
                 odd_padding=(0, 0, 0, 0)):
        super().__init__(name)
        self.kernel, self.stride, self.padding, self.odd = _pool_args("avg_pool2d", kernel, stride, padding,
                                                                      odd_padding)
        self.count_include_pad = bool(count_include_pad)

    def forward(self, x):
        self.counts = None
        if self.odd:
            _check_nchw("avg_pool2d", x)
            if not self.count_include_pad:
                # the kernels would count the extra zeros as input: divide the padded-included mean by the
                # share of each window that lies inside x instead
                ones = CTensor([1, 1, x.shape[2], x.shape[3]], x.dtype, x.device)
                _core.fill_(ones, 1.0)
                self.counts = _core.avg_pool2d(_pad_edges(ones, self.odd, 0.0), self.kernel, self.stride,
                                               self.padding, True)
            x = _pad_edges(x, self.odd, 0.0)
        oh, ow = _check_pool_input("avg_pool2d", x, self.kernel, self.stride, self.padding)
        self.x_shape = list(x.shape)
        if self.counts is not None:
            self.cudnn = False
            y = _core.avg_pool2d(x, self.kernel, self.stride, self.padding, True)
            return _core.div(y, self.counts, out=y)
        self.cudnn = _use_cudnn(x, x.numel, x.shape[0] * x.shape[1] * oh * ow)
        if self.cudnn:  # cuDNN's backward takes the forward's x and y as well
            self.mode = "avg_include_pad" if self.count_include_pad else "avg_exclude_pad"
            self.y = _core.cudnn_pool2d_forward(x, self.mode, self.kernel, self.stride, self.padding)
            self.x = x
            return self.y
        return _core.avg_pool2d(x, self.kernel, self.stride, self.padding, self.count_include_pad)

    def backward(self, dy):
        if self.cudnn:
            dx = _core.cudnn_pool2d_backward(self.x, self.y, dy, self.mode, self.kernel, self.stride, self.padding)
        elif self.counts is not None:
            dx = _core.avg_pool2d_backward(_core.div(dy, self.counts), self.x_shape, self.kernel, self.stride,
                                           self.padding, True)
        else:
            dx = _core.avg_pool2d_backward(dy, self.x_shape, self.kernel, self.stride, self.padding,
                                           self.count_include_pad)
        return _crop_edges(dx, self.odd) if self.odd else dx


def avg_pool2d(x, kernel, stride=None, padding=0, count_include_pad=True, odd_padding=(0, 0, 0, 0)):
    """Average pooling; stride defaults to the kernel. kernel / stride / padding: an int or an (h, w) pair;
    odd_padding (top, bottom, left, right): extra padding on one side only (SINGA's SAME_UPPER / LOWER)."""
    return _AvgPool2d(kernel, stride, padding, count_include_pad, odd_padding=odd_padding)(x)[0]


def pooling_2d(handle, x, odd_padding=(0, 0, 0, 0)):
    """SINGA's pooling with a ``singa_wrap.PoolingHandle``: max, or average over the positions inside the
    input (padding not counted), with the handle's kernel, stride and padding."""
    if not isinstance(handle, PoolingHandle):
        raise TypeError(f"pooling_2d: expected a singa_wrap.PoolingHandle, got {type(handle).__name__}")
    geometry = (handle.kernel_h, handle.kernel_w), (handle.stride_h, handle.stride_w), (handle.pad_h, handle.pad_w)
    if handle.is_max_pooling:
        return max_pool2d(x, *geometry, odd_padding=odd_padding)
    return avg_pool2d(x, *geometry, False, odd_padding=odd_padding)


class GlobalAveragePool(Operator):
    """The mean over the spatial axes, kept with size 1: (N, C, H, W) -> (N, C, 1, 1) for data_format
    'channels_first' (any rank >= 3: every axis after C), (N, H, W, C) -> (N, 1, 1, C) for 'channels_last'
    (SINGA's tests spell it 'channel_last'; both are accepted). SINGA's / ONNX's GlobalAveragePool."""

    def __init__(self, data_format="channels_first"):
        super().__init__()
        if data_format not in ("channels_first", "channels_last", "channel_last"):
            raise ValueError(f"global_avg_pool2d: data_format must be 'channels_first' or 'channels_last', "
                             f"got {data_format!r}")
        self.channels_first = data_format == "channels_first"

    def forward(self, x):
        if x.ndim < 3:
            raise ValueError(f"global_avg_pool2d: expected x of shape (N, C, spatial...) or (N, spatial..., C), "
                             f"got {tuple(x.shape)}")
        self.axes = list(range(2, x.ndim)) if self.channels_first else list(range(1, x.ndim - 1))
        if math.prod(x.shape[a] for a in self.axes) == 0:
            raise ValueError(f"global_avg_pool2d: x {tuple(x.shape)} has no spatial positions")
        self.x_shape, self.meta = list(x.shape), (x.dtype, x.device)
        return _core.mean(x, self.axes, True)

    def backward(self, dy=None):
        n = math.prod(self.x_shape[a] for a in self.axes)
        out = [1 if i in self.axes else s for i, s in enumerate(self.x_shape)]
        dy = grad_like(dy, out, *self.meta)
        return _core.mul_scalar(dy.broadcast_to(self.x_shape), 1.0 / n)


def global_avg_pool2d(x, data_format="channels_first"):
    return GlobalAveragePool(data_format)(x)[0]


globalaveragepool = global_avg_pool2d  # SINGA's name


# ---------------------------------------------------------------- batch normalisation
class _BatchNorm2d(Operator):
    """Batch normalisation per channel (axis 1) of x (N, C, H, W) or (N, C); inputs (x, scale, bias), each of
    the latter (C,). The running statistics are raw tensors given to the constructor and updated in place in
    training mode (SINGA's convention, see the module docstring); they get no gradient."""

    def __init__(self, running_mean, running_var, momentum=0.9, eps=1e-5, name=None):
        super().__init__(name)
        self.running_mean, self.running_var = running_mean, running_var
        self.momentum, self.eps = float(momentum), float(eps)
        if not 0.0 <= self.momentum <= 1.0:
            raise ValueError(f"batchnorm_2d: momentum must be in [0, 1], got {momentum}")
        if not self.eps >= 0.0:
            raise ValueError(f"batchnorm_2d: eps must be >= 0, got {eps}")

    def _check(self, x, scale, bias):
        if x.ndim not in (2, 4):
            raise ValueError(f"batchnorm_2d: expected x of shape (N, C, H, W) or (N, C), got {tuple(x.shape)}")
        C = x.shape[1]
        for what, t in (("scale", scale), ("bias", bias), ("running_mean", self.running_mean),
                        ("running_var", self.running_var)):
            if tuple(t.shape) != (C,):
                raise ValueError(f"batchnorm_2d: {what} must have shape ({C},) for x {tuple(x.shape)}, got "
                                 f"{tuple(t.shape)}")
            if t.dtype != x.dtype:
                raise TypeError(f"batchnorm_2d: {what} has dtype {t.dtype.name}, x {x.dtype.name}")

    def forward(self, x, scale, bias):
        self._check(x, scale, bias)
        C = x.shape[1]
        pshape = [1, C] + [1] * (x.ndim - 2)  # per-channel values broadcast against x
        axes = [0] + list(range(2, x.ndim))
        self.axes, self.pshape = axes, pshape
        scale_b = scale.reshape(pshape)
        self.training, self.fused = engine.training, False
        # cuDNN takes 4-D tensors: (N, C) is (N, C, 1, 1), the same statistics per channel.
        self.cudnn = _use_cudnn(x, x.numel)
        x4 = x if x.ndim == 4 or not self.cudnn else x.reshape([x.shape[0], C, 1, 1])
        if self.training:
            M = x.numel // C
            if M < 2:
                raise ValueError(f"batchnorm_2d: training needs more than one value per channel, x has shape "
                                 f"{tuple(x.shape)}")
            if self.cudnn:  # running statistics updated in place with momentum as exponentialAverageFactor
                y, saved_mean, saved_inv_std = _core.cudnn_batch_norm_forward_training(
                    x4, scale, bias, self.running_mean, self.running_var, self.momentum, self.eps)
                self.saved = (x4, scale, saved_mean, saved_inv_std)
                return y.reshape(list(x.shape))
            self.fused = x.device.is_cpu() and x.dtype.name in ("float32", "float64")
            if self.fused:  # two passes over x per direction (csrc/cpu/batch_norm.cpp)
                y, mean, var, inv_std = _core.batch_norm_train_forward(x, scale, bias, self.eps)
                self._update_running(mean, var, M)
                self.x, self.saved, self.scale_b = x, (scale, mean, inv_std), scale_b
                return y
            mean = _core.mean(x, axes, True)
            xhat = _core.sub(x, mean)
            var = _core.mean(_core.square(xhat), axes, True)  # biased, for normalising
            inv_std = _core.add_scalar(var, self.eps)
            _core.sqrt(inv_std, out=inv_std)
            _core.reciprocal(inv_std, out=inv_std)
            _core.mul(xhat, inv_std, out=xhat)
            y = _core.mul(xhat, scale_b)
            _core.add(y, bias.reshape(pshape), out=y)
            self._update_running(mean.reshape([C]), var.reshape([C]), M)
            self.xhat, self.inv_std, self.M = xhat, inv_std, M
        else:  # the affine map y = (x - running_mean) * inv_std * scale + bias
            inv_std = _core.add_scalar(self.running_var.reshape(pshape), self.eps)
            _core.sqrt(inv_std, out=inv_std)
            _core.reciprocal(inv_std, out=inv_std)
            self.x, self.inv_std = x, inv_std
            if self.cudnn:
                self.scale_b = scale_b
                return _core.cudnn_batch_norm_forward_inference(x4, scale, bias, self.running_mean, self.running_var,
                                                                self.eps).reshape(list(x.shape))
            a = _core.mul(inv_std, scale_b)
            shift = _core.mul(self.running_mean.reshape(pshape), a)
            _core.sub(bias.reshape(pshape), shift, out=shift)
            y = _core.mul(x, a)
            _core.add(y, shift, out=y)
        self.scale_b = scale_b
        return y

    def _update_running(self, mean, var, M):
        """running = (1 - m) * running + m * batch statistic (SINGA, cuDNN, PyTorch); var unbiased here."""
        m, rm, rv = self.momentum, self.running_mean, self.running_var
        _core.mul_scalar(rm, 1.0 - m, out=rm)
        _core.axpy_(m, mean, rm)
        _core.mul_scalar(rv, 1.0 - m, out=rv)
        _core.axpy_(m * M / (M - 1), var, rv)

    def backward(self, dy):
        axes, C = self.axes, self.pshape[1]
        need = _needs(self)
        if self.fused:
            scale, mean, inv_std = self.saved
            dx, dscale, dbias = _core.batch_norm_train_backward(self.x, dy, mean, inv_std, scale, bool(need[0]))
            return (dx, dscale if need[1] else None, dbias if need[2] else None)
        if self.cudnn and self.training:
            x4, scale, saved_mean, saved_inv_std = self.saved
            dx, dscale, dbias = _core.cudnn_batch_norm_backward(x4, dy.reshape(list(x4.shape)), scale, saved_mean,
                                                                saved_inv_std, self.eps)
            return (dx.reshape(list(dy.shape)) if need[0] else None, dscale if need[1] else None,
                    dbias if need[2] else None)
        dbias = _core.sum(dy, axes, True)
        if self.training:
            xhat = self.xhat
        else:
            xhat = _core.sub(self.x, self.running_mean.reshape(self.pshape))
            _core.mul(xhat, self.inv_std, out=xhat)
        dscale = _core.mul(dy, xhat)
        dscale = _core.sum(dscale, axes, True)
        dx = None
        if need[0]:
            k = _core.mul(self.scale_b, self.inv_std)
            if self.training:  # scale * inv_std / M * (M * dy - sum(dy) - xhat * sum(dy * xhat))
                dx = _core.mul(xhat, dscale)
                _core.add(dx, dbias, out=dx)
                _core.sub(_core.mul_scalar(dy, float(self.M)), dx, out=dx)
                _core.mul_scalar(k, 1.0 / self.M, out=k)
                _core.mul(dx, k, out=dx)
            else:
                dx = _core.mul(dy, k)
        return (dx, dscale.reshape([C]) if need[1] else None, dbias.reshape([C]) if need[2] else None)


def batchnorm_2d(x, scale, bias, running_mean, running_var, momentum=0.9, eps=1e-5, *more):
    """Batch normalisation of x (N, C, H, W) (or (N, C)) per channel with scale / bias (C,).
    SINGA's spelling ``batchnorm_2d(handle, x, scale, bias, running_mean, running_var)`` takes momentum and
    eps from a ``singa_wrap.BatchNormHandle``.

    While ``autograd.training`` is true: normalises with the batch mean and biased variance and updates
    running_mean / running_var (C,) in place as SINGA does, running = (1 - momentum) * running +
    momentum * batch_stat, the variance taken unbiased; otherwise the affine map with the running statistics.
    running_* get no gradient."""
    if isinstance(x, BatchNormHandle):  # SINGA's (handle, x, scale, bias, running_mean, running_var)
        if more:
            raise TypeError(f"batchnorm_2d: SINGA's form takes 6 arguments, got {6 + len(more)}")
        handle, (x, scale, bias, running_mean, running_var) = x, (scale, bias, running_mean, running_var, momentum)
        momentum, eps = handle.factor, handle.epsilon
    elif more:
        raise TypeError(f"batchnorm_2d: at most 7 arguments, got {7 + len(more)}")
    for what, t in (("running_mean", running_mean), ("running_var", running_var)):
        if not isinstance(t, Tensor):
            raise TypeError(f"batchnorm_2d: {what} must be a tensor.Tensor, got {type(t).__name__}")
    return _BatchNorm2d(running_mean.data, running_var.data, momentum, eps)(x, scale, bias)[0]


# ---------------------------------------------------------------- dropout
class Dropout(Operator):
    """Inverted dropout: zeroes each element with probability `ratio` and scales the rest by
    1 / (1 - ratio) while autograd.training is true; the identity otherwise."""
    aliased_grads = True  # the identity case hands dy through

    def __init__(self, ratio=0.5):
        super().__init__()
        if not 0.0 <= ratio < 1.0:
            raise ValueError(f"dropout: ratio must be in [0, 1), got {ratio}")
        self.ratio = float(ratio)

    def forward(self, x):
        self.mask = None
        if not engine.training or self.ratio == 0.0:
            return x
        self.mask = CTensor(list(x.shape), x.dtype, x.device)
        _core.bernoulli_(self.mask, 1.0 - self.ratio)
        _core.mul_scalar(self.mask, 1.0 / (1.0 - self.ratio), out=self.mask)
        return _core.mul(x, self.mask)

    def backward(self, dy):
        return dy if self.mask is None else _core.mul(dy, self.mask)


def dropout(x, ratio=0.5):
    return Dropout(ratio)(x)[0]


# ---------------------------------------------------------------- embedding
class Embedding(Operator):
    """w[x]: rows of the (vocabulary, dim) table w picked by the integer-valued x; only w gets a gradient."""

    def forward(self, x, w):
        ind = to_host(x).astype(np.int64)
        if w.ndim != 2 or ((ind < 0) | (ind >= w.shape[0])).any():
            raise IndexError(f"embedding: indices must be in [0, {w.shape[0]}) for a table of shape {w.shape}")
        self.ind, self.xmeta, self.wmeta = ind, (x.shape, x.dtype, x.device), (w.shape, w.dtype, w.device)
        d = w.shape[1]  # gathered on the device: flat positions row * d + column
        flat = (ind.reshape(-1, 1) * d + np.arange(d, dtype=np.int64)).reshape(-1)
        rows = _core.take(w.contiguous().reshape([-1]), from_host(flat, w.device))
        return rows.reshape(list(ind.shape) + [d])

    def backward(self, dy=None):
        (wshape, wdtype, wdev), (xshape, xdtype, xdev) = self.wmeta, self.xmeta
        g = to_host(grad_like(dy, list(self.ind.shape) + [wshape[1]], wdtype, wdev)).reshape(-1, wshape[1])
        dw = np.zeros(wshape, dtype=g.dtype)
        np.add.at(dw, self.ind.reshape(-1), g)
        return zeros(xshape, xdtype, xdev), from_host(dw, wdev, wdtype)


embedding = Embedding.apply
