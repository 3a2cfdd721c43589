"""CIFAR-10 from a local directory, in either of its published forms. Nothing is downloaded.

    (train_x, train_y), (test_x, test_y) = load_cifar10("~/cifar-10-batches-py")
    # train_x: float32 (50000, 3, 32, 32) in [0, 1]; train_y: int32 (50000,) in 0..9

- the "python version" (``cifar-10-batches-py/``): ``data_batch_1`` .. ``data_batch_5`` and ``test_batch``,
  each a pickled dict with ``data`` (uint8 array, one 3072-byte row per image: 1024 red, 1024 green,
  1024 blue, row-major 32x32) and ``labels`` (list of ints);
- the "binary version" (``cifar-10-batches-bin/``): ``data_batch_1.bin`` .. ``data_batch_5.bin`` and
  ``test_batch.bin``, 3073-byte records (one label byte, then the 3072 pixel bytes).

Pickles are read with :class:`SafeUnpickler`, which can build only what those files hold (dicts, lists,
strings, bytes, numbers and plain numpy arrays) and refuses every other global -- so a crafted file cannot
run code -- with :class:`UnsafePickleError` naming what it asked for.
"""
from __future__ import annotations

import codecs
import io
import os
import pickle

import numpy as np

from .mnist import find_files, read_bytes

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
_PIXELS = 3 * 32 * 32
_SUBDIRS = ("cifar-10-batches-py", "cifar-10-batches-bin")


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle asked for something that a CIFAR batch never holds (a function, a class, a module...)."""


_PLAIN_KINDS = "biuf"  # bool, signed and unsigned integers, floats: dtypes whose bytes are only numbers


def _plain_dtype(what: str, d) -> np.dtype:
    if not isinstance(d, np.dtype) or d.kind not in _PLAIN_KINDS or d.flags or d.names or d.subdtype:
        raise UnsafePickleError(f"refusing {what} {d!r}: only plain numeric dtypes are allowed")
    return d


def _dtype(spec, align=False, copy=False):
    if not isinstance(spec, str):
        raise UnsafePickleError(f"refusing numpy.dtype({spec!r}): only type codes such as 'u1' are allowed")
    return _plain_dtype("numpy dtype", np.dtype(spec, align, copy))


def _latin1_encode(text, encoding="latin1", errors="strict"):
    # Python 3 writes bytes into protocol-2 pickles as _codecs.encode(str, "latin1"); nothing else passes.
    if not isinstance(text, str) or not isinstance(encoding, str) \
            or encoding.lower().replace("_", "-") not in ("latin1", "latin-1") or errors != "strict":
        raise UnsafePickleError(f"refusing _codecs.encode({type(text).__name__}, {encoding!r}, {errors!r}): "
                                f"only latin-1 strings are allowed")
    return codecs.encode(text, "latin1")


def _reconstruct(subtype, shape, typecode):
    # numpy pickles an array as _reconstruct(ndarray, (0,), b"b") followed by a BUILD with its real state.
    if subtype is not np.ndarray or shape != (0,) or typecode not in (b"b", "b"):
        raise UnsafePickleError(f"refusing numpy _reconstruct({subtype!r}, {shape!r}, {typecode!r})")
    return _RECONSTRUCT(subtype, shape, typecode)


def _frombuffer(buf, dtype, shape, order):
    if not isinstance(buf, (bytes, bytearray)):
        raise UnsafePickleError(f"refusing an array over a {type(buf).__name__} buffer")
    return _FROMBUFFER(buf, _plain_dtype("array dtype", dtype), shape, order)


_sample = np.zeros(1, np.uint8)
_RECONSTRUCT = _sample.__reduce__()[0]      # numpy.(_)core.multiarray._reconstruct
_FROMBUFFER = _sample.__reduce_ex__(5)[0]   # numpy.(_)core.numeric._frombuffer (protocol 5)
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _dtype,
    ("_codecs", "encode"): _latin1_encode,
}
_CALLABLE = (_reconstruct, _frombuffer, _dtype, _latin1_encode)  # what REDUCE may call (not numpy.ndarray)


def _check_build(inst, state) -> None:
    """BUILD hands `state` to inst.__setstate__; numpy trusts it (a dtype state may even claim that the
    bytes hold Python objects), so only the states of plain arrays and dtypes pass."""
    if isinstance(inst, np.dtype):
        ok = (isinstance(state, tuple) and len(state) == 8 and state[0] == 3 and state[1] in ("|", "<", ">", "=")
              and state[2:] == (None, None, None, -1, -1, 0))
        if not ok:
            raise UnsafePickleError(f"refusing numpy dtype state {state!r}: only plain numeric dtypes are allowed")
    elif isinstance(inst, np.ndarray):
        ok = (isinstance(state, tuple) and len(state) == 5 and state[0] == 1 and isinstance(state[1], tuple)
              and isinstance(state[3], bool) and isinstance(state[4], (bytes, str)))
        if not ok:
            raise UnsafePickleError("refusing a numpy array state other than (1, shape, dtype, fortran, bytes)")
        dtype = _plain_dtype("array dtype", state[2])
        # numpy's __setstate__ sizes the array from the shape; the bytes must be exactly that many (they came
        # from the file, so nothing bigger than the file is ever allocated).
        shape = state[1]
        if not all(isinstance(n, int) and n >= 0 for n in shape):
            raise UnsafePickleError(f"refusing a numpy array state with shape {shape!r}")
        need = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if need != len(state[4]):
            raise UnsafePickleError(f"refusing a numpy array state of shape {shape} {dtype} ({need} bytes) "
                                    f"with {len(state[4])} bytes of data")
    else:
        raise UnsafePickleError(f"refusing to set the state of a {type(inst).__name__}")


class SafeUnpickler(pickle._Unpickler):
    """Unpickles dicts, lists, tuples, str, bytes, numbers and numpy arrays of plain numeric dtypes,
    nothing else.

    A pickle reaches code in two ways, and both are closed: every global it names goes through
    :meth:`find_class`, which answers from a fixed table (numpy's array and dtype reconstruction, latin-1
    encoding of strings) and refuses anything else -- ``os.system``, ``builtins.eval``, any class --
    before it could be called; and every BUILD (a call of ``__setstate__``) is vetted, since numpy takes
    a dtype's flags from its pickled state. It is the pure-Python unpickler (the C one cannot be hooked at
    BUILD); a CIFAR batch is a few large strings, so it is not slower in practice. Persistent ids and
    out-of-band buffers are refused by pickle itself."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module, name):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise UnsafePickleError(f"refusing to load global {module}.{name}: only dicts, lists, strings, "
                                    f"numbers and numpy arrays are allowed in a dataset pickle") from None

    def load_build(self):
        _check_build(self.stack[-2], self.stack[-1])
        pickle._Unpickler.load_build(self)

    dispatch[pickle.BUILD[0]] = load_build

    def load_reduce(self):
        # REDUCE calls stack[-2](*stack[-1]). Only the vetting functions of the table may be called: the
        # table also holds numpy.ndarray (the subtype argument of _reconstruct), and calling it would build
        # any array at all -- an object array, or a 1 TiB one from a 60-byte file.
        func = self.stack[-2]
        if not any(func is f for f in _CALLABLE):
            raise UnsafePickleError(f"refusing to call {getattr(func, '__name__', type(func).__name__)}: only "
                                    f"numpy's array and dtype reconstruction may be called")
        pickle._Unpickler.load_reduce(self)

    dispatch[pickle.REDUCE[0]] = load_reduce

    def _refuse_instantiation(self):
        raise UnsafePickleError("refusing to create an object of a class (NEWOBJ / INST / OBJ): a CIFAR batch "
                                "holds only dicts, lists, strings, numbers and numpy arrays")

    for _opcode in (pickle.NEWOBJ, pickle.NEWOBJ_EX, pickle.INST, pickle.OBJ):
        dispatch[_opcode[0]] = _refuse_instantiation
    del _opcode


