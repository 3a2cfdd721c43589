"""Hostile checkpoint files: zip bombs (peak memory measured in a subprocess), and the loader's errors on
malformed content (each a CheckpointError naming the file and the problem), for checkpoint.load and
Model.load_states; and numpy scalars in `extra`, which come back as Python numbers."""
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from singa_lite import autograd, checkpoint, layer, model, opt, tensor  # noqa: F401 (autograd first: see layer.py)
from singa_lite.checkpoint import CheckpointError

N = 512  # W: N x N float32, 1 MiB of declared data
DECLARED = N * N * 4
BOMB = 256 << 20  # 256 MiB of zeros, a few hundred KiB deflated


# ---------------------------------------------------------------- helpers
def saved_dir(tmp_path, **extra):
    path = str(tmp_path / "ck")
    checkpoint.save(path, {"W": tensor.from_numpy(np.ones((N, N), np.float32))}, extra=extra or None)
    return path


def shard_name(path):
    return json.load(open(os.path.join(path, "manifest.json")))["shared"]["name"]


def entries(zpath):
    with zipfile.ZipFile(zpath) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()}


def rewrite_shard(path, change):
    """Rewrites the shared file with change(entries) -> [(name, bytes or writer, compress_type)], and the
    manifest's size and SHA-256 to match, so that only the reader's own checks stand in the way."""
    name = shard_name(path)
    fpath = os.path.join(path, name)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for entry, data, compression in change(entries(fpath)):
            if callable(data):
                with zf.open(zipfile.ZipInfo(entry) if compression is None else _info(entry, compression), "w",
                             force_zip64=True) as f:
                    data(f)
            else:
                zf.writestr(_info(entry, compression or zipfile.ZIP_STORED), data)
    data = buf.getvalue()
    with open(fpath, "wb") as f:
        f.write(data)
    mpath = os.path.join(path, "manifest.json")
    m = json.load(open(mpath))
    m["shared"].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    with open(mpath, "w") as f:
        json.dump(m, f)
    return fpath


def _info(name, compression):
    info = zipfile.ZipInfo(name)
    info.compress_type = compression
    return info


def keep(es):
    return [(k, v, zipfile.ZIP_STORED) for k, v in es.items()]


def zeros_npy(count, dtype=np.float32):
    """A writer of a .npy file of `count` zeros, streamed (never whole in this process's memory)."""
    def write(f):
        np.lib.format.write_array_header_1_0(f, {"descr": np.dtype(dtype).str, "fortran_order": False,
                                                 "shape": (count,)})
        chunk = bytes(8 << 20)
        left = count * np.dtype(dtype).itemsize
        while left:
            f.write(chunk[:min(left, len(chunk))])
            left -= min(left, len(chunk))
    return write


