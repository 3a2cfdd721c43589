"""Convergence of examples/mnist_dist.py (SINGA's distributed-training script) on the offline digits, 2 ranks, each dist
option, with the multiprocessing launcher (shm backend) and once under mpiexec (mpi backend)."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="the offline dataset comes with scikit-learn")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "mnist_dist.py")


def run(args, launcher=None, python=True, script=SCRIPT):
    cmd = (launcher or []) + ([sys.executable] if python else []) + [script, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    found = re.search(r"final test accuracy ([0-9.]+)", out)
    assert found, out
    return float(found.group(1)), out


# Issue 5 asks >= 97% for plain and half, and partial / sparse within 1 point of plain. On 360 test digits
# one run's accuracy moves by about a point with the seed (sd 0.7-1.0 over seeds 0-9), so the goal is judged on
# means over seeds (docs/benchmarks/distopt.md, "Convergence"): plain 98.17, half 98.11, partial (three
# partitions) 98.03, top-K 5% 98.11, threshold 98.03. Here each option runs seeds 0-2: their mean must clear the
# floor, and no run may fall more than 3 points under it. (One seed alone was too fragile: any change in the
# last bits of a GEMM re-rolls the trajectory, and seed 0 of the threshold option then ended its 10th epoch at
# 95.6 % after 98.6 % in the 9th, while the mean over seeds 0-9 stayed at 97.8.)
@pytest.mark.parametrize("option,extra,floor", [
    ("plain", [], 0.97), ("half", [], 0.97), ("partialUpdate", ["--threshold", "20000"], 0.965),
    ("sparseTopK", [], 0.965), ("sparseThreshold", ["--spars", "0.002"], 0.97)])
def test_two_ranks_converge_with_every_dist_option(option, extra, floor):
    accs, outs = [], []
    for seed in (0, 1, 2):
        acc, out = run(["--world-size", "2", "--dist-option", option, "--epochs", "10", "--seed", str(seed), *extra])
        assert "2 ranks (shm backend" in out
        accs.append(acc)
        outs.append(out)
    report = f"{option}: test accuracy {accs} over seeds 0-2\n" + "\n".join(outs)
    assert np.mean(accs) >= floor, report
    assert min(accs) >= floor - 0.03, report


def test_mpi_launcher():
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        pytest.skip("no mpiexec next to this Python: pip install 'singa_lite[mpi]'")
    acc, out = run(["--launcher", "mpi", "--epochs", "10"], launcher=[mpiexec, "-n", "2"])
    assert acc >= 0.97 and "2 ranks (mpi backend" in out, out


def test_help():
    proc = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--dist-option" in proc.stdout and "sparseTopK" in proc.stdout


def test_singa_run_launcher():
    acc, out = run(["--launcher", "singa-run", "--epochs", "3"],
                   launcher=[sys.executable, "-m", "singa_lite.run", "-np", "2", "--no-prefix"], python=False)
    assert acc >= 0.9 and "2 ranks (shm backend" in out, out


def epoch_lines(out: str) -> list:
    """The epoch metrics rank 0 printed, without the timings."""
    return [line.split("  (")[0] for line in out.splitlines() if line.startswith("epoch ")]


@pytest.mark.parametrize("script,option", [("mnist", "plain"), ("mnist", "sparseThreshold"),
                                           ("resnet", "plain")])  # resnet: batch-norm statistics too
def test_checkpoint_resumes_the_example_exactly(tmp_path, script, option):
    extra = ["--world-size", "2", "--dist-option", option, "--spars", "0.002"]
    path = SCRIPT if script == "mnist" else os.path.join(ROOT, "examples", "resnet_cifar10.py")
    _, whole = run([*extra, "--epochs", "3"], script=path)
    ckpt = str(tmp_path / "ckpt")
    _, first = run([*extra, "--epochs", "1", "--checkpoint", ckpt], script=path)
    _, rest = run([*extra, "--epochs", "3", "--checkpoint", ckpt], script=path)
    assert "resumed from" in rest and "after epoch 1" in rest, rest
    assert epoch_lines(first) + epoch_lines(rest) == epoch_lines(whole), (first, rest, whole)
    assert re.search(r"final test accuracy .*", rest).group() == re.search(r"final test accuracy .*", whole).group()


def test_checkpoint_resumes_on_another_number_of_ranks_by_itself(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    run(["--world-size", "2", "--epochs", "1", "--checkpoint", ckpt])
    acc, out = run(["--world-size", "3", "--epochs", "2", "--checkpoint", ckpt])
    assert "resumed from" in out and "after epoch 1" in out and "resharded from 2 to 3 rank(s)" in out, out
    assert "3 ranks" in out, out
    assert [line.split()[1] for line in epoch_lines(out)] == ["2"] and acc > 0.5, out


RESNET = os.path.join(ROOT, "examples", "resnet_cifar10.py")


@pytest.mark.parametrize("option", ["plain", "half"])
def test_resnet_example_learns_the_generated_classes(option):
    proc = subprocess.run([sys.executable, RESNET, "--world-size", "2", "--epochs", "3", "--dist-option", option],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    acc = float(re.search(r"final test accuracy ([0-9.]+)", out).group(1))
    assert acc >= 0.6 and "generated CIFAR-shaped data" in out, out


def test_resnet_example_reads_cifar_batches(tmp_path):
    # a tiny CIFAR-10 in the binary format (label byte + 3072 pixel bytes per image): the reader path runs
    rng = np.random.default_rng(0)
    for name, n in [(f"data_batch_{i}.bin", 40) for i in range(1, 6)] + [("test_batch.bin", 40)]:
        rows = np.concatenate([rng.integers(0, 10, (n, 1)), rng.integers(0, 256, (n, 3072))], 1).astype(np.uint8)
        (tmp_path / name).write_bytes(rows.tobytes())
    proc = subprocess.run([sys.executable, RESNET, "--world-size", "2", "--epochs", "1", "--batch-size", "8",
                           "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0 and "CIFAR-10" in proc.stdout, proc.stdout + proc.stderr
