"""The mpi backend's C++ hot path (csrc/comm/mpi_hot.h: the arrival board, the call check, the polling and the
small all_reduce in C++) under a real ``mpiexec``: it is on with the MPICH wheel, gives the same bits as the
Python path for every dtype, op and size, and keeps the timeout and the mismatch errors."""
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("mpi4py", reason="the mpi backend tests need mpi4py and an MPI library: pip install "
                                     "'singa_lite[mpi]'")

from test_dist_mpi import mpiexec  # noqa: E402

from paths import job  # noqa: E402

JOB = job("mpi_hot_job.py")


def run(n: int, *args, timeout: float = 120, hot: bool = True):
    env = {**os.environ, "SINGA_LITE_MPI_HOT_PATH": "1" if hot else "0"}
    proc = subprocess.run([mpiexec(), "-n", str(n), sys.executable, "-W", "ignore::RuntimeWarning", JOB, *args],
                          capture_output=True, text=True, timeout=timeout, env=env)
    return proc, proc.stdout + proc.stderr


@pytest.mark.parametrize("n", [2, 3])
def test_the_hot_path_gives_the_same_bits_as_the_python_path(n):
    # 3 ranks: a sum of three floats depends on its order (rank order, as numpy's reduce and the Python path)
    proc, out = run(n)
    assert proc.returncode == 0, out
    for r in range(n):
        assert f"HOT {r} True False" in out, out  # on by default with the MPICH wheel; off with the variable
        assert f"CHECKED {r} 171" in out and f"OTHER {r} ok" in out, out
        calls = re.search(rf"PROGRESS {r} (\d+) (\d+)", out)
        assert calls and calls[1] == calls[2] and int(calls[1]) > 171, out
    assert "DIFF" not in out, out


# hot=False: the Python path, which MPIs of other ABIs (Open MPI) take, keeps the same behaviour.
@pytest.mark.parametrize("hot", [True, False])
def test_an_absent_rank_is_named_within_the_timeout(hot):
    proc, out = run(3, "timeout", timeout=60, hot=hot)
    assert f"HOT 0 {hot}" in out, out
    times = dict(re.findall(r"TIMEOUT (\d) ([\d.]+) mpi all_reduce #1 .*had not entered it: 1\.", out))
    assert set(times) == {"0", "2"}, out
    assert all(2.0 <= float(s) < 6.0 for s in times.values()), times  # timeout=2 s
    assert proc.returncode != 0, out  # the stuck job is aborted at exit


@pytest.mark.parametrize("hot", [True, False])
def test_different_kinds_raise_on_both_ranks_and_break_the_communicator(hot):
    proc, out = run(2, "kinds", timeout=60, hot=hot)
    assert f"HOT 0 {hot}" in out, out
    said = "rank 0 called all_reduce of 5000 float32 elements, op sum (its call #1); rank 1 called broadcast of " \
           "5000 float32 elements, root 0 (its call #1)"
    for r in ("0", "1"):
        assert re.search(rf"RAISED {r} mpi \w+: the ranks' calls do not match: {re.escape(said)}", out), out
        assert f"BROKEN {r}" in out, out
    assert proc.returncode != 0, out


@pytest.mark.parametrize("hot", [True, False])
def test_a_mismatched_count_raises_on_both_ranks_and_the_communicator_goes_on(hot):
    proc, out = run(2, "count", timeout=60, hot=hot)
    assert f"HOT 0 {hot}" in out, out
    said = "rank 0 called all_reduce of 5000 float32 elements, op sum (its call #1); rank 1 called all_reduce of " \
           "5001 float32 elements, op sum (its call #1)"
    for r in ("0", "1"):
        assert f"RAISED {r} mpi all_reduce: the ranks' calls do not match: {said}" in out, out
        assert f"AFTER {r} [2.0, 2.0, 2.0]" in out, out
    assert proc.returncode == 0, out