def npy_bytes(a, shape=None):
    """a's .npy bytes; `shape`: a header that declares this shape instead (the data stays a's)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": a.dtype.str, "fortran_order": False,
                                               "shape": a.shape if shape is None else shape})
    return buf.getvalue() + a.tobytes()


def peak_of(prep: str, run: str) -> tuple:
    """(outcome, peak bytes traced by tracemalloc while `run` ran) in a fresh process, `prep` run first;
    outcome is "ok" or the exception's name and message. numpy's arrays are traced, so the peak includes
    every array and buffer a load makes."""
    script = "\n".join([
        "import sys, tracemalloc",
        "import numpy as np",
        "from singa_lite import autograd, checkpoint, layer, model, tensor",
        "import singa_lite.parallel.dist_opt  # imported by load on first use: not the load's own memory",
        prep,
        "tracemalloc.start()",
        "try:",
        f"    {run}",
        "    outcome = 'ok'",
        "except Exception as e:",
        "    outcome = f'{type(e).__name__}: {e}'",
        "print(tracemalloc.get_traced_memory()[1])",
        "print(outcome)",
    ])
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    peak, outcome = out.stdout.strip().split("\n", 1)
    return outcome, int(peak)


def load_peak(path):
    return peak_of(f"W = tensor.from_numpy(np.zeros(({N}, {N}), np.float32))",
                   f"checkpoint.load({path!r}, {{'W': W}})")


# ---------------------------------------------------------------- zip bombs: checkpoint shards
def test_a_good_load_peaks_within_twice_its_declared_data(tmp_path):
    outcome, peak = load_peak(saved_dir(tmp_path))
    assert outcome == "ok"
    assert peak < 2 * DECLARED, f"peak {peak} bytes for {DECLARED} bytes of arrays"


def test_an_unreferenced_deflated_bomb_in_a_shard_is_refused_unread(tmp_path):
    path = saved_dir(tmp_path)
    fpath = rewrite_shard(path, lambda es: keep(es) + [("arrays/9.npy", zeros_npy(BOMB // 4), zipfile.ZIP_DEFLATED)])
    assert os.path.getsize(fpath) < 2 << 20, "a small file..."
    outcome, peak = load_peak(path)
    assert outcome.startswith("CheckpointError") and fpath in outcome, outcome
    assert "arrays/9.npy" in outcome and "does not reference" in outcome
    assert peak < 2 * DECLARED, f"peak {peak} bytes: the bomb was decompressed"


def test_a_referenced_entry_larger_than_declared_is_refused_unread(tmp_path):
    path = saved_dir(tmp_path)
    # arrays/0.npy is W (state.json declares float32 (512, 512)); here it declares 256 MiB, stored
    fpath = rewrite_shard(path, lambda es: [(k, v, zipfile.ZIP_STORED) for k, v in es.items() if k != "arrays/0.npy"]
                          + [("arrays/0.npy", zeros_npy(BOMB // 4), zipfile.ZIP_STORED)])
    outcome, peak = load_peak(path)
    assert outcome.startswith("CheckpointError") and fpath in outcome, outcome
    assert "'arrays/0.npy' declares 268435584 bytes, but a float32 (512, 512) array takes 1048576" in outcome
    assert peak < 2 * DECLARED


def test_a_compressed_shard_entry_is_refused(tmp_path):
    path = saved_dir(tmp_path)
    fpath = rewrite_shard(path, lambda es: [(k, v, zipfile.ZIP_DEFLATED if k == "arrays/0.npy" else zipfile.ZIP_STORED)
                                            for k, v in es.items()])
    with pytest.raises(CheckpointError, match=rf"{fpath}: entry 'arrays/0.npy' uses compression method 8; "
                                              r"only stored entries are read"):
        checkpoint.load(path, {"W": tensor.from_numpy(np.zeros((N, N), np.float32))})


# ---------------------------------------------------------------- checkpoint.load: error quality
def refuse(path, match):
    W = tensor.from_numpy(np.full((N, N), 7, np.float32))
    with pytest.raises(CheckpointError, match=match):
        checkpoint.load(path, {"W": W})
    assert (tensor.to_numpy(W) == 7).all(), "nothing was changed"


def test_a_deeply_nested_manifest(tmp_path):
    path = saved_dir(tmp_path)
    mpath = os.path.join(path, "manifest.json")
    with open(mpath, "w") as f:
        f.write("[" * 200000 + "]" * 200000)
    refuse(path, rf"{mpath}: JSON nested too deeply")


def test_a_deeply_nested_state_json(tmp_path):
    path = saved_dir(tmp_path)
    deep = '{"a":' * 5000 + "1" + "}" * 5000
    fpath = rewrite_shard(path, lambda es: [(k, deep.encode() if k == "state.json" else v, zipfile.ZIP_STORED)
                                            for k, v in es.items()])
    refuse(path, rf"{fpath} \(state.json\): JSON nested too deeply|{fpath}: state.json is nested too deeply")


def test_an_npy_header_declaring_2_to_the_40_elements(tmp_path):
    path = saved_dir(tmp_path)
    huge = npy_bytes(np.zeros(4, np.float32), shape=(2 ** 40,))
    fpath = rewrite_shard(path, lambda es: [(k, huge if k == "arrays/0.npy" else v, zipfile.ZIP_STORED)
                                            for k, v in es.items()])
    refuse(path, rf"{fpath}: entry 'arrays/0.npy' declares \d+ bytes, but a float32 \(512, 512\) array takes")


def test_an_npy_header_declaring_2_to_the_40_elements_format_1_reference(tmp_path):
    """A format 1 file (references without dtype and shape): the entry's size against its own header."""
    path = saved_dir(tmp_path)
    huge = npy_bytes(np.zeros(4, np.float32), shape=(2 ** 40,))

    def change(es):
        state = json.loads(es["state.json"])
        state["model"]["W"] = {"$array": state["model"]["W"]["$array"]}
        return [(k, huge if k == "arrays/0.npy" else json.dumps(state).encode() if k == "state.json" else v,
                 zipfile.ZIP_STORED) for k, v in es.items()]
    fpath = rewrite_shard(path, change)
    refuse(path, rf"{fpath}: entry 'arrays/0.npy' truncated: its header declares a float32 \(1099511627776,\) "
                 r"array \(4398046511104 bytes of data\), the entry holds 16 bytes of data")


