"""Failure drills (issue 8): 3 ranks train with DistOpt and rank 1 fails in the middle of a training step --
SIGKILLed, or raising in user code, inside its backward pass while the others' buckets are being exchanged --
under each launcher: singa-run, mpiexec and SINGA's multiprocessing pattern. Every job must end within
10 s, non-zero, with a message naming rank 1, the user's traceback shown once, and no process (rank or
watcher) and no shared-memory segment (ours or MPICH's) left behind. A NaN gradient on one rank must skip the
step on every rank, or raise on every rank, in every DistOpt mode: never on some ranks only.

Each drill is tests/multiproc/jobs/drill_job.py in a fresh job, under a hard time limit."""
import ast
import glob
import os
import re
import subprocess
import sys
import time

import pytest

from singa_lite import _core

from paths import job
from procs import processes_running, survivors

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = job("drill_job.py")
LIMIT_S = 10.0  # the bound for the surviving ranks; the whole job, start-up included, must fit in it
# Variables of an enclosing launcher must not leak into the drills.
CLEAN = {k: v for k, v in os.environ.items()
         if k not in ("SINGA_LITE_HOLDER", "SINGA_LITE_COMM_BACKEND", "SINGA_LITE_COMM_TIMEOUT", "RANK",
                      "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "PMI_RANK", "PMI_SIZE")}

pytestmark = pytest.mark.skipif(not hasattr(_core, "ShmComm"), reason="this build has no shm backend")


def mpiexec():
    pytest.importorskip("mpi4py", reason="the mpiexec drills need mpi4py and an MPI library: pip install "
                                         "'singa_lite[mpi]'")
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(here):
        pytest.skip("no mpiexec next to this interpreter: pip install 'singa_lite[mpi]' (the MPICH wheel)")
    return here


def command(launcher, failure, mode):
    if launcher == "singa-run":
        return [sys.executable, "-m", "singa_lite.run", "-np", "3", "--no-prefix", JOB, launcher, failure, mode]
    if launcher == "mpi":
        return [mpiexec(), "-n", "3", sys.executable, JOB, launcher, failure, mode]
    return [sys.executable, JOB, launcher, failure, mode, "3"]


def watchers(ranks) -> list:
    """The mpiexec watchers (comm/watch.py) of this job: their command line names the ranks' pids (`<rank>=<pid>`),
    so another job's watcher on this machine is not mistaken for one left behind."""
    mine = []
    for pid in processes_running(b"singa_lite/comm/watch.py"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        if any(w.endswith(b"=%d" % r) for w in words for r in ranks):
            mine.append(pid)
    return mine


def drill(launcher, failure, mode="plain"):
    """Runs one drill; returns (exit code, combined output, seconds). Checks that nothing is left behind."""
    start = time.monotonic()
    with subprocess.Popen(command(launcher, failure, mode), cwd=HERE, env=CLEAN, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    elapsed, proc_pid = time.monotonic() - start, proc.pid
    out = stdout + stderr
    pids = [int(p) for p in re.findall(r"^pid (\d+)$", out, re.M)]
    assert len(pids) == 3, out
    assert not survivors(pids, also=lambda: watchers(pids)), f"rank or watcher processes left behind\n{out}"
    # The segments the ranks mapped (MPICH's, the shm backend's) and the holder's, named after its creator
    # (the multiprocessing parent, singa-run): not what other jobs on this machine may have at the moment.
    segments = set(re.findall(r"^shm (/dev/shm/\S+)$", out, re.M))
    assert segments or launcher != "mpi", out
    left = [s for s in segments if os.path.exists(s)] + glob.glob(f"/dev/shm/singa_lite_{proc_pid}_*")
    assert not left, f"shared-memory segments left behind: {left}\n{out}"
    return proc.returncode, out, elapsed


# What names the failed rank, per launcher: the shm backend's CommError on the survivors, singa-run's
# summary, and under mpiexec the watcher (SIGKILL) or the uncaught-exception hook (raise).
NAMED = {
    ("multiprocessing", "sigkill"): r"rank 1 \(pid \d+\) died",
    ("multiprocessing", "raise"): r"rank 1 \(pid \d+\) died",
    ("singa-run", "sigkill"): r"singa-run: rank 1 failed: killed by SIGKILL",
    ("singa-run", "raise"): r"singa-run: rank 1 failed: exit code 1",
    ("mpi", "sigkill"): r"singa_lite: rank 1 \(pid \d+ on .+\) ended first, without finishing",
    ("mpi", "raise"): r"singa_lite: rank 1 of 3 ended with an uncaught RuntimeError \(above\): aborting",
}


@pytest.mark.parametrize("launcher", ["multiprocessing", "singa-run", "mpi"])
@pytest.mark.parametrize("failure", ["sigkill", "raise"])
def test_a_rank_failing_mid_step_ends_the_job_fast_and_is_named(launcher, failure):
    code, out, elapsed = drill(launcher, failure)
    assert code != 0, out
    assert elapsed < LIMIT_S, (elapsed, out)
    assert re.search(NAMED[launcher, failure], out), out
    assert "finished" not in out, out
    if failure == "raise":
        assert out.count("RuntimeError: bug in user code at step 3") == 1, out  # the traceback, once
        assert out.count("Traceback") == (3 if launcher == "multiprocessing" else 1), out
    if launcher == "multiprocessing":  # SINGA's pattern: every rank's own exit code is non-zero
        codes = ast.literal_eval(re.search(r"exit codes (\[.*\])", out).group(1))
        assert all(c != 0 for c in codes), out


def test_mpiexec_watcher_names_the_dead_rank_when_it_wakes_late():
    # On a busy host the watcher may run only after mpiexec ended every rank: the progress board tells.
    code, out, elapsed = drill("mpi", "sigkill-late")
    assert code != 0 and elapsed < LIMIT_S, (elapsed, out)
    assert re.search(r"singa_lite: rank 1 \(pid \d+ on .+\) ended first, without finishing .*; the others had "
                     r"entered collective #(\d+), it stopped after #(\d+)", out), out


def test_watcher_first_of():
    from singa_lite.comm.watch import first_of

    order = {0: 0, 1: 1, 2: 2}
    assert first_of([2], None, order) == (2, "")
    assert first_of([0, 1, 2], [5, 4, 5], order)[0] == 1
    assert first_of([0, 1, 2], [5, 5, 5], order) == (None, "their progress was the same")
    assert first_of([0, 1, 2], [5, 4, 4], order) == (None, "their progress was the same")
    assert first_of([0, 1], None, order) == (None, "no progress board")
    assert first_of([0, 1], [7, 7, 9], order) == (None, "their progress was the same")  # rank 2 ran on


@pytest.mark.parametrize("launcher", ["multiprocessing", "singa-run", "mpi"])
@pytest.mark.parametrize("mode", ["plain", "half", "partial", "topk", "threshold"])
def test_a_nan_gradient_on_one_rank_skips_the_step_on_every_rank(launcher, mode):
    code, out, _ = drill(launcher, "nan", mode)
    assert code == 0, out
    for r in range(3):
        assert f"rank {r}: step 3 skipped=True unchanged=True" in out, out
        assert f"rank {r}: finished 8 steps" in out, out
    who = "the averaged gradients" if mode in ("plain", "half") else "the gradients of rank 1"
    assert out.count(f"RuntimeWarning: DistOpt: inf or nan in {who}: step skipped on every rank") == 1, out


@pytest.mark.parametrize("launcher", ["multiprocessing", "singa-run", "mpi"])
@pytest.mark.parametrize("mode", ["plain", "topk"])
def test_on_nonfinite_raise_raises_on_every_rank(launcher, mode):
    code, out, elapsed = drill(launcher, "nan-raise", mode)
    assert code != 0 and elapsed < LIMIT_S, (elapsed, out)
    who = "the averaged gradients" if mode == "plain" else "the gradients of rank 1"
    message = f"FloatingPointError: DistOpt: {who} contain inf or nan; no parameter was changed on any rank"
    # singa-run and mpiexec stop the others once the first rank failed: that one printed it, and those that
    # raised before the stop came. With multiprocessing every rank raises and prints it.
    n = out.count(message)
    assert n == 3 if launcher == "multiprocessing" else 1 <= n <= 3, out
    assert "finished" not in out and "CommError" not in out, out


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_the_finiteness_test_is_exact(dtype):
    # The step's check: nan or inf anywhere is found; finite values whose sum would overflow are not flagged.
    import numpy as np

    from singa_lite import tensor
    from singa_lite.parallel.reducer import all_finite as _all_finite

    for n in (1, 7, 1000, 100003):
        x = np.random.default_rng(n).standard_normal(n).astype(dtype)
        assert _all_finite(tensor.from_numpy(x).data)
        for bad in (np.nan, np.inf, -np.inf):
            for pos in {0, n // 2, n - 1}:
                y = x.copy()
                y[pos] = bad
                assert not _all_finite(tensor.from_numpy(y).data), (n, bad, pos)
    assert _all_finite(tensor.from_numpy(np.full(1000, np.finfo(dtype).max, dtype)).data)
    assert _all_finite(tensor.from_numpy(np.zeros(0, dtype)).data)
