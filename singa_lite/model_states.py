"""``Model.save_states`` / ``Model.load_states``: one model's states (and the caller's auxiliary states) in
one zip file, in Apache SINGA's layout, so that files move both ways between SINGA and singa_lite:

    fpath (a zip, entries deflated)
        tensor_dict.npz      numpy's ``savez`` archive: one ``<name>.npy`` per state
        states_attr.json     {name: {"state_type": 0 (model state) or 1 (auxiliary state),
                                     "shape": [sizes], "dtype": ...}}

``dtype`` is a numpy name (``"float32"``) in the files singa_lite writes and SINGA's enum number in the
files SINGA writes (0 float32, 1 float16, 2 int32, 3 int8, 4 float64, 5 uint8); both are read. SINGA's
reader uses only ``state_type``, so it reads singa_lite's files as they are.

Loading treats the file as untrusted: no pickle (``allow_pickle=False`` semantics: object arrays are
refused), only the entries ``states_attr.json`` declares are read, each checked against its declared dtype
and shape before it is decompressed (a zip bomb is refused on its sizes), a model state must have the
model's dtype and shape (nothing is cast), and everything is checked before the model is changed. Every
problem with the file's content is a :class:`~singa_lite.checkpoint.CheckpointError` (a ValueError) naming
the file and the problem; a missing file is FileNotFoundError.

Saving refuses to overwrite: the file is created exclusively (see ``checkpoint_io.exclusive_write``), so of
two processes saving to one new path exactly one succeeds and the other gets FileExistsError.
"""
from __future__ import annotations

import io
import json
import os
import struct
import zipfile
import zlib

import numpy as np

from . import tensor
from .checkpoint_io import (
    MAX_NPY_HEADER,
    CheckpointError,
    array_spec,
    exclusive_write,
    nbytes_of,
    open_zip,
    read_json_entry,
    read_npy_entry,
)
from .tensor import Tensor

TENSOR_DICT_FILENAME = "tensor_dict.npz"
STATES_ATTR_FILENAME = "states_attr.json"
MODEL_STATE_TYPE = 0
AUX_STATE_TYPE = 1

# SINGA's DataType enum (src/proto/core.proto), as states_attr.json of SINGA's files holds it.
SINGA_DTYPES = {0: "float32", 1: "float16", 2: "int32", 3: "int8", 4: "float64", 5: "uint8"}
_MAX_ATTR_BYTES = 16 << 20  # about 100 bytes per state: 160,000 states, far more than any model has
_ZIP_OVERHEAD = 256  # per entry of tensor_dict.npz: local and central headers (besides the name, twice)


def save_states(model, fpath: str, aux_states: dict | None = None) -> None:
    """Writes the model's states and `aux_states` (Tensors, numpy arrays or numbers) to the new zip file
    `fpath` (see the module's docstring); FileExistsError if `fpath` exists, even if another process
    creates it meanwhile."""
    if os.path.exists(fpath):  # early and cheap; exclusive_write decides
        raise FileExistsError(f"save_states: {fpath} already exists; remove it or choose another path")
    arrays, attrs = {}, {}
    for kind, states in ((MODEL_STATE_TYPE, model.get_states()), (AUX_STATE_TYPE, aux_states or {})):
        for k, v in states.items():
            if not isinstance(k, str) or not k:
                raise TypeError(f"save_states: state names must be non-empty strings, got {k!r}")
            if k in arrays:
                raise ValueError(f"save_states: the name {k!r} is both a model state and an aux state")
            arr = tensor.to_numpy(v) if isinstance(v, Tensor) else np.asarray(v)
            if arr.dtype.hasobject or arr.dtype.kind not in "biuf" or arr.dtype.fields is not None:
                raise TypeError(f"save_states: {k!r} is not numeric data ({type(v).__name__} of dtype "
                                f"{arr.dtype}); pass Tensors, numpy arrays or numbers")
            arrays[k] = arr
            attrs[k] = {"state_type": kind, "shape": list(arr.shape), "dtype": str(arr.dtype)}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open(TENSOR_DICT_FILENAME, "w", force_zip64=True) as f:
            np.savez(f, **arrays)
        zf.writestr(STATES_ATTR_FILENAME, json.dumps(attrs))
    exclusive_write(fpath, buf.getvalue(), "save_states")


def load_states(model, fpath: str) -> dict:
    """Restores the model's states from `fpath` and returns the auxiliary states as {name: Tensor} (see
    the module's docstring for what is checked)."""
    if not os.path.isfile(fpath):
        raise FileNotFoundError(f"load_states: {fpath} does not exist")
    with open_zip(fpath) as zf:
        names = set(zf.namelist())
        if names != {TENSOR_DICT_FILENAME, STATES_ATTR_FILENAME}:
            raise CheckpointError(f"{fpath}: not a singa_lite/SINGA checkpoint (it holds {sorted(names)[:8]}; "
                                  f"expected {TENSOR_DICT_FILENAME} and {STATES_ATTR_FILENAME} only)")
        specs = _specs(fpath, read_json_entry(zf, STATES_ATTR_FILENAME, fpath, limit=_MAX_ATTR_BYTES))
        _check_model(fpath, model, specs)
        arrays = _read_tensor_dict(fpath, zf, specs)
    model.set_states({k: a for k, a in arrays.items() if specs[k][0] == MODEL_STATE_TYPE})
    return {k: tensor.from_numpy(a) for k, a in arrays.items() if specs[k][0] == AUX_STATE_TYPE}


