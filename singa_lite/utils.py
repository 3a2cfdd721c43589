"""SINGA's helper module ``singa.utils``: a progress bar, the ONNX-style padding arithmetic for convolution and
pooling, odd-padding helpers on raw tensors, handle renewal, and a post-order walk of the autograd graph.

Differences from SINGA, on purpose:

- Bad input raises ``ValueError`` / ``TypeError`` saying what was expected (SINGA asserts, or for an unknown
  ``auto_pad`` silently returns zeros).
- ``same_pad_shape_check`` returns ``(pads, odd_pads)`` as ``get_padding_shape`` gives them; SINGA's version
  fails with a TypeError before returning (it halves the two lists).
- The odd-padding helpers take raw tensors (``tensor.Tensor.data``) as SINGA's do, and also a ``tensor.Tensor``
  (then they return one; the result is not recorded by autograd).
- ``post_order_recursive`` walks our graph (see :mod:`singa_lite.autograd_graph`): an input the engine did not
  record has no tensor name, so it is listed in ``inputs`` as ``"<op name>:in<index>"``.
"""
from __future__ import annotations

import math
import numbers
import sys
from collections import OrderedDict

from . import _core
from .singa_wrap.handles import ConvHandle, PoolingHandle
from .singa_wrap.ops import ConcatOn, SliceOn

__all__ = ["update_progress", "handle_odd_pad_fwd", "handle_odd_pad_bwd", "same_pad_shape_check", "re_new_handle",
           "get_padding_shape", "get_output_shape", "force_unicode", "post_order_recursive"]

_BAR = 20  # characters of the progress bar
# SINGA's order of the four odd paddings: (axis, True for the leading side), i.e. top, bottom, left, right.
_ODD_SIDES = ((2, True), (2, False), (3, True), (3, False))


# ---------------------------------------------------------------- progress
def update_progress(progress, info, stream=None):
    """Writes a progress bar with ``info`` and moves the cursor back to the line's start, so the next call
    overwrites it: ``[=====     ] 25.0% info``. ``progress`` is a fraction in [0, 1]; negative shows
    "Halt.", >= 1 shows "Done.", anything not a number shows an error note, as in SINGA. ``stream`` defaults to
    sys.stdout (looked up at each call)."""
    out = sys.stdout if stream is None else stream
    status = ""
    if isinstance(progress, bool) or not isinstance(progress, numbers.Real) or math.isnan(progress):
        progress, status = 0.0, "error: progress var must be float. "
    progress = float(progress)
    if progress < 0:
        progress, status = 0.0, "Halt. "
    elif progress >= 1:
        progress, status = 1.0, "Done. "
    status += str(info)
    filled = int(round(_BAR * progress))
    text = f"[{'.' * filled}{' ' * (_BAR - filled)}] {progress * 100:3.1f}% {status}"
    out.write(text + "\b" * len(text))
    out.flush()


# ---------------------------------------------------------------- padding arithmetic (ONNX's auto_pad)
def _spatial(values, what: str, n=None) -> list:
    try:
        out = [int(v) for v in values]
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a sequence of ints, got {values!r}") from None
    if n is not None and len(out) != n:
        raise ValueError(f"{what} must have {n} entries (one per spatial axis), got {values!r}")
    return out


