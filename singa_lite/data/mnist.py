"""MNIST from its four IDX files in a local directory (gzipped or not). Nothing is downloaded.

    (train_x, train_y), (test_x, test_y) = load_mnist("~/mnist")
    # train_x: float32 (60000, 1, 28, 28) in [0, 1]; train_y: int32 (60000,) in 0..9

The IDX format (http://yann.lecun.com/exdb/mnist/): a big-endian 4-byte magic number -- two zero bytes, a
type code (0x08 = unsigned byte) and the number of dimensions -- then one big-endian uint32 per dimension,
then the values in row-major order. MNIST's images are 0x00000803 (2051: bytes, 3 dimensions), its labels
0x00000801 (2049: bytes, 1 dimension).
"""
from __future__ import annotations

import gzip
import math
import os
import zlib

import numpy as np

MNIST_FILES = {
    "train images": "train-images-idx3-ubyte",
    "train labels": "train-labels-idx1-ubyte",
    "test images": "t10k-images-idx3-ubyte",
    "test labels": "t10k-labels-idx1-ubyte",
}
IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049

# IDX type code -> big-endian numpy dtype
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_bytes(path: str) -> bytes:
    """The file's bytes, gunzipped when it is a gzip file (told by its content, not its name)."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise ValueError(f"{path}: corrupt or truncated gzip file ({e}); fetch it again, "
                         f"or gunzip it and check the result") from e


def _read_idx(path: str) -> tuple[int, np.ndarray]:
    raw = read_bytes(path)
    if len(raw) < 4:
        raise ValueError(f"{path}: {len(raw)} bytes, too short for an IDX file (a 4-byte magic number first)")
    magic = int.from_bytes(raw[:4], "big")
    if raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise ValueError(f"{path}: not an IDX file: magic number {magic} (0x{magic:08x}); an IDX file starts "
                         f"with two zero bytes, a type code and the number of dimensions (MNIST images: "
                         f"{IMAGES_MAGIC}, labels: {LABELS_MAGIC})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header: magic {magic} announces {ndim} dimensions "
                         f"({header} header bytes) but the file has {len(raw)} bytes")
    dims = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    expected = header + math.prod(dims) * dtype.itemsize
    if len(raw) != expected:
        what = "truncated" if len(raw) < expected else "trailing bytes after the data"
        raise ValueError(f"{path}: {what}: the header announces shape {dims} of {dtype.name}, "
                         f"{expected} bytes in all, but the file has {len(raw)} bytes")
    values = np.frombuffer(raw, dtype, count=math.prod(dims), offset=header)
    return magic, values.astype(dtype.newbyteorder("=")).reshape(dims)


def read_idx(path: str) -> np.ndarray:
    """One IDX file (plain or gzipped) as a native-endian, writable numpy array of the shape in its header.
    Raises ValueError naming the file when it is not IDX, truncated, or longer than its header says."""
    return _read_idx(path)[1]


def find_files(data_dir: str, stems: dict, suffixes=("", ".gz")) -> dict:
    """{key: path} for each stem in `stems` ({key: file name}), trying each suffix in order. Raises
    FileNotFoundError naming every missing file and what the directory does hold."""
    data_dir = os.path.expanduser(data_dir)
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"dataset directory {data_dir!r} does not exist (singa_lite never downloads: "
                                f"put the files there first)")
    found, missing = {}, []
    for key, stem in stems.items():
        for suffix in suffixes:
            path = os.path.join(data_dir, stem + suffix)
            if os.path.isfile(path):
                found[key] = path
                break
        else:
            missing.append(stem + (f"[{'|'.join(s for s in suffixes if s)}]" if len(suffixes) > 1 else ""))
    if missing:
        held = sorted(os.listdir(data_dir))
        shown = ", ".join(held[:20]) + (f", ... ({len(held)} entries)" if len(held) > 20 else "")
        raise FileNotFoundError(f"{data_dir}: missing {', '.join(missing)}; the directory holds "
                                f"{shown or 'nothing'} (singa_lite never downloads: put the files there first)")
    return found


def _checked(path: str, magic_wanted: int, what: str) -> np.ndarray:
    magic, array = _read_idx(path)
    if magic != magic_wanted:
        raise ValueError(f"{path}: magic number {magic}, expected {magic_wanted} for MNIST {what} "
                         f"(unsigned bytes, {magic_wanted & 0xFF} dimension{'s' if magic_wanted & 0xFF > 1 else ''})")
    return array


def load_mnist(data_dir: str):
    """``((train_x, train_y), (test_x, test_y))`` from the four MNIST IDX files in `data_dir`
    (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
    ``t10k-labels-idx1-ubyte``, each optionally ``.gz``; the plain file wins when both are there).

    Images are float32, NCHW ``(N, 1, rows, cols)``, scaled to [0, 1] (divided by 255); labels are int32.
    Raises FileNotFoundError (missing files, listing what is there) or ValueError (wrong magic number,
    truncated file, image and label counts that differ, labels outside 0..9, train and test image sizes
    that differ)."""
    paths = find_files(data_dir, MNIST_FILES)
    splits = []
    for split in ("train", "test"):
        x = _checked(paths[f"{split} images"], IMAGES_MAGIC, "images")
        y = _checked(paths[f"{split} labels"], LABELS_MAGIC, "labels")
        if len(x) != len(y):
            raise ValueError(f"MNIST {split} set in {data_dir}: {len(x)} images but {len(y)} labels "
                             f"({paths[f'{split} images']}, {paths[f'{split} labels']})")
        if len(y) and y.max() > 9:
            raise ValueError(f"{paths[f'{split} labels']}: labels must lie in 0..9, found {int(y.max())}")
        splits.append((x[:, None].astype(np.float32) / 255.0, y.astype(np.int32)))
    (train_x, _), (test_x, _) = splits
    if train_x.shape[2:] != test_x.shape[2:]:
        raise ValueError(f"MNIST in {data_dir}: train images are {train_x.shape[2:]} but test images "
                         f"are {test_x.shape[2:]}")
    return splits[0], splits[1]
