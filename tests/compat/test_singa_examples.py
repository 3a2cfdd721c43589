"""Apache SINGA's examples/cnn scripts, run unchanged but for documented CPU edits, against singa_lite.

SINGA's files are never committed: they come from the ignored folder .singa_ref/ that
``python tools/singa_suite.py --mirror PATH tests`` fills from a git mirror of apache/singa. Without it
(CI has no mirror) every test here is skipped. The ``mlp`` model lives in SINGA's examples/mlp, which the
tool copies too (older .singa_ref/ folders lack it: then $SINGA_MIRROR is read, or its cases skip).

What runs: ``train_cnn.py`` (one process), ``train_mpi.py`` under ``mpiexec -n 2`` and
``train_multiprocess.py`` (2 processes) for the ``cnn`` and ``mlp`` models, the distributed scripts with
every ``--dist-option`` (plain, half, partialUpdate, sparseTopK, sparseThreshold), each a few epochs on
MNIST-format files made from the digits bundled with scikit-learn (MNIST is not downloadable here). A run
passes when it ends with status 0 and learned: the training loss fell and the last evaluation accuracy is
at least 0.3 (chance is 0.1).

The edits, each checked to apply exactly once:
1. the device line: ``device.create_cuda_gpu_on(local_rank)`` -> ``device.create_cpu_device()`` (the script's
   own comment asks for it on CPU-only machines);
2. the MNIST paths in data/mnist.py: ``/tmp/...-ubyte.gz`` -> our temporary folder (its comment asks too);
3. numpy >= 2.4 no longer converts a shape-(1,) array for ``'%f' %`` (the scripts keep their accuracy
   and loss sums as such arrays): the two progress prints take ``.item()`` of them.
"""
from __future__ import annotations

import gzip
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
REF = ROOT / ".singa_ref"
CNN = REF / "examples" / "cnn"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (CNN / "train_cnn.py").is_file(),
                       reason="SINGA's examples are not in .singa_ref/ (python tools/singa_suite.py --mirror PATH "
                              "tests copies them)"),
]

DIST_OPTIONS = ["plain", "half", "partialUpdate", "sparseTopK", "sparseThreshold"]
EDITS = {
    "train_cnn.py": [
        ("dev = device.create_cuda_gpu_on(local_rank)", "dev = device.create_cpu_device()"),
        ("(train_loss, train_correct /", "(train_loss.item(), train_correct.item() /"),
        ("(test_correct / (num_val_batch", "(test_correct.item() / (num_val_batch"),
    ],
}
RUN_TIMEOUT = 600


def _edit(path: Path, pairs) -> None:
    text = path.read_text()
    for old, new in pairs:
        n = text.count(old)
        assert n == 1, f"{path.name}: expected {old!r} once, found it {n} times (did SINGA's script change?)"
        text = text.replace(old, new)
    path.write_text(text)


def _idx_images(x: np.ndarray) -> bytes:
    pixels = np.clip(np.rint(x[:, 0] * 255), 0, 255).astype(np.uint8)
    return struct.pack(">IIII", 2051, *pixels.shape) + pixels.tobytes()


def _idx_labels(y: np.ndarray) -> bytes:
    return struct.pack(">II", 2049, len(y)) + y.astype(np.uint8).tobytes()


def _mlp_source(work: Path) -> bool:
    """Puts SINGA's examples/mlp next to the cnn folder (train_cnn.py imports it from there)."""
    local = REF / "examples" / "mlp"
    if (local / "model.py").is_file():
        shutil.copytree(local, work / "mlp")
        return True
    mirror = os.environ.get("SINGA_MIRROR")
    if not mirror:
        return False
    archive = subprocess.run(["git", "--git-dir", mirror, "archive", "HEAD", "examples/mlp"], capture_output=True)
    if archive.returncode != 0:
        return False
    subprocess.run(["tar", "-x", "-C", str(work), "--strip-components=1"], input=archive.stdout, check=True)
    return (work / "mlp" / "model.py").is_file()


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    pytest.importorskip("PIL", reason="SINGA's train_cnn.py imports PIL (pip install pillow)")
    pytest.importorskip("sklearn", reason="the digits data set comes with scikit-learn")
    from singa_lite.data.digits import load_digits

    w = tmp_path_factory.mktemp("singa_examples")
    shutil.copytree(CNN, w / "cnn")
    has_mlp = _mlp_source(w)
    data = w / "data"
    data.mkdir()
    (train_x, train_y), (test_x, test_y) = load_digits(seed=0)
    for name, raw in (("train-images-idx3-ubyte", _idx_images(train_x)),
                      ("train-labels-idx1-ubyte", _idx_labels(train_y)),
                      ("t10k-images-idx3-ubyte", _idx_images(test_x)),
                      ("t10k-labels-idx1-ubyte", _idx_labels(test_y))):
        with gzip.open(data / f"{name}.gz", "wb") as f:
            f.write(raw)
    _edit(w / "cnn" / "train_cnn.py", EDITS["train_cnn.py"])
    mnist = w / "cnn" / "data" / "mnist.py"
    text = mnist.read_text()
    assert text.count("'/tmp/") == 4, "data/mnist.py: expected its four /tmp/ MNIST paths"
    mnist.write_text(text.replace("'/tmp/", f"'{data}/"))
    return w, has_mlp


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REF / "alias"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")  # two ranks on a small machine: no oversubscription
    return env


