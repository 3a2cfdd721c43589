"""``Model.save_states`` / ``Model.load_states``: one model's states (and the caller's auxiliary states) in
one zip file, in SINGA's layout -- ``tensor_dict.npz`` (the arrays) and ``states_attr.json`` (for each
name: ``state_type`` 0 for a model state, 1 for an auxiliary one, ``shape`` and ``dtype``).

:class:`~singa_lite.model.Model` keeps thin methods that call :func:`save_states` and :func:`load_states`.
"""
from __future__ import annotations

import io
import json
import os
import zipfile

import numpy as np

from . import tensor
from .checkpoint import atomic_write
from .tensor import Tensor

TENSOR_DICT_FILENAME = "tensor_dict.npz"
STATES_ATTR_FILENAME = "states_attr.json"
MODEL_STATE_TYPE = 0
AUX_STATE_TYPE = 1


def save_states(model, fpath: str, aux_states: dict | None = None) -> None:
    """Writes the model's states and `aux_states` to the zip file `fpath` (see Model.save_states)."""
    if os.path.exists(fpath):
        raise FileExistsError(f"save_states: {fpath} already exists; remove it or choose another path")
    arrays, attrs = {}, {}
    for kind, states in ((MODEL_STATE_TYPE, model.get_states()), (AUX_STATE_TYPE, aux_states or {})):
        for k, v in states.items():
            if k in arrays:
                raise ValueError(f"save_states: the name {k!r} is both a model state and an aux state")
            arr = tensor.to_numpy(v) if isinstance(v, Tensor) else np.asarray(v)
            if arr.dtype == object:
                raise TypeError(f"save_states: {k!r} is not numeric data ({type(v).__name__})")
            arrays[k] = arr
            attrs[k] = {"state_type": kind, "shape": list(arr.shape), "dtype": str(arr.dtype)}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open(TENSOR_DICT_FILENAME, "w") as f:
            np.savez(f, **arrays)
        zf.writestr(STATES_ATTR_FILENAME, json.dumps(attrs))
    atomic_write(fpath, buf.getvalue())


def load_states(model, fpath: str) -> dict:
    """Restores the model's states from `fpath` and returns the auxiliary states (see Model.load_states)."""
    if not os.path.isfile(fpath):
        raise FileNotFoundError(f"load_states: {fpath} does not exist")
    with zipfile.ZipFile(fpath) as zf:
        names = set(zf.namelist())
        if {TENSOR_DICT_FILENAME, STATES_ATTR_FILENAME} - names:
            raise ValueError(f"load_states: {fpath} is not a singa_lite/SINGA checkpoint (it holds {sorted(names)})")
        attrs = json.loads(zf.read(STATES_ATTR_FILENAME))
        with zf.open(TENSOR_DICT_FILENAME) as f, np.load(f, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    model_states = {k: v for k, v in arrays.items() if attrs.get(k, {}).get("state_type") == MODEL_STATE_TYPE}
    aux = {k: tensor.from_numpy(v) for k, v in arrays.items()
           if attrs.get(k, {}).get("state_type") == AUX_STATE_TYPE}
    missing = set(model.get_states()) - set(model_states)
    if missing:
        raise KeyError(f"load_states: {fpath} lacks {sorted(missing)}; was it saved from another model?")
    model.set_states(model_states)
    return aux
