"""A model's replicas across ranks: finding its parameters, giving every rank the root's values, and checking
that the ranks still agree. Shared by DistOpt, ``parallel.ddp`` and ``parallel.DataParallel``.

``named_parameters(model)`` accepts what the scripts it follows pass as a model: a Layer / Model (``get_params()``), a
dict or list of parameter tensors, an object with ``parameters()`` (Needle / PyTorch style), or a plain
object whose attributes are layers (the ``CNN`` of SINGA's distributed-training page). The order is the
model's own, the same on every rank that built the same model.
"""
from __future__ import annotations

import warnings

import numpy as np

from ..raw import to_host
from ..layer.base import Layer
from ..tensor import Tensor


def named_parameters(model, who: str) -> list:
    """[(name, parameter tensor)] of `model`; who: the caller, for the error."""
    if isinstance(model, Tensor):
        found = [(model.name or "param0", model)]
    elif isinstance(model, dict):
        found = list(model.items())
    elif isinstance(model, (list, tuple)):
        found = [(p.name if isinstance(p, Tensor) and p.name else f"param{i}", p) for i, p in enumerate(model)]
    elif callable(getattr(model, "get_params", None)):  # Layer, Model, parallel.DataParallel
        found = list(model.get_params().items())
    elif callable(getattr(model, "parameters", None)):
        found = [(p.name if isinstance(p, Tensor) and p.name else f"param{i}", p)
                 for i, p in enumerate(model.parameters())]
    else:  # a plain class holding layers, as the CNN of SINGA's distributed-training page
        found = []
        for attr, v in getattr(model, "__dict__", {}).items():
            layers = v if isinstance(v, (list, tuple)) else [v]
            for j, item in enumerate(layers):
                prefix = attr if item is v else f"{attr}.{j}"
                if isinstance(item, Layer):
                    found += [(f"{prefix}.{k}", p) for k, p in item.get_params().items()]
                elif isinstance(item, Tensor) and item.stores_grad:
                    found.append((prefix, item))
    for name, p in found:
        if not isinstance(p, Tensor):
            raise TypeError(f"{who}: parameters must be tensor.Tensor, got {type(p).__name__} for {name!r}")
    if not found:
        raise ValueError(f"{who}: found no parameters in {type(model).__name__}; pass a Layer or Model (after "
                         f"its parameters exist: layers that infer their input size create them on the first "
                         f"call, or in model.compile), a dict or list of parameter tensors, or an object with "
                         f"parameters() or with Layer attributes")
    return found


def check_same_layout(comm, named, root: int, who: str, what: str = "models") -> None:
    """Compares the ranks' named tensors (names, shapes, dtypes, order) in one collective, raising ValueError
    on every rank with each rank's first difference from rank `root`'s."""
    mine = [[n, list(t.shape), t.dtype.name] for n, t in named]
    every = comm.all_gather_object(mine)
    differences = [describe_difference(every[root], other, root, r) for r, other in enumerate(every)
                   if other != every[root]]
    if differences:
        raise ValueError(f"{who}: the ranks' {what} differ: " + "; ".join(differences)
                         + ". Every rank must build the same model (same layers, in the same order)")


def broadcast_parameters(comm, named, root: int = 0, who: str = "broadcast_parameters") -> None:
    """Compares the ranks' models (names, shapes, dtypes, order), raising ValueError on every rank with the
    first difference, then copies rank `root`'s parameter values into every rank's, in place."""
    check_same_layout(comm, named, root, who)
    for _, p in named:
        comm.broadcast(p.data, root)


def check_parameter_closeness(comm, named, rtol: float = 1e-5, atol: float = 1e-8,
                              who: str = "check_parameter_closeness") -> bool:
    """True when every rank's parameters equal rank 0's within atol + rtol * |rank 0's|; otherwise a
    RuntimeWarning names the parameter that differs most, and False. The same answer on every rank."""
    worst, worst_name = 0.0, None
    for name, p in named:
        ref = p.data.clone()
        comm.broadcast(ref, 0)
        excess = _excess(to_host(p.data, np.float64), to_host(ref, np.float64), rtol, atol)
        if excess > worst:
            worst, worst_name = excess, name
    flags = comm.all_gather_object([worst, worst_name])
    worst, worst_name = max(flags, key=lambda f: f[0])
    if worst > 1.0:
        warnings.warn(f"{who}: replicas drifted: {worst_name} differs from rank 0's by {worst:.3g}x the "
                      f"tolerance (atol={atol}, rtol={rtol})", RuntimeWarning, stacklevel=3)
        return False
    return True


def describe_difference(ref, other, root: int, rank: int) -> str:
    if len(ref) != len(other):
        names, other_names = [a[0] for a in ref], {b[0] for b in other}
        lacks = [n for n in names if n not in other_names]
        extra = [b[0] for b in other if b[0] not in set(names)]
        return (f"rank {root} has {len(ref)} parameters, rank {rank} has {len(other)}"
                + (f" (rank {rank} lacks {', '.join(lacks)})" if lacks else "")
                + (f" (only rank {rank} has {', '.join(extra)})" if extra else ""))
    for i, (a, b) in enumerate(zip(ref, other)):
        if a != b:
            return (f"parameter {i}: rank {root} has {a[0]} {tuple(a[1])} {a[2]}, rank {rank} has {b[0]} "
                    f"{tuple(b[1])} {b[2]}")
    return f"rank {rank} differs"


def _excess(mine: np.ndarray, theirs: np.ndarray, rtol: float, atol: float) -> float:
    """max |mine - theirs| / (atol + rtol |theirs|); equal values (infinities, nans at the same places
    included) count 0, a nan or infinity facing anything else counts inf."""
    if not mine.size:
        return 0.0
    same = (mine == theirs) | (np.isnan(mine) & np.isnan(theirs))
    with np.errstate(invalid="ignore", over="ignore"):
        excess = np.abs(mine - theirs) / (atol + rtol * np.abs(theirs))
    return float(np.nan_to_num(np.where(same, 0.0, excess), nan=np.inf).max())
