"""The examples run as jobs: small sizes, real code paths."""
import runpy
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name, *argv):
    """Runs an example as its script would run; the argv and sys.path it changes (examples put their folder on
    sys.path) are restored afterwards."""
    old_argv, old_path = sys.argv, sys.path[:]
    sys.argv = [name, *argv]
    try:
        runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    except SystemExit as e:
        return e.code
    finally:
        sys.argv = old_argv
        sys.path[:] = old_path
    return 0


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_linear_regression_recovers_weights(dtype, capsys):
    code = run_example("linear_regression.py", "--samples", "2000", "--features", "16", "--steps", "80",
                       "--dtype", dtype)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "max |w - w_true|" in out


def test_linear_regression_rejects_bad_arguments():
    assert run_example("linear_regression.py", "--steps", "0") not in (0, None)


@pytest.mark.parametrize("model", ["cnn", "mlp"])
def test_train_cnn_synthetic_smoke(model, capsys):
    code = run_example("train_cnn.py", "--synthetic", "--model", model, "--epochs", "1", "--max-steps", "6",
                       "--no-progress")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "epoch   1" in out and "final test accuracy" in out


def test_train_cnn_learns_the_bundled_digits(capsys):
    pytest.importorskip("sklearn")
    code = run_example("train_cnn.py", "--model", "mlp", "--epochs", "5", "--no-progress")
    out = capsys.readouterr().out
    assert code == 0, out
    acc = float(out.strip().splitlines()[-1].split()[-1])
    assert acc >= 0.95, out


def test_train_cnn_reads_mnist_idx_files(tmp_path, capsys):
    import gzip

    import numpy as np

    rng = np.random.default_rng(0)
    for split, n in (("train", 128), ("t10k", 64)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        header = (2051).to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in (n, 28, 28))
        with gzip.open(tmp_path / f"{split}-images-idx3-ubyte.gz", "wb") as f:
            f.write(header + images.tobytes())
        (tmp_path / f"{split}-labels-idx1-ubyte").write_bytes((2049).to_bytes(4, "big") + n.to_bytes(4, "big")
                                                              + labels.tobytes())
    code = run_example("train_cnn.py", "--data-dir", str(tmp_path), "--epochs", "1", "--no-progress")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "128 train / 64 test" in out


def test_multi_device_refuses_nccl_for_cpu_replicas(capsys):
    # decided before any data is loaded: the message names the failed condition
    code = run_example("multi_device.py", "--device", "cpu", "--allreduce", "nccl")
    assert isinstance(code, str) and "--allreduce nccl" in code and "CUDA device" in code, code
