"""The file side of checkpoints, shared by :mod:`singa_lite.checkpoint` and :mod:`singa_lite.model_states`:
writing files atomically or exclusively, one writer at a time per checkpoint directory, and reading JSON
and ``.npy`` entries of zip files that may be hostile.

Reading rules (a checkpoint may come from anywhere): an entry is read only when something that was
already checked names it; before a byte of an array is decompressed, the entry's declared size must be
exactly what its ``.npy`` header and the caller's declared dtype and shape make it, so memory never
exceeds the declared data (a zip bomb fails on its sizes); compression other than stored or deflated is
refused (their decompressors cannot be bounded); no pickle, only numeric dtypes; and every failure --
bad zip, bad CRC, truncated entry, bad JSON, JSON nested too deep -- is a :class:`CheckpointError` that
names the file and the entry.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import tempfile
import time
import zipfile
import zlib

import numpy as np

MAX_JSON_BYTES = 256 << 20  # JSON entries hold names, shapes and small states; no real one comes near
MAX_NPY_HEADER = 1 << 16  # numpy writes headers of a few hundred bytes; it refuses past 10000 by default
_READ_CHUNK = 1 << 18  # the one transient copy while an array is read
_NPY_MAGIC = b"\x93NUMPY"


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or loaded; the message names the file and what is wrong."""


