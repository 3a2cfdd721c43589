"""SINGA's in-place operators on the raw C++ tensor (``t.data += delta.data``, ``t.data -= 1.0``).

SINGA's SWIG tensor has ``+=``, ``-=``, ``*=`` and ``/=`` with another raw tensor or a float; SINGA's own code
and examples use them on ``Tensor.data`` (its LoRA example merges and unmerges weights this way). Our raw tensor
is the pybind11 class ``_core.Tensor``, whose binding lacks them; they are attached here, once, when the tensor
package loads, because ``Tensor.data`` is how every SINGA script reaches the raw tensor (most never import
``singa_wrap``). They write into the left tensor's memory, which is what SINGA's do: the tensor object and every
view of it see the new values. Their natural home is the C++ binding (csrc/bindings/bind_tensor.cpp); this
module is the Python form until the extension carries them.

It also gives a one-element raw tensor ``float(t)``. SINGA's ``autograd.backward`` hands the operator at the root
of the graph ``dy`` as the Python float 1.0; ours hands it a one-element raw tensor (our operators' backward
take raw tensors everywhere), so an operator written for SINGA that reads its ``dy`` with ``float(dy)`` (the
loss operator of SINGA's examples/model_selection, ``dx.data *= float(dy)``) gets the same number here.
"""
from __future__ import annotations

import numbers

from .. import _core

_OPS = {
    "__iadd__": (_core.add, _core.add_scalar, "+="),
    "__isub__": (_core.sub, _core.sub_scalar, "-="),
    "__imul__": (_core.mul, _core.mul_scalar, "*="),
    "__itruediv__": (_core.div, _core.div_scalar, "/="),
}


def _inplace(tensor_fn, scalar_fn, symbol: str):
    def op(self, other):
        if isinstance(other, _core.Tensor):
            tensor_fn(self, other, out=self)
            return self
        if isinstance(other, numbers.Real) and not isinstance(other, bool):
            scalar_fn(self, float(other), out=self)
            return self
        hint = "; pass its .data" if isinstance(getattr(other, "data", None), _core.Tensor) else ""
        raise TypeError(f"raw tensor {symbol}: the right side must be a raw tensor (tensor.Tensor.data) or a "
                        f"number, got {type(other).__name__}{hint}")

    op.__name__ = op.__qualname__ = [k for k, v in _OPS.items() if v[2] == symbol][0]
    op.__doc__ = f"SINGA's raw tensor ``{symbol}``: in place, with a raw tensor or a number."
    return op


def _float(self) -> float:
    """``float(t)`` of a one-element raw tensor (numpy's rule for arrays); TypeError for any other size."""
    from .core import Tensor

    n = self.numel
    if n != 1:
        raise TypeError(f"float(raw tensor): only a one-element raw tensor converts to a float, this one has shape "
                        f"{tuple(self.shape)} ({n} elements)")
    return float(Tensor(data=self).item())


def install() -> None:
    """Attaches the operators the binding lacks (never replaces one it has)."""
    for name, (tensor_fn, scalar_fn, symbol) in _OPS.items():
        if name not in _core.Tensor.__dict__:
            setattr(_core.Tensor, name, _inplace(tensor_fn, scalar_fn, symbol))
    if "__float__" not in _core.Tensor.__dict__:
        _core.Tensor.__float__ = _float
