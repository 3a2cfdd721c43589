"""DistOpt.backward_and_partial_update on 2 ranks under mpiexec (tests/multiproc/jobs/partial_job.py): a model within
one partition is averaged whole at every call (equal to the fused gradient average to rounding, as SINGA's
examples show: the same losses for partialUpdate as for plain), and several partitions are averaged one per
call, round robin, numbered as SINGA numbers them."""
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("mpi4py", reason="needs mpi4py and an MPI library: pip install 'singa_lite[mpi]'")

from paths import job  # noqa: E402

JOB = job("partial_job.py")


def test_partial_update_partitions():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = here if os.path.exists(here) else shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec on PATH: pip install 'singa_lite[mpi]'")
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, JOB], capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "OK rank 0" in out and "OK rank 1" in out, out