def test_a_truncated_array(tmp_path):
    path = saved_dir(tmp_path)
    fpath = rewrite_shard(path, lambda es: [(k, v[:len(v) // 2] if k == "arrays/0.npy" else v, zipfile.ZIP_STORED)
                                            for k, v in es.items()])
    refuse(path, rf"{fpath}: entry 'arrays/0.npy' declares \d+ bytes, but a float32 \(512, 512\) array takes "
                 r"1048576 bytes \(plus its header\): refused unread")


def test_an_array_whose_header_contradicts_its_declaration(tmp_path):
    path = saved_dir(tmp_path)
    other = npy_bytes(np.zeros((N * N,), np.int32))
    fpath = rewrite_shard(path, lambda es: [(k, other if k == "arrays/0.npy" else v, zipfile.ZIP_STORED)
                                            for k, v in es.items()])
    refuse(path, rf"{fpath}: entry 'arrays/0.npy' holds a int32 \(262144,\) array, but the file's index declares "
                 r"float32 \(512, 512\)")


def test_optimizer_slots_for_parameters_the_model_does_not_have(tmp_path):
    W = tensor.from_numpy(np.ones((3, 3), np.float32))
    V = tensor.from_numpy(np.ones((3,), np.float32))
    W.stores_grad = V.stores_grad = True
    sgd = opt.SGD(lr=0.1, momentum=0.9)
    sgd.apply("W", W, tensor.from_numpy(np.ones((3, 3), np.float32)))
    sgd.apply("V", V, tensor.from_numpy(np.ones((3,), np.float32)))
    path = str(tmp_path / "ck")
    checkpoint.save(path, {"W": W, "V": V}, sgd)
    V.stores_grad = False  # same states, but V is no parameter any more: its momentum fits nothing
    other = opt.SGD(lr=0.1, momentum=0.9)
    with pytest.raises(CheckpointError, match=r"optimizer state moments\['V'\] is for a parameter the model "
                                              r"does not have \(its parameters: \['W'\]\)"):
        checkpoint.load(path, {"W": W, "V": V}, other)
    assert other.get_states()["moments"] == {} and other.step_counter == 0


# ---------------------------------------------------------------- extra: numpy scalars
def test_numpy_scalars_in_extra_come_back_as_python_numbers(tmp_path):
    history = [(np.float64(0.25), np.float32(0.5), np.float64(0.875))]
    path = saved_dir(tmp_path, epoch=np.int64(3), history=history, done=np.bool_(True), zero_d=np.array(2.5),
                     arr=np.arange(3))
    extra = checkpoint.load(path, {"W": tensor.from_numpy(np.zeros((N, N), np.float32))})
    assert type(extra["epoch"]) is int and extra["epoch"] == 3
    assert type(extra["done"]) is bool and extra["done"] is True
    assert [type(v) for v in extra["history"][0]] == [float, float, float]
    assert type(extra["zero_d"]) is float and extra["zero_d"] == 2.5
    assert isinstance(extra["arr"], np.ndarray) and extra["arr"].tolist() == [0, 1, 2]
    # what examples/dist_training.py does with it when it resumes a finished run
    assert f"final test accuracy {[tuple(h) for h in extra['history']][-1][2]:.4f}" == "final test accuracy 0.8750"


def test_a_format_1_checkpoint_still_loads(tmp_path):
    """Format 1 references gave only the array's number; such files load, each entry checked against its
    own .npy header."""
    path = saved_dir(tmp_path, lr=np.array([0.5], np.float32))

    def to_format_1(es):
        state = json.loads(es["state.json"])
        state["model"]["W"] = {"$array": state["model"]["W"]["$array"]}
        state["extra"]["lr"] = {"$array": state["extra"]["lr"]["$array"]}
        header = {**json.loads(es["header.json"]), "format_version": 1}
        return [(k, json.dumps(state).encode() if k == "state.json" else json.dumps(header).encode()
                 if k == "header.json" else v, zipfile.ZIP_STORED) for k, v in es.items()]
    rewrite_shard(path, to_format_1)
    mpath = os.path.join(path, "manifest.json")
    m = json.load(open(mpath))
    m["format_version"] = 1
    json.dump(m, open(mpath, "w"))
    W = tensor.from_numpy(np.zeros((N, N), np.float32))
    extra = checkpoint.load(path, {"W": W})
    assert (tensor.to_numpy(W) == 1).all() and extra["lr"].tolist() == [0.5]
