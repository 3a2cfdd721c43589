"""The mpi backend's setup and teardown must not hang either: a rank that never comes to dist.init() (stuck in its
own code before MPI starts, or after) or never closes makes the others raise CommError within about the timeout,
naming the step and, where MPI can tell, the rank; mpiexec then ends non-zero with nothing left running. Before,
rank 0 waited forever in MPI_Init, in the communicator's Dup and in MPI_Win_free at exit."""
import os
import re
import subprocess
import sys
import time

import pytest

from test_dist_mpi import mpiexec

from paths import job
from procs import survivors

JOB = job("mpi_startup_job.py")
TIMEOUT = 3  # SINGA_LITE_COMM_TIMEOUT for the job
SLACK = 12  # start-up of the interpreters, the board's query, the abort's grace, a loaded 2-core machine


def run(scenario: str, n: int = 2, limit: float = 60):
    start = time.monotonic()
    proc = subprocess.run([mpiexec(), "-n", str(n), sys.executable, JOB, scenario], capture_output=True, text=True,
                          timeout=limit, env={**os.environ, "SINGA_LITE_COMM_TIMEOUT": str(TIMEOUT)})
    out = proc.stdout + proc.stderr
    pids = [int(p) for p in re.findall(r"PID \d+ (\d+)", out)]
    assert len(pids) == n, out
    return proc, out, time.monotonic() - start, pids


def raised(out: str) -> dict:
    # (mpiexec may join two ranks' lines: each message ends at its last sentence)
    return dict(re.findall(r"RAISED (\d+) (.*?SINGA_LITE_COMM_TIMEOUT\))", out))


def ended(proc, out, elapsed, pids, within):
    assert proc.returncode != 0, out
    assert elapsed < within, (elapsed, out)
    assert not survivors(pids, seconds=10), f"ranks left running\n{out}"


@pytest.mark.parametrize("caught", [False, True])
def test_a_rank_that_never_starts_mpi_fails_the_others_in_mpi_init(caught):
    # caught: the script catches the CommError and ends normally; the rank still exits 1 (else mpiexec, which ends
    # the stuck rank, reported the job as successful: exit status 0)
    proc, out, elapsed, pids = run("never_starts_mpi" + "_caught" * caught)
    said = raised(out)
    assert "0" in said and "1" not in said, out
    assert said["0"].startswith(f"mpi start-up (MPI_Init) on rank 0 of 2: not finished after {TIMEOUT} s"), said
    assert "INIT" not in out, out
    ended(proc, out, elapsed, pids, TIMEOUT + SLACK)


@pytest.mark.parametrize("n, caught", [(2, False), (3, False), (2, True)])
def test_a_rank_that_never_calls_init_is_named_by_the_others(n, caught):
    proc, out, elapsed, pids = run("never_inits" + "_caught" * caught, n)
    said = raised(out)
    others = [str(r) for r in range(n) if r != 1]
    assert sorted(said) == others, out
    for r in others:
        assert said[r].startswith(f"mpi communicator setup (every rank's arrival) on rank {r} of {n}: not finished "
                                  f"after {TIMEOUT} s"), said[r]
        if n == 2:
            assert "rank 1 never arrived" in said[r], said[r]
        else:  # an all-gather a rank never joined may also miss the ranks behind it: named as a set
            assert re.search(r"not heard from ranks [0-9, ]*1", said[r]), said[r]
    assert "aborting the MPI job after a failed communicator setup" in out, out
    ended(proc, out, elapsed, pids, TIMEOUT + SLACK)


def test_a_rank_stuck_in_another_collective_before_init_is_named():
    # MPI's blocking collectives never pair with nonblocking ones (the setup's): rank 1's barrier cannot complete
    # against rank 0's arrival all-gather, and rank 0 names rank 1 as never arrived
    proc, out, elapsed, pids = run("in_other_collective")
    said = raised(out)
    assert list(said) == ["0"] and "rank 1 never arrived" in said["0"], out
    ended(proc, out, elapsed, pids, TIMEOUT + SLACK)


def test_exit_does_not_wait_forever_for_a_rank_that_never_closes():
    proc, out, elapsed, pids = run("never_closes")
    assert "END 0" in out and "END 1" not in out, out
    assert re.search(r"rank 0: aborting the MPI job after: mpi close \(rank 0 of 2\).*rank 1 had not closed it",
                     out), out
    ended(proc, out, elapsed, pids, TIMEOUT + 5 + SLACK)  # 5: CLOSE_GRACE_S


def test_close_raises_naming_the_rank_that_never_closes():
    proc, out, elapsed, pids = run("close_raises")
    said = raised(out)
    assert list(said) == ["0"], out
    assert said["0"].startswith("mpi close (rank 0 of 2): every rank must close the communicator"), said
    assert "rank 1 had not closed it" in said["0"], said
    ended(proc, out, elapsed, pids, TIMEOUT + 5 + SLACK)


def test_split_raises_when_a_rank_never_comes():
    proc, out, elapsed, pids = run("split_never_comes")
    said = raised(out)
    assert list(said) == ["0"], out
    assert said["0"].startswith("mpi split: its rendezvous failed: mpi barrier") and \
        "ranks that had not entered it: 1" in said["0"], said
    ended(proc, out, elapsed, pids, TIMEOUT + SLACK)


def test_normal_init_and_close_still_end_cleanly():
    proc, out, elapsed, pids = run("normal", 3)
    assert proc.returncode == 0, out
    assert all(f"CLOSED {r}" in out and f"END {r}" in out for r in range(3)), out
    assert "RAISED" not in out and "abort" not in out.lower(), out
    assert not survivors(pids, seconds=10), out
