"""One checkpoint file's format: a zip (stored, CRC-checked) of header.json, state.json and arrays/<k>.npy.

A state is JSON data whose numpy arrays (and Tensors) are replaced by references that declare each array's dtype
and shape; a reader checks every entry against its declaration before reading its data, reads only the entries
state.json references, and refuses the rest (checkpoint_io reads the entries; the package's docstring describes
the directory these files live in)."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import zipfile

import numpy as np

from ..checkpoint_io import CheckpointError, array_spec, open_zip, read_json_entry, read_npy_entry
from .. import tensor
from ..tensor import Tensor

MAGIC = "singa_lite-checkpoint"
FORMAT_VERSION = 2  # 2: array references declare dtype and shape (version 1 files are read too)


def encode(obj, arrays: list, where: str):
    """obj as JSON data, each numpy array (or Tensor) replaced by {"$array": k, "dtype": ..., "shape": ...}
    (the declaration a reader checks the entry against before reading it), the array appended to arrays.
    numpy scalars become Python numbers (they come back as such, not as 0-d arrays)."""
    if isinstance(obj, Tensor):
        obj = tensor.to_numpy(obj)
    if isinstance(obj, np.generic):
        obj = obj.item() if obj.dtype.kind in "biuf" else np.asarray(obj)
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject or obj.dtype.kind not in "biufc" or obj.dtype.fields is not None:
            raise CheckpointError(f"checkpoint.save: {where} is an array of dtype {obj.dtype}; only numeric "
                                  f"arrays are saved (no pickle)")
        arrays.append(np.asarray(obj, order="C"))  # (ascontiguousarray would make a 0-d array 1-d)
        return {"$array": len(arrays) - 1, "dtype": obj.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str) or k.startswith("$"):
                raise CheckpointError(f"checkpoint.save: {where} has the key {k!r}; keys must be strings not "
                                      f"starting with '$'")
            out[k] = encode(v, arrays, f"{where}[{k!r}]" if where else k)
        return out
    if isinstance(obj, (list, tuple)):
        return [encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise CheckpointError(f"checkpoint.save: {where} is a {type(obj).__name__}; a checkpoint holds JSON data "
                          f"(dict, list, str, int, float, bool, None) and numeric numpy arrays")


_REF_KEYS = ({"$array"}, {"$array", "dtype", "shape"})  # format 1's reference, format 2's


def decode(obj, read_array, where: str):
    """The state encoded as `obj`, each array reference replaced by read_array(k, dtype, shape) (dtype and
    shape None in format 1 files, whose arrays declare them only in their own .npy headers)."""
    if isinstance(obj, dict):
        if "$array" in obj:
            k = obj["$array"]
            if set(obj) not in _REF_KEYS or not isinstance(k, int) or isinstance(k, bool) or k < 0:
                raise CheckpointError(f"{where}: malformed array reference {obj!r}")
            spec = array_spec(obj["dtype"], obj["shape"], f"{where} (array {k})") if "dtype" in obj else (None, None)
            return read_array(k, *spec)
        return {k: decode(v, read_array, where) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v, read_array, where) for v in obj]
    return obj


def python_scalars(obj):
    """`extra` as the caller saved it: 0-d arrays (numpy scalars, which format 1 saved as such) become
    Python numbers, so that resumed scripts can format and compare them as before."""
    if isinstance(obj, np.ndarray) and obj.ndim == 0:
        return obj.item()
    if isinstance(obj, dict):
        return {k: python_scalars(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [python_scalars(v) for v in obj]
    return obj


def digest(tree, arrays: list) -> str:
    """A hash of an encoded state (structure, dtypes, shapes, bytes): equal on two ranks iff the states are."""
    h = hashlib.sha256(json.dumps(tree, sort_keys=True).encode())
    for a in arrays:
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def pack(header: dict, state) -> bytes:
    """One .slckpt file's bytes: header.json, state.json and arrays/<k>.npy in a zip (stored: CRC-checked,
    no compression, so writing is at disk speed)."""
    arrays = []
    tree = encode(state, arrays, "")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("header.json", json.dumps({"magic": MAGIC, "format_version": FORMAT_VERSION, **header}))
        zf.writestr("state.json", json.dumps(tree))
        for k, a in enumerate(arrays):
            with zf.open(f"arrays/{k}.npy", "w") as f:
                np.lib.format.write_array(f, a, allow_pickle=False)
    return buf.getvalue()


def unpack(fpath: str, source, expect: dict):
    """The state in a .slckpt file (`source`: its bytes or an open file, which is closed here);
    CheckpointError naming fpath for anything wrong. Only the
    entries state.json references are read, each checked against its declared dtype and shape before its
    data is (see checkpoint_io); compressed entries (never written) and entries nothing references are
    refused."""
    with contextlib.closing(source) if hasattr(source, "close") else contextlib.nullcontext(), \
            open_zip(fpath, source) as zf:
        names = set(zf.namelist())
        for required in ("header.json", "state.json"):
            if required not in names:
                raise CheckpointError(f"{fpath}: no {required} in the file; not a singa_lite checkpoint file")
        header = read_json_entry(zf, "header.json", fpath, stored_only=True)
        check_header(fpath, header, expect)
        tree = read_json_entry(zf, "state.json", fpath, stored_only=True)
        if not isinstance(tree, dict):
            raise CheckpointError(f"{fpath}: state.json holds a {type(tree).__name__}, not a dict")
        arrays, specs = {}, {}

        def read_array(k, dtype, shape):
            name = f"arrays/{k}.npy"
            if name not in names:
                raise CheckpointError(f"{fpath}: state.json refers to array {k}, which the file does not hold")
            if k in specs and specs[k] != (dtype, shape):
                raise CheckpointError(f"{fpath}: state.json declares array {k} twice, differently")
            if k not in arrays:
                specs[k] = (dtype, shape)
                arrays[k] = read_npy_entry(zf, name, fpath, dtype, shape, stored_only=True)
            return arrays[k]

        try:
            state = decode(tree, read_array, fpath)
        except RecursionError:
            raise CheckpointError(f"{fpath}: state.json is nested too deeply to read") from None
        unread = sorted(names - {"header.json", "state.json"} - {f"arrays/{k}.npy" for k in arrays})
        if unread:
            raise CheckpointError(f"{fpath}: holds entries that state.json does not reference ({unread[:5]}"
                                  f"{'...' if len(unread) > 5 else ''}); not a file singa_lite wrote")
    return state


def check_header(fpath: str, header, expect: dict) -> None:
    if not isinstance(header, dict) or header.get("magic") != MAGIC:
        raise CheckpointError(f"{fpath}: not a singa_lite checkpoint (wrong magic)")
    version = header.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
        raise CheckpointError(f"{fpath}: format version {version!r}; this singa_lite reads versions 1 to "
                              f"{FORMAT_VERSION} (was it written by a newer singa_lite?)")
    for key, want in expect.items():
        if header.get(key) != want:
            raise CheckpointError(f"{fpath}: {key} is {header.get(key)!r} in the file but {want!r} in the manifest; "
                                  f"the directory mixes files of different saves")