def safe_load_pickle(data: bytes, path: str = "<bytes>"):
    """The object in a pickle, through :class:`SafeUnpickler` (Python 2 strings decoded as latin-1, as
    numpy recommends for its arrays). UnsafePickleError names `path` and the refused global."""
    try:
        return SafeUnpickler(io.BytesIO(data), encoding="latin1").load()
    except UnsafePickleError as e:
        raise UnsafePickleError(f"{path}: {e}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError) as e:
        raise ValueError(f"{path}: not a readable pickle ({type(e).__name__}: {e}); truncated or corrupt?") from e


def _check_labels(path: str, labels: np.ndarray, n: int) -> np.ndarray:
    if labels.shape != (n,):
        raise ValueError(f"{path}: {n} images but labels of shape {labels.shape}")
    if n and (labels.min() < 0 or labels.max() > 9):
        raise ValueError(f"{path}: CIFAR-10 labels must lie in 0..9, found {int(labels.min())}..{int(labels.max())}")
    return labels.astype(np.int32)


def _read_pickled(path: str):
    batch = safe_load_pickle(read_bytes(path), path)
    if not isinstance(batch, dict):
        raise ValueError(f"{path}: a CIFAR-10 batch is a pickled dict, found {type(batch).__name__}")
    batch = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in batch.items()}
    missing = [k for k in ("data", "labels") if k not in batch]
    if missing:
        raise ValueError(f"{path}: CIFAR-10 batch without {' and '.join(map(repr, missing))} "
                         f"(keys found: {sorted(map(str, batch))})")
    data = batch["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _PIXELS:
        got = f"{data.dtype} array of shape {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise ValueError(f"{path}: 'data' must be a uint8 array of shape (N, {_PIXELS}), found {got}")
    try:
        labels = np.asarray(batch["labels"], dtype=np.int64)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"{path}: 'labels' must be a list of integers ({e})") from None
    return data.reshape(-1, 3, 32, 32), _check_labels(path, labels, len(data))