# ---------------------------------------------------------------- writing
@contextlib.contextmanager
def _temp_file(path: str):
    """(binary file, its name): a private temporary file next to `path`, flushed and fsynced when the block
    ends, removed when it raises. mkstemp picks a fresh random name and creates it with O_EXCL (and
    O_NOFOLLOW) and mode 0o600, so a file or symbolic link planted at a name it could have chosen is
    never opened, and nobody else can read what is written."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f, tmp
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _unlink(tmp)
        raise


def _write_temp(path: str, data: bytes) -> str:
    """A fsynced temporary file (mode 0o600) next to `path`, holding `data`; its name."""
    with _temp_file(path) as (f, tmp):
        f.write(data)
    return tmp


@contextlib.contextmanager
def atomic_file(path: str):
    """``with atomic_file(path) as f: ...`` writes `path` through the binary file `f` so that `path` holds
    either its old content or everything written, even if the process or the machine dies: `f` is a
    private temporary file in the same directory (see _temp_file: a fresh name, O_EXCL, mode 0o600),
    flushed and fsynced, renamed over `path` when the block ends, then the directory is fsynced so that
    the rename itself is durable. If the block (or the rename) raises, the temporary file is removed and
    `path` is untouched. For writers that stream (a JSON encoder) rather than hold all the bytes."""
    with _temp_file(path) as (f, tmp):
        yield f
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def atomic_write(path: str, data: bytes) -> None:
    """Writes `data` to `path` atomically and durably (see atomic_file): `path` holds either its old
    content or all of `data`; the file has mode 0o600."""
    with atomic_file(path) as f:
        f.write(data)


def exclusive_write(path: str, data: bytes, what: str) -> None:
    """Creates `path` holding all of `data`, or raises FileExistsError if it exists -- decided atomically by
    the file system (a hard link of a complete temporary file, which fails if the name is taken), so of
    two processes writing one new path, exactly one succeeds, and a crash never leaves a partial file."""
    tmp = _write_temp(path, data)
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise FileExistsError(f"{what}: {path} already exists; remove it or choose another path") from None
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
                raise
            _create_new(path, data, what)  # a file system without hard links: O_EXCL, not crash-atomic
    finally:
        _unlink(tmp)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def _create_new(path: str, data: bytes, what: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise FileExistsError(f"{what}: {path} already exists; remove it or choose another path") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _unlink(path)
        raise


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


class DirectoryLock:
    """One writer at a time in a checkpoint directory: an exclusive ``flock`` on the directory itself (so
    the checkpoint gains no file), waited for up to `timeout` seconds, then CheckpointError. Where the
    file system cannot lock a directory (NFS emulates flock with byte-range locks, which need a file open
    for writing), the lock is ``<directory>/.lock`` instead, and holds its holder's pid for the message.
    The kernel releases the lock when its holder dies, so a killed save never blocks the next one."""

    NAME = ".lock"

    def __init__(self, directory: str, timeout: float, what: str):
        self.directory, self.timeout, self.what = directory, float(timeout), what
        self.fd = None

    def __enter__(self):
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # can this file system lock a directory at all?
            fcntl.flock(fd, fcntl.LOCK_UN)
            lock_file = None
        except BlockingIOError:  # yes, and a writer holds it
            lock_file = None
        except OSError as e:
            if e.errno not in (errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                os.close(fd)
                raise
            os.close(fd)
            lock_file = os.path.join(self.directory, self.NAME)
            fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + self.timeout
        delay = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _read_small(fd) if lock_file else ""
                    os.close(fd)
                    raise CheckpointError(
                        f"{self.what}: another save to {self.directory} is in progress (it holds the directory's "
                        f"lock{': ' + holder if holder else ''}) and did not finish within {self.timeout:g} s; "
                        f"wait for it, pass a longer lock_timeout, or save elsewhere") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
            except BaseException:
                os.close(fd)
                raise
        if lock_file:  # who holds it, for the message above (informative only: the lock is the flock)
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename}\n".encode(), 0)
            except OSError:
                pass
        self.fd = fd
        return self

    def __exit__(self, *exc):
        fd, self.fd = self.fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _read_small(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        return ""


# ---------------------------------------------------------------- reading
def json_loads(raw: bytes, what: str):
    """Parsed JSON; CheckpointError naming `what` for bad UTF-8, bad JSON or JSON nested too deep."""
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{what}: not valid JSON ({e})") from None
    except RecursionError:
        raise CheckpointError(f"{what}: JSON nested too deeply to read; not a file singa_lite wrote") from None


def read_json_file(path: str, limit: int = MAX_JSON_BYTES):
    size = os.path.getsize(path)
    if size > limit:
        raise CheckpointError(f"{path}: {size} bytes; a JSON file here is never over {limit} bytes")
    with open(path, "rb") as f:
        return json_loads(f.read(size), path)  # (read(n) allocates n bytes first: never more than needed)


def _info(zf: zipfile.ZipFile, name: str, fpath: str, stored_only: bool) -> zipfile.ZipInfo:
    try:
        info = zf.getinfo(name)
    except KeyError:
        raise CheckpointError(f"{fpath}: no entry {name!r} in the zip") from None
    allowed = (zipfile.ZIP_STORED,) if stored_only else (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
    if info.compress_type not in allowed:
        raise CheckpointError(f"{fpath}: entry {name!r} uses compression method {info.compress_type}; only "
                              f"{' or '.join({0: 'stored', 8: 'deflated'}[c] for c in allowed)} entries are read")
    return info


def read_json_entry(zf: zipfile.ZipFile, name: str, fpath: str, stored_only: bool = False,
                    limit: int = MAX_JSON_BYTES):
    """The JSON in entry `name`, refused before decompressing if it declares more than `limit` bytes."""
    info = _info(zf, name, fpath, stored_only)
    if info.file_size > limit:
        raise CheckpointError(f"{fpath}: entry {name!r} declares {info.file_size} bytes; a JSON entry here is "
                              f"never over {limit} bytes")
    with _zip_errors(fpath, name), zf.open(info) as f:
        raw = f.read(info.file_size)  # zipfile stops at the declared size, whatever the data inflates to
    return json_loads(raw, f"{fpath} ({name})")


def array_spec(dtype, shape, where: str) -> tuple:
    """(numpy dtype, shape tuple) from their JSON forms, checked: a numeric dtype, non-negative int sizes."""
    try:
        dt = np.dtype(dtype) if isinstance(dtype, str) else None
    except TypeError:
        dt = None
    if dt is None or dt.hasobject or dt.kind not in "biufc" or dt.fields is not None or dt.subdtype is not None:
        raise CheckpointError(f"{where}: dtype {dtype!r} is not a numeric dtype; checkpoints hold numeric arrays")
    if not isinstance(shape, (list, tuple)) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise CheckpointError(f"{where}: shape {shape!r} is not a list of sizes >= 0")
    return dt, tuple(shape)


def nbytes_of(dt: np.dtype, shape: tuple) -> int:
    n = dt.itemsize
    for s in shape:
        n *= s  # Python ints: no overflow, whatever the header claims
    return n


def _read_exact(f, n: int, fpath: str, name: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise CheckpointError(f"{fpath}: entry {name!r} is truncated (ends after {len(data)} of {n} bytes read)")
    return data


def _npy_header(f, fpath: str, name: str) -> tuple:
    """(header length in bytes, dtype, shape, fortran order) of the .npy stream `f`, reading at most
    MAX_NPY_HEADER bytes of it."""
    prefix = _read_exact(f, 8, fpath, name)
    if prefix[:6] != _NPY_MAGIC:
        raise CheckpointError(f"{fpath}: entry {name!r} is not a .npy array (bad magic {prefix[:6]!r})")
    major = prefix[6]
    if major not in (1, 2, 3):
        raise CheckpointError(f"{fpath}: entry {name!r} has .npy format version {major}; 1 to 3 are read")
    len_bytes = _read_exact(f, 2 if major == 1 else 4, fpath, name)
    hlen = int.from_bytes(len_bytes, "little")
    if hlen > MAX_NPY_HEADER:
        raise CheckpointError(f"{fpath}: entry {name!r} declares a {hlen}-byte .npy header; numpy's are a few "
                              f"hundred bytes")
    header = _read_exact(f, hlen, fpath, name)
    reader = {1: np.lib.format.read_array_header_1_0}.get(major, np.lib.format.read_array_header_2_0)
    try:
        if major == 3:  # utf-8 header: parse as version 2 after checking it decodes
            header.decode("utf-8")
        shape, fortran, dtype = reader(io.BytesIO(len_bytes + header), max_header_size=MAX_NPY_HEADER)
    except (ValueError, SyntaxError, TypeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{fpath}: entry {name!r} has a bad .npy header ({e})") from None
    return len(prefix) + len(len_bytes) + hlen, dtype, shape, fortran


def read_npy_entry(zf: zipfile.ZipFile, name: str, fpath: str, dtype=None, shape=None,
                   stored_only: bool = False) -> np.ndarray:
    """The array in entry `name` (a .npy file). `dtype` / `shape`: what the caller's index declares (None:
    whatever the header says); the entry must declare exactly the header plus that many bytes, checked
    before its data is decompressed. Read without pickle, into one array of the declared size."""
    info = _info(zf, name, fpath, stored_only)
    if dtype is not None and shape is not None:
        want = nbytes_of(dtype, shape)
        if not want <= info.file_size <= want + 12 + MAX_NPY_HEADER:
            raise CheckpointError(f"{fpath}: entry {name!r} declares {info.file_size} bytes, but a {dtype} "
                                  f"{tuple(shape)} array takes {want} bytes (plus its header): refused unread")
    with _zip_errors(fpath, name), zf.open(info) as f:
        hlen, dt, sh, fortran = _npy_header(f, fpath, name)
        if dt.hasobject or dt.kind not in "biufc" or dt.fields is not None:
            raise CheckpointError(f"{fpath}: entry {name!r} holds dtype {dt}; only numeric arrays are read "
                                  f"(no pickle)")
        if (dtype is not None and dt != dtype) or (shape is not None and tuple(sh) != tuple(shape)):
            raise CheckpointError(f"{fpath}: entry {name!r} holds a {dt} {tuple(sh)} array, but the file's "
                                  f"index declares {dtype} {tuple(shape) if shape is not None else '(any)'}")
        size = nbytes_of(dt, sh)
        if info.file_size != hlen + size:
            problem = "truncated" if info.file_size < hlen + size else "has trailing bytes"
            raise CheckpointError(f"{fpath}: entry {name!r} {problem}: its header declares a {dt} {tuple(sh)} "
                                  f"array ({size} bytes of data), the entry holds "
                                  f"{info.file_size - hlen} bytes of data")
        try:
            out = np.empty(sh, dt, order="F" if fortran else "C")
        except MemoryError:
            raise CheckpointError(f"{fpath}: entry {name!r} holds a {dt} {tuple(sh)} array ({size} bytes), "
                                  f"more than this process can allocate") from None
        view = memoryview(out.reshape(-1, order="A").view(np.uint8)) if size else memoryview(b"")
        done = 0
        while done < size:  # in chunks, so that reading costs the array plus one chunk
            chunk = f.read(min(_READ_CHUNK, size - done))
            if not chunk:
                raise CheckpointError(f"{fpath}: entry {name!r} is truncated (ends after {done} of "
                                      f"{size} bytes of data)")
            view[done:done + len(chunk)] = chunk
            done += len(chunk)
        f.read(1)  # reaches the end of the entry, where zipfile checks its CRC-32
    return out


class _zip_errors:
    """Turns what zipfile / zlib raise on a corrupt entry into a CheckpointError naming the entry."""

    def __init__(self, fpath: str, name: str):
        self.fpath, self.name = fpath, name

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if kind is not None and issubclass(kind, (zipfile.BadZipFile, zlib.error, EOFError, OSError,
                                                  NotImplementedError, RuntimeError)):
            raise CheckpointError(f"{self.fpath}: entry {self.name!r} is corrupt ({type(e).__name__}: {e})") from None
        return False


def open_zip(fpath: str, source=None) -> zipfile.ZipFile:
    """A ZipFile on `source` (an open binary file, or bytes), or on the file `fpath`; CheckpointError if it
    is not a zip."""
    if isinstance(source, (bytes, bytearray)):
        source = io.BytesIO(source)
    try:
        return zipfile.ZipFile(source if source is not None else fpath)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError) as e:
        raise CheckpointError(f"{fpath}: not a readable zip file ({type(e).__name__}: {e})") from None
