"""The examples' multiprocessing launch with GPU ranks (examples/dist_training.py). A rank forked from a parent that
has initialised CUDA fails in its first CUDA call ("initialization error"); the launcher therefore decides without
initialising CUDA and starts GPU ranks with spawn. These run the real examples in child processes, as
tools/gpu_check.sh's examples step does, with the parent's CUDA initialised on purpose. Marked `gpu`."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from singa_lite.comm import nccl

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# The parent initialises CUDA (a real query, then a tensor on the GPU) before it launches the ranks.
PARENT = """
import sys
sys.path.insert(0, {examples!r})
from singa_lite import device, tensor
assert device.cuda_is_available()
tensor.Tensor((4,), device.create_cuda_gpu_on(0)).set_value(1.0)
import {script}
sys.exit({script}.main({argv!r}))
"""


def launch(script, *argv):
    code = PARENT.format(examples=str(EXAMPLES), script=script, argv=list(argv))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.fixture(autouse=True)
def needs_nccl():
    problem = nccl.readiness()
    if problem:
        pytest.skip(problem)


def test_gpu_ranks_start_after_the_parent_used_cuda():
    p = launch("mnist_dist", "--device", "cuda", "--world-size", "1", "--epochs", "1")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "nccl backend" in p.stdout and "final test accuracy" in p.stdout


def test_forking_them_instead_fails_as_the_launcher_expects():
    # the premise of the spawn start method: a forked GPU rank of this parent cannot use CUDA
    p = launch("mnist_dist", "--device", "cuda", "--world-size", "1", "--epochs", "1", "--start-method", "fork")
    assert p.returncode != 0, "a forked rank used CUDA initialised in its parent: spawn would not be needed"
    assert "initialization error" in (p.stdout + p.stderr).lower() or "failed" in p.stderr


def test_every_gpu_gets_a_rank():
    from singa_lite import device
    n = min(device.get_num_gpus(), 4)
    p = launch("resnet_cifar10", "--device", "cuda", "--world-size", str(n), "--epochs", "1", "--batch-size", "64")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert f"{n} ranks (nccl backend" in p.stdout