def _run(work, model: str, argv: list[str]) -> str:
    w, has_mlp = work
    if model == "mlp" and not has_mlp:
        pytest.skip("SINGA's examples/mlp is not in .singa_ref/examples/mlp and $SINGA_MIRROR is not set")
    r = subprocess.run(argv, cwd=w / "cnn", env=_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{' '.join(argv)} exited with {r.returncode}:\n{out[-4000:]}"
    return out


def _assert_learned(out: str, epochs: int) -> None:
    losses = [float(v) for v in re.findall(r"Training loss = ([-\d.eE+]+)", out)]
    accs = [float(v) for v in re.findall(r"Evaluation accuracy = ([-\d.eE+]+)", out)]
    assert len(losses) == len(accs) == epochs, f"expected {epochs} epochs of output:\n{out[-3000:]}"
    assert losses[-1] < losses[0], f"the training loss did not fall: {losses}"
    assert accs[-1] >= 0.3, f"the evaluation accuracy stayed near chance: {accs}"


# (model, epochs, learning rate): the cnn learns more slowly per epoch on this small set
MODELS = [("mlp", 2, "0.05"), ("cnn", 3, "0.05")]


def _spars(option: str) -> list[str]:
    # a threshold of 0.05 (the default) sends almost none of the cnn's small gradients in 3 epochs
    return ["-s", "0.01"] if option == "sparseThreshold" else []


@pytest.mark.parametrize("graph", [True, False], ids=["graph", "no-graph"])
@pytest.mark.parametrize("model,epochs,lr", MODELS, ids=[m[0] for m in MODELS])
def test_train_cnn(work, model, epochs, lr, graph):
    argv = [sys.executable, "train_cnn.py", model, "mnist", "-m", str(epochs), "-l", lr, "-v", "1"]
    out = _run(work, model, argv + ([] if graph else ["-g"]))
    _assert_learned(out, epochs)
    # dev.PrintTimeProfiling() at verbosity 1: measured times of the iterations after the 5 skipped
    assert re.search(r"Forward Propagation Time : \d+\.\d+ sec", out), out[-2000:]
    assert "Backward Propagation Time" in out


def test_train_cnn_float16(work):
    # -p float16: float16 inputs, and the layers cast their parameters to the input's dtype as SINGA's do
    out = _run(work, "mlp", [sys.executable, "train_cnn.py", "mlp", "mnist", "-m", "2", "-l", "0.05", "-p", "float16"])
    _assert_learned(out, 2)


@pytest.mark.parametrize("option", DIST_OPTIONS)
@pytest.mark.parametrize("model,epochs,lr", MODELS, ids=[m[0] for m in MODELS])
def test_train_mpi(work, model, epochs, lr, option):
    mpiexec = shutil.which("mpiexec", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                             os.environ.get("PATH", "")]))
    if mpiexec is None:
        pytest.skip("mpiexec not found (pip install mpich)")
    argv = [mpiexec, "-n", "2", sys.executable, "train_mpi.py", model, "mnist", "-m", str(epochs), "-l", lr,
            "-d", option, *_spars(option)]
    _assert_learned(_run(work, model, argv), epochs)


@pytest.mark.parametrize("option", DIST_OPTIONS)
@pytest.mark.parametrize("model,epochs,lr", MODELS, ids=[m[0] for m in MODELS])
def test_train_multiprocess(work, model, epochs, lr, option):
    argv = [sys.executable, "train_multiprocess.py", model, "mnist", "-m", str(epochs), "-l", lr, "-w", "2",
            "-d", option, *_spars(option)]
    _assert_learned(_run(work, model, argv), epochs)