def _read_binary(path: str):
    raw = read_bytes(path)
    if not raw or len(raw) % (_PIXELS + 1):
        raise ValueError(f"{path}: {len(raw)} bytes is not a whole number of {_PIXELS + 1}-byte CIFAR-10 "
                         f"records (1 label byte + {_PIXELS} pixel bytes): truncated or not a binary batch")
    records = np.frombuffer(raw, np.uint8).reshape(-1, _PIXELS + 1)
    images = records[:, 1:].reshape(-1, 3, 32, 32).copy()
    return images, _check_labels(path, records[:, 0], len(records))


def read_cifar10_batch(path: str):
    """One batch file as ``(images uint8 (N, 3, 32, 32), labels int32 (N,))``: ``*.bin`` files are read as
    the binary version, anything else as the (safely unpickled) python version."""
    return _read_binary(path) if path.endswith(".bin") else _read_pickled(path)


def _batch_dir(data_dir: str) -> str:
    data_dir = os.path.expanduser(data_dir)
    if any(os.path.isfile(os.path.join(data_dir, TEST_BATCH + s)) for s in ("", ".bin")):
        return data_dir
    for sub in _SUBDIRS:  # the parent of an unpacked archive works too
        if os.path.isdir(os.path.join(data_dir, sub)):
            return os.path.join(data_dir, sub)
    return data_dir


def load_cifar10(data_dir: str):
    """``((train_x, train_y), (test_x, test_y))`` from the CIFAR-10 batches in `data_dir` (or in its
    ``cifar-10-batches-py`` / ``cifar-10-batches-bin`` subdirectory): for each of ``data_batch_1`` ..
    ``data_batch_5`` and ``test_batch``, the pickled file, else the ``.bin`` one.

    Images are float32 NCHW ``(N, 3, 32, 32)`` scaled to [0, 1] (divided by 255), labels int32 in 0..9
    (names in :data:`CIFAR10_CLASSES`). Raises FileNotFoundError listing missing batches and what the
    directory holds, ValueError for a truncated or malformed batch, UnsafePickleError for a pickle that
    asks for anything but plain data."""
    batch_dir = _batch_dir(data_dir)
    names = {name: name for name in TRAIN_BATCHES + (TEST_BATCH,)}
    paths = find_files(batch_dir, names, suffixes=("", ".bin"))
    out = []
    for group in (TRAIN_BATCHES, (TEST_BATCH,)):
        parts = [read_cifar10_batch(paths[name]) for name in group]
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        out.append((x.astype(np.float32) / 255.0, y))
    return out[0], out[1]
