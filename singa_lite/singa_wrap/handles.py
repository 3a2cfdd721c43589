"""SINGA's operation handles and their functions (``singa_wrap.ConvHandle``, ``CpuConvForward`` ...), on raw tensors.

SINGA's C++ layer keeps an operation's geometry in a *handle* built from a sample input, and has free functions
that take the handle: ``CpuConvForward(x, W, b, handle)``, ``CpuPoolingForward(handle, x)``,
``CpuBatchNormForwardTraining(handle, x, scale, bias, running_mean, running_var)`` and their backwards. The
same names and argument orders are here, computed on singa_lite's kernels (im2col + GEMM for convolution,
the pooling kernels, batch normalisation as ``ops.nn`` does it); they work on tensors of any device.

SINGA's GPU names (``CudnnConvHandle``, ``GpuConvForward``, ``GpuBatchNormForwardTraining`` ...) exist in a
CUDA build only, as in SINGA, and follow cuDNN's conventions where they differ from the CPU ones: the GPU batch
norm training returns ``1 / sqrt(var + eps)`` as its third output (cuDNN's "saved inverse variance") and its
backward takes that. ``CudnnRNNHandle`` and the ``GpuRNN*`` functions are not provided.
"""
from __future__ import annotations

import numbers

from .. import _core
from .ops import raw_arg
from ..raw import pair

CTensor = _core.Tensor
_EPS = 1e-5  # SINGA's batch-norm epsilon (fixed in its handles)


def _out_size(op, size, k, s, p, axis, x_shape) -> int:
    if size + 2 * p < k:
        raise ValueError(f"{op}: the padded input {axis} ({size} + 2*{p}) of x {tuple(x_shape)} is smaller than "
                         f"the kernel {k}")
    return (size + 2 * p - k) // s + 1


def _nchw(x, op: str, what: str = "x") -> CTensor:
    x = raw_arg(x, op, what)
    if x.ndim != 4:
        raise ValueError(f"{op}: {what} must have shape (N, C, H, W), got {tuple(x.shape)}")
    return x


