"""Threads and fork: GNU OpenMP's thread pool does not survive fork(), and a child forked after its parent
ran a parallel region used to hang at its first one (multiprocessing "fork" ranks after the parent's GEMM).
Such a child now runs its kernels on one thread."""
import subprocess
import sys

CHILD_AFTER_PARENT_GEMM = """
import os, numpy as np
from singa_lite import _core, device
device.set_num_threads(2)
a = _core.Tensor.from_buffer(np.ones((512, 512), np.float32))
_core.matmul(a, a)                                   # the parent's pool is now in use
pid = os.fork()
if pid == 0:
    c = np.asarray(_core.matmul(a, a))               # hung here before
    s = float(np.asarray(_core.sum(_core.Tensor.from_buffer(np.ones(1 << 20, np.float32)))))
    os._exit(0 if c[0, 0] == 512 and s == 1 << 20 and _core.get_num_threads() == 1 else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), "parent threads", _core.get_num_threads())
"""


def test_a_child_forked_after_the_parent_used_threads_finishes():
    proc = subprocess.run([sys.executable, "-c", CHILD_AFTER_PARENT_GEMM], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "child 0 parent threads 2" in proc.stdout, proc.stdout + proc.stderr
