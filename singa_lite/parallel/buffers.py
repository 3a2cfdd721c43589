"""Buffers across ranks: the non-trainable state tensors of a model (batch normalisation's running mean and
variance), which each rank updates from its own batches, so that the replicas' buffers drift apart while
their parameters stay identical.

``DistOpt(..., broadcast_buffers=True)`` (the default, as PyTorch DDP) makes ``dist_opt.sync_buffers(model)``
give every rank rank 0's buffers; ``broadcast_buffers="average"`` averages them over the ranks instead (the
statistics of every rank's batches, e.g. before evaluating one model); ``False`` leaves them per rank.
``Model.eval()`` calls it when the model's optimizer is a DistOpt (every rank must then call eval(), as
SINGA's examples do); call it yourself before evaluating or saving a model built without Model::

    sgd = opt.DistOpt(opt.SGD(lr=0.1), broadcast_buffers="average")
    ...
    sgd.sync_buffers(model)        # every rank: the same running statistics
    model.eval()

Checkpoints (singa_lite.checkpoint) hold one model with the buffers this mode gives (rank 0's, or the
ranks' mean), and each rank's own besides: a job resumed on the same ranks continues bit for bit, a
resharded load gets the one model. Saving does not change the live buffers.
"""
from __future__ import annotations

from ..layer.base import Layer
from ..tensor import Tensor
from .replicas import check_same_layout

BUFFER_MODES = (True, False, "broadcast", "average")


def check_mode(mode, who: str):
    """True / "broadcast" -> "broadcast", "average", False -> None."""
    if mode is True or mode == "broadcast":
        return "broadcast"
    if mode == "average":
        return "average"
    if mode is False or mode is None:
        return None
    raise ValueError(f"{who}: broadcast_buffers must be True (rank 0's buffers to every rank), 'average' (their "
                     f"mean over the ranks) or False (left per rank), got {mode!r}")


def named_buffers(model, who: str) -> list:
    """[(name, tensor)] of the model's non-trainable states: a Layer / Model's get_states() that are not
    get_params(), or those of the Layer attributes of a plain class (the CNN of SINGA's distributed-training page)."""
    if isinstance(model, dict):
        return [(k, v) for k, v in model.items() if isinstance(v, Tensor)]
    if callable(getattr(model, "get_states", None)) and callable(getattr(model, "get_params", None)):
        params = model.get_params()
        return [(k, v) for k, v in model.get_states().items() if k not in params and isinstance(v, Tensor)]
    found = []
    for attr, v in getattr(model, "__dict__", {}).items():
        layers = v if isinstance(v, (list, tuple)) else [v]
        for j, item in enumerate(layers):
            if isinstance(item, Layer):
                prefix = attr if item is v else f"{attr}.{j}"
                params = item.get_params()
                found += [(f"{prefix}.{k}", t) for k, t in item.get_states().items() if k not in params]
    if not found and not hasattr(model, "__dict__"):
        raise TypeError(f"{who}: expected a Layer, Model, a dict of buffers or an object with Layer attributes, "
                        f"got {type(model).__name__}")
    return found


def sync_buffers(comm, named, mode: str, root: int = 0, who: str = "sync_buffers") -> None:
    """Compares the ranks' buffers (names, shapes, dtypes; ValueError on every rank with the first
    difference), then broadcasts rank root's values (mode "broadcast") or averages them (mode "average"),
    in place. Integer buffers (counters) are broadcast in both modes."""
    check_same_layout(comm, named, root, who, "buffers")
    for _, t in named:
        raw = t.data
        if mode == "average" and raw.dtype.name.startswith(("float", "bfloat")):
            comm.all_reduce(raw, "avg")
        else:
            comm.broadcast(raw, root)