# ---------------------------------------------------------------- convolution
class ConvHandle:
    """The geometry of a 2-D convolution: ``ConvHandle(x, kernel_size, stride, padding, in_channels,
    out_channels, bias, groups=1)``, with SINGA's attribute names (``kernel_h``, ``pad_w``, ``num_filters``...)."""

    def __init__(self, input, kernel_size, stride, padding, in_channels, out_channels, bias, groups=1):  # noqa: A002
        op = type(self).__name__
        x = _nchw(input, op, "input")
        self.kernel_h, self.kernel_w = pair(kernel_size, f"{op}: kernel_size", 1)
        self.stride_h, self.stride_w = pair(stride, f"{op}: stride", 1)
        self.pad_h, self.pad_w = pair(padding, f"{op}: padding", 0)
        self.channels, self.num_filters, self.group = int(in_channels), int(out_channels), int(groups)
        self.bias_term = bool(bias)
        if self.group < 1 or self.channels % self.group or self.num_filters % self.group:
            raise ValueError(f"{op}: groups={groups} must be >= 1 and divide in_channels={in_channels} and "
                             f"out_channels={out_channels}")
        if x.shape[1] != self.channels:
            raise ValueError(f"{op}: input {tuple(x.shape)} has {x.shape[1]} channels, in_channels is {in_channels}")
        self.batchsize, _, self.height, self.width = x.shape
        self.conv_height = _out_size(op, self.height, self.kernel_h, self.stride_h, self.pad_h, "height", x.shape)
        self.conv_width = _out_size(op, self.width, self.kernel_w, self.stride_w, self.pad_w, "width", x.shape)

    # the im2col kernel's arguments
    def _geometry(self):
        return [self.kernel_h, self.kernel_w], [self.stride_h, self.stride_w], [self.pad_h, self.pad_w], [1, 1]

    def _check(self, op: str, x=None, W=None, b=None, dy=None):
        """Checks the tensors given against this handle; returns (oh, ow) for x's height and width."""
        oh, ow = self.conv_height, self.conv_width
        if x is not None:
            x = _nchw(x, op)
            if x.shape[1] != self.channels:
                raise ValueError(f"{op}: x {tuple(x.shape)} has {x.shape[1]} channels, the handle {self.channels}")
            oh = _out_size(op, x.shape[2], self.kernel_h, self.stride_h, self.pad_h, "height", x.shape)
            ow = _out_size(op, x.shape[3], self.kernel_w, self.stride_w, self.pad_w, "width", x.shape)
        if W is not None:
            want = (self.num_filters, self.channels // self.group, self.kernel_h, self.kernel_w)
            if tuple(raw_arg(W, op, "W").shape) != want:
                raise ValueError(f"{op}: W must have shape {want} for this handle, got {tuple(W.shape)}")
        if b is not None and raw_arg(b, op, "b").numel != self.num_filters:
            raise ValueError(f"{op}: b must have {self.num_filters} elements, got shape {tuple(b.shape)}")
        if dy is not None:
            dy = _nchw(dy, op, "dy")
            if dy.shape[1] != self.num_filters or (x is not None and tuple(dy.shape) != (x.shape[0], self.num_filters,
                                                                                            oh, ow)):
                want = (x.shape[0] if x is not None else "N", self.num_filters, oh, ow)
                raise ValueError(f"{op}: dy must have shape {want}, got {tuple(dy.shape)}")
        return oh, ow


def _dy_matrix(dy: CTensor) -> CTensor:
    """dy (N, OC, oh, ow) as (OC, N * oh * ow), the layout of the GEMMs below (one copy)."""
    N, OC, oh, ow = dy.shape
    return dy.reshape([N, OC, oh * ow]).transpose([1, 0, 2]).contiguous().reshape([OC, N * oh * ow])


def CpuConvForward(x, W, b, ch: ConvHandle):  # noqa: N802 - SINGA's name
    """y = conv(x, W) + b (b ignored when the handle has no bias): cols = im2col(x), y = W @ cols per group."""
    op = "CpuConvForward"
    _handle(ch, ConvHandle, op)
    oh, ow = ch._check(op, x=x, W=W, b=b if ch.bias_term else None)
    N, g, OC = x.shape[0], ch.group, ch.num_filters
    cols = _core.im2col(x, *ch._geometry())  # (C * kh * kw, N * oh * ow)
    W2 = W.reshape([OC, -1])
    OCg, Kg = OC // g, W2.shape[1]
    y2 = CTensor([OC, cols.shape[1]], x.dtype, x.device)
    for i in range(g):
        _core.matmul(W2.slice(0, i * OCg, (i + 1) * OCg, 1), cols.slice(0, i * Kg, (i + 1) * Kg, 1),
                     out=y2.slice(0, i * OCg, (i + 1) * OCg, 1))
    if ch.bias_term:
        _core.add(y2, b.reshape([OC, 1]), out=y2)
    return y2.reshape([OC, N, oh * ow]).transpose([1, 0, 2]).contiguous().reshape([N, OC, oh, ow])


def CpuConvBackwardx(dy, W, x, ch: ConvHandle):  # noqa: N802
    """dx = col2im(W^T @ dy) per group."""
    op = "CpuConvBackwardx"
    _handle(ch, ConvHandle, op)
    ch._check(op, x=x, W=W, dy=dy)
    g, OC = ch.group, ch.num_filters
    dy2 = _dy_matrix(dy)
    W2T = W.reshape([OC, -1]).transpose([1, 0])  # (Kg, OC), a view BLAS reads transposed
    OCg, Kg = OC // g, W2T.shape[0]
    dcols = CTensor([Kg * g, dy2.shape[1]], dy.dtype, dy.device)
    for i in range(g):
        _core.matmul(W2T.slice(1, i * OCg, (i + 1) * OCg, 1), dy2.slice(0, i * OCg, (i + 1) * OCg, 1),
                     out=dcols.slice(0, i * Kg, (i + 1) * Kg, 1))
    return _core.col2im(dcols, list(x.shape), *ch._geometry())


def CpuConvBackwardW(dy, x, W, ch: ConvHandle):  # noqa: N802
    """dW = dy @ im2col(x)^T per group, in W's shape."""
    op = "CpuConvBackwardW"
    _handle(ch, ConvHandle, op)
    ch._check(op, x=x, W=W, dy=dy)
    g, OC = ch.group, ch.num_filters
    dy2 = _dy_matrix(dy)
    cols = _core.im2col(x, *ch._geometry())
    OCg, Kg = OC // g, cols.shape[0] // g
    dW = CTensor([OC, Kg], dy.dtype, dy.device)
    for i in range(g):
        _core.matmul(dy2.slice(0, i * OCg, (i + 1) * OCg, 1), cols.slice(0, i * Kg, (i + 1) * Kg, 1).transpose([1, 0]),
                     out=dW.slice(0, i * OCg, (i + 1) * OCg, 1))
    return dW.reshape(list(W.shape))


def CpuConvBackwardb(dy, b, ch: ConvHandle):  # noqa: N802
    """db = the sum of dy over the batch and the positions, in b's shape."""
    op = "CpuConvBackwardb"
    _handle(ch, ConvHandle, op)
    ch._check(op, b=b, dy=dy)
    return _core.sum(dy, [0, 2, 3], False).reshape(list(b.shape))


# ---------------------------------------------------------------- pooling
class PoolingHandle:
    """The geometry of 2-D pooling: ``PoolingHandle(x, kernel_size, stride, padding, is_max=True)``. Average
    pooling divides by the positions inside the input (padding excluded), as SINGA's CPU and cuDNN paths."""

    def __init__(self, input, kernel_size, stride, padding, is_max=True):  # noqa: A002
        op = type(self).__name__
        x = _nchw(input, op, "input")
        self.kernel_h, self.kernel_w = pair(kernel_size, f"{op}: kernel_size", 1)
        self.stride_h, self.stride_w = pair(stride, f"{op}: stride", 1)
        self.pad_h, self.pad_w = pair(padding, f"{op}: padding", 0)
        if 2 * self.pad_h > self.kernel_h or 2 * self.pad_w > self.kernel_w:
            raise ValueError(f"{op}: padding {(self.pad_h, self.pad_w)} must be at most half the kernel "
                             f"{(self.kernel_h, self.kernel_w)}")
        self.is_max_pooling = bool(is_max)
        self.batchsize, self.channels, self.height, self.width = x.shape
        self.pooled_height = _out_size(op, self.height, self.kernel_h, self.stride_h, self.pad_h, "height", x.shape)
        self.pooled_width = _out_size(op, self.width, self.kernel_w, self.stride_w, self.pad_w, "width", x.shape)

    def _geometry(self):
        return [self.kernel_h, self.kernel_w], [self.stride_h, self.stride_w], [self.pad_h, self.pad_w]


def CpuPoolingForward(ph: PoolingHandle, x):  # noqa: N802
    """Max or average pooling of x (N, C, H, W) with the handle's geometry."""
    _handle(ph, PoolingHandle, "CpuPoolingForward")
    x = _nchw(x, "CpuPoolingForward")
    if ph.is_max_pooling:
        return _core.max_pool2d(x, *ph._geometry())[0]
    return _core.avg_pool2d(x, *ph._geometry(), False)


def CpuPoolingBackward(ph: PoolingHandle, dy, x, y):  # noqa: N802
    """dx of pooling given dy, the forward's x and y. Max pooling sends each window's gradient to its maximum
    (found again from x; the first one on ties)."""
    op = "CpuPoolingBackward"
    _handle(ph, PoolingHandle, op)
    x, dy, y = _nchw(x, op), _nchw(dy, op, "dy"), _nchw(y, op, "y")
    if tuple(dy.shape) != tuple(y.shape):
        raise ValueError(f"{op}: dy {tuple(dy.shape)} must have the forward output's shape {tuple(y.shape)}")
    if ph.is_max_pooling:
        _, argmax = _core.max_pool2d(x, *ph._geometry())
        if tuple(argmax.shape) != tuple(dy.shape):
            raise ValueError(f"{op}: dy {tuple(dy.shape)} does not match pooling x {tuple(x.shape)}, which gives "
                             f"{tuple(argmax.shape)}")
        return _core.max_pool2d_backward(dy, argmax, list(x.shape))
    return _core.avg_pool2d_backward(dy, list(x.shape), *ph._geometry(), False)


# ---------------------------------------------------------------- batch normalisation
class BatchNormHandle:
    """``BatchNormHandle(momentum, x)``: ``factor`` is the weight of the new batch in the running statistics,
    running = (1 - factor) * running + factor * batch (the variance taken unbiased), as SINGA."""

    def __init__(self, momentum, input):  # noqa: A002
        op = type(self).__name__
        x = raw_arg(input, op, "input")
        if x.ndim not in (2, 4):
            raise ValueError(f"{op}: input must be (N, C) or (N, C, H, W), got {tuple(x.shape)}")
        if isinstance(momentum, bool) or not isinstance(momentum, numbers.Real) or not 0.0 <= momentum <= 1.0:
            raise ValueError(f"{op}: momentum must be a number in [0, 1], got {momentum!r}")
        self.factor = float(momentum)
        self.batchsize, self.channels = x.shape[0], x.shape[1]
        self.is_2d = x.ndim == 2
        self.height, self.width = (1, 1) if self.is_2d else (x.shape[2], x.shape[3])
        self.epsilon = _EPS


class _Stats:
    """x's per-channel layout: reduction axes and the (1, C[, 1, 1]) shape parameters broadcast with."""

    def __init__(self, op: str, x, *params):
        x = raw_arg(x, op, "x")
        if x.ndim not in (2, 4):
            raise ValueError(f"{op}: x must be (N, C) or (N, C, H, W), got {tuple(x.shape)}")
        C = x.shape[1]
        for what, p in params:
            p = raw_arg(p, op, what)
            if p.numel != C:
                raise ValueError(f"{op}: {what} must have {C} elements (one per channel of x {tuple(x.shape)}), "
                                 f"got shape {tuple(p.shape)}")
            if p.dtype != x.dtype:
                raise TypeError(f"{op}: {what} holds {p.dtype.name}, x {x.dtype.name}; they must match")
        self.x, self.C = x, C
        self.axes = [0] + list(range(2, x.ndim))
        self.shape = [1, C] + [1] * (x.ndim - 2)
        self.M = x.numel // C  # values per channel

    def b(self, p: CTensor) -> CTensor:
        return p.reshape(self.shape)


def _inv_std(var: CTensor) -> CTensor:
    r = _core.add_scalar(var, _EPS)
    _core.sqrt(r, out=r)
    return _core.reciprocal(r, out=r)


def _bn_training(bnh, x, scale, bias, running_mean, running_var, op: str):
    _handle(bnh, BatchNormHandle, op)
    s = _Stats(op, x, ("scale", scale), ("bias", bias), ("running_mean", running_mean),
               ("running_var", running_var))
    if s.M < 2:
        raise ValueError(f"{op}: training needs more than one value per channel, x has shape {tuple(x.shape)}")
    mean = _core.mean(x, s.axes, True)
    xc = _core.sub(x, mean)
    var = _core.mean(_core.square(xc), s.axes, True)  # biased: what the batch is normalised with
    inv_std = _inv_std(var)
    y = _core.mul(_core.mul(xc, inv_std), s.b(scale))
    _core.add(y, s.b(bias), out=y)
    f = bnh.factor
    for running, batch, k in ((running_mean, mean, 1.0), (running_var, var, s.M / (s.M - 1))):
        _core.mul_scalar(running, 1.0 - f, out=running)
        _core.axpy_(f * k, batch.reshape(list(running.shape)), running)
    return y, mean, var, inv_std


def CpuBatchNormForwardTraining(bnh: BatchNormHandle, x, scale, bias, running_mean, running_var):  # noqa: N802
    """[y, batch mean, batch variance (biased)], normalising x with its own statistics; running_mean and
    running_var are updated in place. The statistics come back in running_mean's shape."""
    y, mean, var, _ = _bn_training(bnh, x, scale, bias, running_mean, running_var, "CpuBatchNormForwardTraining")
    shape = list(running_mean.shape)
    return [y, mean.reshape(shape), var.reshape(shape)]


def CpuBatchNormForwardInference(bnh: BatchNormHandle, x, scale, bias, running_mean, running_var):  # noqa: N802
    """y = (x - running_mean) / sqrt(running_var + eps) * scale + bias."""
    op = "CpuBatchNormForwardInference"
    _handle(bnh, BatchNormHandle, op)
    s = _Stats(op, x, ("scale", scale), ("bias", bias), ("running_mean", running_mean),
               ("running_var", running_var))
    a = _core.mul(_inv_std(s.b(running_var)), s.b(scale))
    y = _core.mul(_core.sub(x, s.b(running_mean)), a)
    return _core.add(y, s.b(bias), out=y)


def _bn_backward(x, dy, scale, mean, inv_std, s: _Stats):
    """[dx, dscale, dbias] of training-mode batch norm, given the batch mean and 1 / sqrt(var + eps):
    dx = scale * inv_std / M * (M * dy - sum(dy) - xhat * sum(dy * xhat))."""
    xhat = _core.mul(_core.sub(x, mean), inv_std)
    dbias = _core.sum(dy, s.axes, True)
    dscale = _core.sum(_core.mul(dy, xhat), s.axes, True)
    dx = _core.mul(xhat, dscale)
    _core.add(dx, dbias, out=dx)
    _core.sub(_core.mul_scalar(dy, float(s.M)), dx, out=dx)
    _core.mul(dx, _core.mul_scalar(_core.mul(s.b(scale), inv_std), 1.0 / s.M), out=dx)
    shape = list(scale.shape)
    return [dx, dscale.reshape(shape), dbias.reshape(shape)]


def CpuBatchNormBackwardx(bnh: BatchNormHandle, y, dy, x, scale, bias, mean, var):  # noqa: N802
    """[dx, dscale, dbias] given the batch mean and (biased) variance that the training forward returned;
    y and bias are taken for SINGA's signature and not needed."""
    op = "CpuBatchNormBackwardx"
    _handle(bnh, BatchNormHandle, op)
    s = _Stats(op, x, ("scale", scale), ("mean", mean), ("var", var))
    if tuple(raw_arg(dy, op, "dy").shape) != tuple(x.shape):
        raise ValueError(f"{op}: dy {tuple(dy.shape)} must have x's shape {tuple(x.shape)}")
    return _bn_backward(x, dy, scale, s.b(mean), _inv_std(s.b(var)), s)


def _handle(h, cls, op: str) -> None:
    if not isinstance(h, cls):
        raise TypeError(f"{op}: expected a {cls.__name__}, got {type(h).__name__}")


# ---------------------------------------------------------------- SINGA's cuDNN names (CUDA builds)
class CudnnConvHandle(ConvHandle):
    """``CudnnConvHandle(x, kernel_size, stride, padding, in_channels, out_channels, bias, groups=1,
    workspace_byte_limit=..., prefer='fastest')``: the algorithm choice arguments are accepted and unused."""

    def __init__(self, input, kernel_size, stride, padding, in_channels, out_channels, bias, groups=1,  # noqa: A002
                 workspace_byte_limit=1024 * 1024 * 1024, prefer="fastest"):
        super().__init__(input, kernel_size, stride, padding, in_channels, out_channels, bias, groups)
        self.workspace_byte_limit, self.prefer = workspace_byte_limit, prefer


class CudnnPoolingHandle(PoolingHandle):
    pass


class CudnnBatchNormHandle(BatchNormHandle):
    pass


def GpuConvForward(x, W, b, ch):  # noqa: N802
    return CpuConvForward(x, W, b, ch)


def GpuConvBackwardx(dy, W, x, ch):  # noqa: N802
    return CpuConvBackwardx(dy, W, x, ch)


def GpuConvBackwardW(dy, x, W, ch):  # noqa: N802
    return CpuConvBackwardW(dy, x, W, ch)


def GpuConvBackwardb(dy, b, ch):  # noqa: N802
    return CpuConvBackwardb(dy, b, ch)


def GpuPoolingForward(ph, x):  # noqa: N802
    return CpuPoolingForward(ph, x)


def GpuPoolingBackward(ph, dy, x, y):  # noqa: N802
    return CpuPoolingBackward(ph, dy, x, y)


def GpuBatchNormForwardTraining(bnh, x, scale, bias, running_mean, running_var):  # noqa: N802
    """[y, batch mean, 1 / sqrt(batch var + eps)] (cuDNN's saved statistics); running stats updated in place."""
    y, mean, _, inv_std = _bn_training(bnh, x, scale, bias, running_mean, running_var, "GpuBatchNormForwardTraining")
    shape = list(running_mean.shape)
    return [y, mean.reshape(shape), inv_std.reshape(shape)]


def GpuBatchNormForwardInference(bnh, x, scale, bias, running_mean, running_var):  # noqa: N802
    return CpuBatchNormForwardInference(bnh, x, scale, bias, running_mean, running_var)


def GpuBatchNormBackward(bnh, dy, x, scale, mean, inv_std):  # noqa: N802
    """[dx, dscale, dbias] given GpuBatchNormForwardTraining's saved mean and inverse standard deviation."""
    op = "GpuBatchNormBackward"
    _handle(bnh, BatchNormHandle, op)
    s = _Stats(op, x, ("scale", scale), ("mean", mean), ("inv_std", inv_std))
    if tuple(raw_arg(dy, op, "dy").shape) != tuple(x.shape):
        raise ValueError(f"{op}: dy {tuple(dy.shape)} must have x's shape {tuple(x.shape)}")
    return _bn_backward(x, dy, scale, s.b(mean), s.b(inv_std), s)


GPU_NAMES = ["CudnnConvHandle", "CudnnPoolingHandle", "CudnnBatchNormHandle", "GpuConvForward", "GpuConvBackwardx",
             "GpuConvBackwardW", "GpuConvBackwardb", "GpuPoolingForward", "GpuPoolingBackward",
             "GpuBatchNormForwardTraining", "GpuBatchNormForwardInference", "GpuBatchNormBackward"]
