"""A parent that starts GPU ranks must not initialise CUDA first: a forked child of a process that has initialised
it fails in its first CUDA call ("initialization error"). So the examples' launcher decides without asking the
driver (device.cuda_maybe_available) and starts GPU ranks with the spawn method (examples/dist_training.py).

Without a GPU the driver is never initialised anyway, so "asked the driver" is observed one step earlier: whether
the process looked for libcuda.so.1 at all (glibc's LD_DEBUG=libs reports every library search). A check that
never loads the driver cannot initialise it. tests/gpu/test_example_launch.py runs the launch on a GPU."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from singa_lite import _core, device

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def looks_for_the_driver(code: str) -> bool:
    """Runs `code` in a fresh interpreter; True when it searched for or loaded libcuda.so.1."""
    env = {**os.environ, "LD_DEBUG": "libs", "PYTHONPATH": os.pathsep.join([str(EXAMPLES), *sys.path])}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return "libcuda.so" in p.stderr


needs_cuda_build = pytest.mark.skipif(not _core.cuda_compiled(), reason="a CPU-only build never loads libcuda")


@needs_cuda_build
def test_the_probe_sees_a_driver_query():
    # the control: the real availability query asks the driver, and the probe notices
    assert looks_for_the_driver("from singa_lite import device; device.cuda_is_available()")


def test_cuda_maybe_available_does_not_touch_the_driver():
    assert not looks_for_the_driver(
        "from singa_lite import device; device.cuda_maybe_available(); device.cuda_absent_reason()")


def test_the_examples_parent_does_not_touch_the_driver():
    # everything the parent of the multiprocessing launcher does before it starts the ranks, for both device
    # choices: parse and check the arguments (--device cuda fails here without a GPU, with the reason), pick the
    # start method, make the NCCL id holder
    code = """
import dist_training, mnist_dist
from singa_lite import singa_wrap
for dev in ("auto", "cuda", "cpu"):
    try:
        args = mnist_dist.parse_args(["--device", dev, "--world-size", "2"])
    except SystemExit:
        continue
    dist_training.start_method(args)
singa_wrap.NcclIdHolder()
"""
    assert not looks_for_the_driver(code)


def test_import_does_not_touch_the_driver():
    assert not looks_for_the_driver("import singa_lite, singa_lite.opt, singa_lite.dist")


def test_gpu_ranks_are_spawned_and_cpu_ranks_forked(monkeypatch):
    sys.path.insert(0, str(EXAMPLES))
    try:
        import dist_training
        import mnist_dist
    finally:
        sys.path.remove(str(EXAMPLES))
    monkeypatch.setattr(device, "cuda_maybe_available", lambda: True)  # as on a GPU machine
    monkeypatch.setattr(device, "cuda_absent_reason", lambda: "")
    method = {d: dist_training.start_method(mnist_dist.parse_args(["--device", d])) for d in ("cuda", "auto", "cpu")}
    assert method == {"cuda": "spawn", "auto": "spawn", "cpu": "fork"}
    monkeypatch.setattr(device, "cuda_maybe_available", lambda: False)  # no GPU: auto means the CPU
    assert dist_training.start_method(mnist_dist.parse_args(["--device", "auto"])) == "fork"
    args = mnist_dist.parse_args(["--device", "cpu", "--start-method", "spawn"])
    assert dist_training.start_method(args) == "spawn"


def test_cuda_maybe_available_agrees_with_the_reason():
    assert device.cuda_maybe_available() == (device.cuda_absent_reason() == "")
    if not _core.cuda_compiled():
        assert "without CUDA" in device.cuda_absent_reason()


def test_cuda_visible_devices_hiding_every_gpu_is_a_reason():
    if not _core.cuda_compiled():
        pytest.skip("a CPU-only build has its own reason")
    code = "from singa_lite import device; print(repr(device.cuda_absent_reason()))"
    for hidden in ("", "-1"):
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "CUDA_VISIBLE_DEVICES": hidden},
                             capture_output=True, text=True, check=True).stdout
        assert f"CUDA_VISIBLE_DEVICES='{hidden}' hides every GPU" in out


def test_spawned_ranks_train():
    # the spawn start method pickles what the ranks need (args, the NCCL id holder, the training function by
    # name): the whole job on two CPU ranks, as a GPU job is started
    p = subprocess.run([sys.executable, str(EXAMPLES / "mnist_dist.py"), "--device", "cpu", "--world-size", "2",
                        "--epochs", "1", "--batch-size", "64", "--start-method", "spawn", "--threads", "1"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "2 ranks" in p.stdout and "final test accuracy" in p.stdout