def get_output_shape(auto_pad, input_spatial_shape, kernel_spatial_shape, strides_spatial):
    """The spatial output shape of a convolution or pooling under ONNX's ``auto_pad``: ``"SAME_UPPER"`` /
    ``"SAME_LOWER"`` give ceil(in / stride), ``"VALID"`` gives ceil((in - kernel + 1) / stride)."""
    shape = _spatial(input_spatial_shape, "input_spatial_shape")
    kernel = _spatial(kernel_spatial_shape, "kernel_spatial_shape", len(shape))
    strides = _spatial(strides_spatial, "strides_spatial", len(shape))
    if any(s < 1 for s in strides):
        raise ValueError(f"strides_spatial must be >= 1, got {strides}")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return [-(-n // s) for n, s in zip(shape, strides)]
    if auto_pad == "VALID":
        if any(k > n for n, k in zip(shape, kernel)):
            raise ValueError(f"VALID padding: kernel {kernel} is larger than the input {shape}")
        return [-(-(n - k + 1) // s) for n, k, s in zip(shape, kernel, strides)]
    raise ValueError(f"auto_pad must be 'SAME_UPPER', 'SAME_LOWER' or 'VALID', got {auto_pad!r} (for explicit "
                     f"pads there is nothing to infer)")


def get_padding_shape(pad_mode, input_spatial_shape, kernel_spatial_shape, strides_spatial):
    """``(pads, odd_pads)`` for ``pad_mode`` (as :func:`get_output_shape`), each with two entries per spatial
    axis (leading, trailing). ``pads`` is the symmetric part, half the total padding an axis needs rounded
    down, which a handle's ``pad_h`` / ``pad_w`` can express; ``odd_pads`` holds the one extra row or column
    an odd total needs, at the end for SAME_UPPER and at the start otherwise (see handle_odd_pad_fwd)."""
    out = get_output_shape(pad_mode, input_spatial_shape, kernel_spatial_shape, strides_spatial)
    shape = _spatial(input_spatial_shape, "input_spatial_shape")
    kernel = _spatial(kernel_spatial_shape, "kernel_spatial_shape")
    strides = _spatial(strides_spatial, "strides_spatial")
    pads, odd = [0] * (2 * len(shape)), [0] * (2 * len(shape))
    for i, (n, k, s, o) in enumerate(zip(shape, kernel, strides, out)):
        total = max((o - 1) * s + k - n, 0)
        pads[2 * i] = pads[2 * i + 1] = total // 2
        if total % 2:
            odd[2 * i + 1 if pad_mode == "SAME_UPPER" else 2 * i] = 1
    return pads, odd


def same_pad_shape_check(handle, pad_mode, x):
    """Checks that a convolution / pooling handle's padding is the symmetric part of ``pad_mode``'s padding
    for input ``x`` (N, C, H, W); returns ``(pads, odd_pads)`` (:func:`get_padding_shape`), or raises
    ValueError naming the padding the handle should have."""
    shape = _shape(x, "same_pad_shape_check")
    pads, odd = get_padding_shape(pad_mode, shape[2:], [handle.kernel_h, handle.kernel_w],
                                  [handle.stride_h, handle.stride_w])
    want, have = [pads[0], pads[2]], [handle.pad_h, handle.pad_w]
    if have != want:
        raise ValueError(f"same_pad_shape_check: for {pad_mode} on input {tuple(shape)} the handle's padding "
                         f"must be {want}, it is {have}")
    return pads, odd


# ---------------------------------------------------------------- odd padding on raw tensors
def _shape(x, op: str) -> tuple:
    raw = getattr(x, "data", x)
    if not isinstance(raw, _core.Tensor):
        raise TypeError(f"{op}: x must be a tensor (a tensor.Tensor or its .data), got {type(x).__name__}")
    if raw.ndim != 4:
        raise ValueError(f"{op}: x must have shape (N, C, H, W), got {tuple(raw.shape)}")
    return tuple(raw.shape)


def _odd(odd_padding, op: str) -> list:
    pads = _spatial(odd_padding, f"{op}: odd_padding (top, bottom, left, right)", 4)
    if any(p < 0 for p in pads):
        raise ValueError(f"{op}: odd_padding must be >= 0, got {pads}")
    return pads


def _rewrap(x, raw):
    """raw in the form x came in: a tensor.Tensor stays one."""
    if isinstance(x, _core.Tensor):
        return raw
    from .tensor import Tensor
    return Tensor(data=raw, requires_grad=False)


def handle_odd_pad_fwd(x, odd_padding, is_pool=False):
    """x (N, C, H, W) grown by ``odd_padding`` = (top, bottom, left, right) rows / columns: zeros for a
    convolution; for pooling (``is_pool=True``) copies of x's own edge rows / columns, so that the padding
    never wins a max (SINGA's choice). The inverse for gradients is :func:`handle_odd_pad_bwd`."""
    _shape(x, "handle_odd_pad_fwd")
    raw = getattr(x, "data", x)
    for (axis, leading), pad in zip(_ODD_SIDES, _odd(odd_padding, "handle_odd_pad_fwd")):
        if pad == 0:
            continue
        size = raw.shape[axis]
        if is_pool:
            if pad > size:
                raise ValueError(f"handle_odd_pad_fwd: pooling pad {pad} exceeds axis {axis} of size {size}")
            block = SliceOn(raw, 0, pad, axis) if leading else SliceOn(raw, size - pad, size, axis)
        else:
            shape = list(raw.shape)
            shape[axis] = pad
            block = _core.Tensor(shape, raw.dtype, raw.device)
            _core.fill_(block, 0.0)
        raw = ConcatOn([block, raw] if leading else [raw, block], axis)
    return _rewrap(x, raw)


def handle_odd_pad_bwd(dx, odd_padding):
    """dx with the rows / columns added by :func:`handle_odd_pad_fwd` cut off again (same ``odd_padding``)."""
    _shape(dx, "handle_odd_pad_bwd")
    raw = getattr(dx, "data", dx)
    for (axis, leading), pad in zip(_ODD_SIDES, _odd(odd_padding, "handle_odd_pad_bwd")):
        if pad == 0:
            continue
        size = raw.shape[axis]
        if pad > size:
            raise ValueError(f"handle_odd_pad_bwd: pad {pad} exceeds axis {axis} of size {size}")
        raw = SliceOn(raw, pad, size, axis) if leading else SliceOn(raw, 0, size - pad, axis)
    return _rewrap(dx, raw)


# ---------------------------------------------------------------- handles
def re_new_handle(handle, x, is_pool=False):
    """A handle of the same class (CPU or cuDNN) and geometry as ``handle``, sized for the new input x (a raw
    tensor, as SINGA's handles take), e.g. when the batch size changes. ``is_pool`` says whether it is a
    pooling handle, as in SINGA; a mismatch with the handle's class is a TypeError."""
    if is_pool and not isinstance(handle, PoolingHandle) or not is_pool and not isinstance(handle, ConvHandle):
        raise TypeError(f"re_new_handle: is_pool={is_pool} needs a {'PoolingHandle' if is_pool else 'ConvHandle'} "
                        f"(or its cuDNN variant), got {type(handle).__name__}")
    geometry = ([handle.kernel_h, handle.kernel_w], [handle.stride_h, handle.stride_w], [handle.pad_h, handle.pad_w])
    if is_pool:
        return type(handle)(x, *geometry, handle.is_max_pooling)
    extra = {}
    if hasattr(handle, "workspace_byte_limit"):  # a cuDNN handle's algorithm settings carry over
        extra = {"workspace_byte_limit": handle.workspace_byte_limit, "prefer": handle.prefer}
    return type(handle)(x, *geometry, handle.channels, handle.num_filters, handle.bias_term, handle.group, **extra)


# ---------------------------------------------------------------- misc
def force_unicode(s):
    """bytes decoded as UTF-8; anything else (str) unchanged."""
    if isinstance(s, (bytes, bytearray)):
        return bytes(s).decode("utf-8")
    return s


def post_order_recursive(root, root_t):
    """The graph ending at operator ``root`` (e.g. ``y.creator``; ``root_t`` its output, as SINGA passes it) as
    three OrderedDicts, in post order (every node after its inputs): ``nodes`` (op name -> operator),
    ``weights`` (parameter name -> parameter Tensor) and ``inputs`` (name -> None) for the inputs that are
    neither, named ``"<op name>:in<index>"`` (our engine does not keep those tensors). A :class:`Dummy` root
    with ``root_t`` is a weight, as in SINGA."""
    from .autograd_graph import Dummy, post_order

    nodes, weights, inputs = OrderedDict(), OrderedDict(), OrderedDict()
    for item in post_order(root):
        if isinstance(item, tuple):
            op, i = item
            inputs[f"{op.name}:in{i}"] = None
        elif isinstance(item, Dummy):
            if item is root and root_t is None:
                inputs[item.name] = None
            else:
                weights[item.name] = item.tensor
        else:
            nodes[item.name] = item
    return nodes, weights, inputs