def _specs(fpath: str, attrs) -> dict:
    """{name: (state_type, numpy dtype, shape)} from states_attr.json, checked."""
    where = f"{fpath} ({STATES_ATTR_FILENAME})"
    if not isinstance(attrs, dict):
        raise CheckpointError(f"{where}: holds a {type(attrs).__name__}, not a dict of states")
    specs = {}
    for k, a in attrs.items():
        if not isinstance(a, dict) or a.get("state_type") not in (MODEL_STATE_TYPE, AUX_STATE_TYPE) \
                or isinstance(a.get("state_type"), bool):
            raise CheckpointError(f"{where}: entry {k!r} is not {{'state_type': 0 or 1, 'shape': ..., "
                                  f"'dtype': ...}}: {a!r}"[:300])
        dtype = a.get("dtype")
        if isinstance(dtype, int) and not isinstance(dtype, bool):
            if dtype not in SINGA_DTYPES:
                raise CheckpointError(f"{where}: entry {k!r} has SINGA dtype number {dtype}; known are "
                                      f"{SINGA_DTYPES}")
            dtype = SINGA_DTYPES[dtype]
        dt, shape = array_spec(dtype, a.get("shape"), f"{where}: entry {k!r}")
        specs[k] = (a["state_type"], dt, shape)
    return specs


def _check_model(fpath: str, model, specs: dict) -> None:
    """The file's model states are exactly the model's, with its dtypes and shapes (nothing is cast)."""
    want = model.get_states()
    saved = {k for k, s in specs.items() if s[0] == MODEL_STATE_TYPE}
    missing, unknown = sorted(set(want) - saved), sorted(saved - set(want))
    if missing or unknown:
        raise CheckpointError(f"{fpath}: the model's states do not match the file's: missing {missing}, "
                              f"unknown {unknown}; was it saved from another model?")
    for k, t in want.items():
        _, dt, shape = specs[k]
        if dt != np.dtype(t.dtype.name) or shape != tuple(t.shape):
            raise CheckpointError(f"{fpath}: model state {k!r} has shape {shape} dtype {dt} in the file, "
                                  f"{tuple(t.shape)} {t.dtype.name} in the model (states are not cast)")


def _read_tensor_dict(fpath: str, zf: zipfile.ZipFile, specs: dict) -> dict:
    """The arrays of tensor_dict.npz, which must hold exactly the declared states. The archive is read
    through the outer entry's stream (never held whole in memory), its members in file order so that the
    stream only moves forward."""
    info = zf.getinfo(TENSOR_DICT_FILENAME)
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise CheckpointError(f"{fpath}: {TENSOR_DICT_FILENAME} uses compression method {info.compress_type}; "
                              f"only stored or deflated entries are read")
    bound = sum(nbytes_of(dt, shape) + MAX_NPY_HEADER + _ZIP_OVERHEAD + 2 * len(k.encode()) + 8
                for k, (_, dt, shape) in specs.items()) + _ZIP_OVERHEAD
    if info.file_size > bound:
        raise CheckpointError(f"{fpath}: {TENSOR_DICT_FILENAME} declares {info.file_size} bytes, more than the "
                              f"{bound} that the states {STATES_ATTR_FILENAME} declares can take: refused unread")
    where = f"{fpath} ({TENSOR_DICT_FILENAME})"
    try:
        with zf.open(info) as stream:
            # zipfile seeks in this stream by decompressing and dropping up to MAX_SEEK_READ bytes at a
            # time (16 MiB): smaller steps keep a seek's transient memory small
            stream.MAX_SEEK_READ = 1 << 16
            with zipfile.ZipFile(stream) as npz:
                members = {i.filename: i for i in npz.infolist()}
                expected = {f"{k}.npy": k for k in specs}
                if set(members) != set(expected):
                    missing = sorted(set(expected) - set(members))
                    unknown = sorted(set(members) - set(expected))
                    raise CheckpointError(f"{where}: does not hold exactly the states {STATES_ATTR_FILENAME} declares: "
                                          f"missing {missing[:8]}, undeclared {unknown[:8]}")
                arrays = {}
                for member in sorted(members.values(), key=lambda i: i.header_offset):
                    k = expected[member.filename]
                    _, dt, shape = specs[k]
                    arrays[k] = read_npy_entry(npz, member.filename, where, dt, shape)
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, zlib.error, struct.error, EOFError, OSError, ValueError, NotImplementedError,
            RuntimeError) as e:  # what a damaged archive raises from inside zipfile
        raise CheckpointError(f"{where}: corrupt ({type(e).__name__}: {e})") from None
    return arrays
