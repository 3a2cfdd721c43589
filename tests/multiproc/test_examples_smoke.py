"""Smoke runs of examples/dist_matmul.py (both launchers, uneven sizes) and examples/multi_device.py (two
CPU replicas, one epoch), and their --help. Tiny sizes: each run takes a few seconds."""
import functools
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MATMUL = os.path.join(ROOT, "examples", "dist_matmul.py")
MULTI = os.path.join(ROOT, "examples", "multi_device.py")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def run(cmd, timeout=120):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    return proc.returncode, proc.stdout + proc.stderr


def check_matmul_output(out: str, world: int, backend: str):
    assert f"{world} ranks ({backend} backend" in out, out
    for strategy in ("partition-by-row", "partition-by-reduction"):
        found = re.search(rf"{strategy}\s+max abs error (\S+) \(bound (\S+)\).* ok$", out, re.M)
        assert found and float(found.group(1)) <= float(found.group(2)), out
    assert "both strategies match the single-process product" in out, out


# m, k, n that 2 and 3 do not all divide: both strategies pad
@pytest.mark.parametrize("world,sizes", [(2, (7, 5, 3)), (3, (10, 8, 4)), (3, (2, 1, 5))])
def test_dist_matmul_multiprocessing(world, sizes):
    m, k, n = sizes
    rc, out = run([sys.executable, MATMUL, "--world-size", str(world), "--m", str(m), "--k", str(k),
                   "--n", str(n), "--repeat", "1"])
    assert rc == 0, out
    check_matmul_output(out, world, "shm")
    assert "uneven split" in out, out


def test_dist_matmul_float64_even():
    rc, out = run([sys.executable, MATMUL, "--world-size", "2", "--m", "16", "--k", "8", "--n", "4",
                   "--dtype", "float64"])
    assert rc == 0, out
    check_matmul_output(out, 2, "shm")
    assert "float64" in out and "uneven split" not in out, out


@pytest.mark.parametrize("world", [2, 3])
def test_dist_matmul_mpi(world):
    if not os.path.exists(MPIEXEC):
        pytest.skip(f"no mpiexec next to {sys.executable}: pip install 'singa_lite[mpi]'")
    rc, out = run([MPIEXEC, "-n", str(world), sys.executable, MATMUL, "--launcher", "mpi", "--m", "11",
                   "--k", "7", "--n", "5", "--repeat", "1"])
    assert rc == 0, out
    check_matmul_output(out, world, "mpi")


@functools.lru_cache(maxsize=None)  # the two-replica run serves two tests
def run_multi_device(replicas, batch_size):
    pytest.importorskip("sklearn", reason="the offline digits come with scikit-learn")
    rc, out = run([sys.executable, MULTI, "--device", "cpu", "--replicas", str(replicas), "--epochs", "1",
                   "--batch-size", str(batch_size)], timeout=180)
    assert rc == 0, out
    assert f"{replicas} replicas on {', '.join(['cpu'] * replicas)}" in out, out
    assert "replicas identical: yes (max difference 0.0e+00)" in out, out
    assert "gradients summed by all_reduce over host" in out, out  # CPU replicas: auto takes the host route
    found = re.search(r"train loss ([0-9.]+)  train acc ([0-9.]+)  test acc ([0-9.]+)", out)
    assert found, out
    return [float(v) for v in found.groups()], out


def test_multi_device_two_cpu_replicas():
    # batch 31: the replicas get 16 and 15 examples
    (loss, train_acc, test_acc), out = run_multi_device(2, 31)
    assert test_acc >= 0.8 and "final test accuracy" in out, out


def test_multi_device_replicas_train_like_one_device():
    # the share-scaled gradients summed over the replicas are one device's gradient of the whole batch
    two, out_two = run_multi_device(2, 31)
    one, out_one = run_multi_device(1, 31)
    assert np.allclose(one, two, atol=2e-3), out_one + out_two


def test_multi_device_too_many_gpus_is_a_clear_error():
    from singa_lite import device

    rc, out = run([sys.executable, MULTI, "--device", "cuda", "--replicas", str(device.get_num_gpus() + 1),
                   "--epochs", "1"])
    assert rc != 0 and "--device cpu" in out and "Traceback" not in out, out


@pytest.mark.parametrize("script,expected", [(MATMUL, ["--launcher", "--world-size", "--m", "--dtype"]),
                                             (MULTI, ["--replicas", "--device", "--batch-size"])])
def test_help(script, expected):
    rc, out = run([sys.executable, script, "--help"], timeout=60)
    assert rc == 0 and all(opt in out for opt in expected), out


MLP_DDP = os.path.join(ROOT, "examples", "mlp_ddp.py")
TINY_MLP = ["--niters", "40", "--log-every", "20", "--check-every", "10", "--dim-in", "64", "--dim-hidden", "32",
            "--n-classes", "4", "--train-size", "600", "--batch-size", "32"]


def _mlp_final_loss(args):
    proc = subprocess.run([sys.executable, MLP_DDP, *TINY_MLP, *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "replicas identical" in out, out
    return float(re.search(r"final test loss ([0-9.]+)", out).group(1)), out


def test_mlp_ddp_modes_learn_and_agree():
    single, _ = _mlp_final_loss(["--mode", "single"])
    distopt, out_d = _mlp_final_loss(["--mode", "distopt", "--world-size", "2"])
    hooks, out_h = _mlp_final_loss(["--mode", "hooks", "--world-size", "2"])
    assert single < 0.9 * np.log(4), (single, "did not learn")
    assert "2 rank(s)" in out_d and "2 rank(s)" in out_h
    # two ranks with half batches follow one process with the whole batch, up to rounding
    assert abs(distopt - single) < 0.05 and abs(hooks - single) < 0.05, (single, distopt, hooks)


def test_mlp_ddp_help():
    proc = subprocess.run([sys.executable, MLP_DDP, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--mode" in proc.stdout and "--check-every" in proc.stdout


# Every distributed example under the two external launchers (the multiprocessing one is above and in
# test_dist_examples.py), two ranks, tiny sizes.
EXTERNAL = {
    "dist_matmul.py": ["--m", "9", "--k", "7", "--n", "5"],
    "resnet_cifar10.py": ["--epochs", "1", "--batch-size", "16"],
    "mlp_ddp.py": [*TINY_MLP, "--mode", "hooks"],
    "mnist_dist.py": ["--epochs", "1"],
}


@pytest.mark.parametrize("launcher", ["mpi", "singa-run"])
@pytest.mark.parametrize("script", sorted(EXTERNAL))
def test_examples_under_external_launchers(script, launcher):
    path = os.path.join(ROOT, "examples", script)
    if launcher == "mpi":
        if not os.path.exists(MPIEXEC):
            pytest.skip(f"no mpiexec next to {sys.executable}: pip install 'singa_lite[mpi]'")
        cmd = [MPIEXEC, "-n", "2", sys.executable, path]
    else:
        cmd = [sys.executable, "-m", "singa_lite.run", "-np", "2", path]
    proc = subprocess.run(cmd + ["--launcher", launcher, *EXTERNAL[script]], capture_output=True, text=True,
                          timeout=180, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert re.search(r"2 ranks|2 rank\(s\)|world size 2|; 2 ranks", out), out
