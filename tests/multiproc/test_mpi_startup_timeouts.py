"""The mpi backend's setup and teardown must not hang either: a rank that never comes to dist.init() (stuck in its
own code before MPI starts, or after), to a step of the setup, to close() or to its end makes the others raise
CommError within about the timeout, naming the step and the rank; mpiexec then ends non-zero with nothing left
running. Before, rank 0 waited forever in MPI_Init (also when the script imported mpi4py.MPI itself), in the
communicator's Dup, MPI_Comm_split_type and MPI_Win_allocate, in MPI_Win_free at close and in MPI_Finalize at exit,
and so did the nccl backend's MPI bootstrap (its split, its all-gather and the unique id's broadcast)."""
import os
import re
import subprocess
import sys
import time

import pytest

from test_dist_mpi import mpiexec

from paths import job
from procs import describe_tree, survivors

JOB = job("mpi_startup_job.py")
TIMEOUT = 3  # SINGA_LITE_COMM_TIMEOUT for the job
SLACK = 12  # start-up of the interpreters, the board's query, the abort's grace, a loaded 2-core machine


def run(scenario: str, n: int = 2, limit: float = 60):
    start = time.monotonic()
    env = {**os.environ, "SINGA_LITE_COMM_TIMEOUT": str(TIMEOUT)}
    proc = subprocess.Popen([mpiexec(), "-n", str(n), sys.executable, JOB, scenario], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        stdout, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:  # what every process of the job was doing, for the report, then the end
        tree = describe_tree(proc.pid)
        proc.kill()
        stdout, stderr = proc.communicate()
        pytest.fail(f"mpiexec did not end within {limit} s; its processes then:\n{tree}\n{stdout}{stderr}")
    out = stdout + stderr
    pids = [int(p) for p in re.findall(r"PID \d+ (\d+)", out)]
    assert len(pids) == n, out
    return proc, out, time.monotonic() - start, pids


def pid_of(out: str, rank: int) -> int:
    return int(re.search(rf"PID {rank} (\d+)", out).group(1))


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
    assert f"rank 1 (pid {pid_of(out, 1)}) on this host has not started MPI" in said["0"], said  # seen through /proc
    assert "INIT" not in out, out
    ended(proc, out, elapsed, pids, TIMEOUT + SLACK)


def test_mpi_init_at_the_scripts_own_import_of_mpi4py_is_bounded_too():
    # mpi4py starts MPI when imported: a script that imports it itself (after singa_lite's comm package, which
    # dist.init needs anyway) started MPI outside any timeout and waited forever for rank 1
    proc, out, elapsed, pids = run("imports_mpi_itself")
    said = raised(out)
    assert list(said) == ["0"], out
    assert said["0"].startswith(f"mpi start-up (MPI_Init) on rank 0 of 2: not finished after {TIMEOUT} s"), said
    assert f"rank 1 (pid {pid_of(out, 1)}) on this host has not started MPI" in said["0"], said
    assert "IMPORTED" not in out, out
    ended(proc, out, elapsed, pids, TIMEOUT + SLACK)


@pytest.mark.parametrize("step, name", [("split_type", "the split into hosts, MPI_Comm_split_type"),
                                        ("window", "the arrival board's creation, MPI_Win_allocate")],
                         ids=["split_type", "window"])
def test_a_rank_that_never_comes_to_a_blocking_setup_step_is_named(step, name):
    # MPI has no nonblocking split or window creation: rank 0 waited in them forever for a rank stuck before
    proc, out, elapsed, pids = run(f"stall_{step}")
    said = raised(out)
    assert list(said) == ["0"], out
    assert said["0"].startswith(f"mpi communicator setup ({name}) on rank 0 of 2: not finished after {TIMEOUT} s; "
                                f"rank 1 never arrived"), said
    assert "aborting the MPI job after a failed communicator setup" in out, out
    ended(proc, out, elapsed, pids, TIMEOUT + SLACK)


def test_a_rank_stuck_inside_a_blocking_setup_step_fails_everyone_in_time():
    # rank 1 arrives, then never returns from MPI_Win_allocate's turn: the call runs on a helper thread, bounded
    proc, out, elapsed, pids = run("stall_window_inside")
    said = raised(out)
    assert sorted(said) == ["0", "1"], out
    for r in ("0", "1"):
        assert said[r].startswith(f"mpi communicator setup (the arrival board's creation, MPI_Win_allocate) on rank "
                                  f"{r} of 2: not finished after {TIMEOUT} s; every rank had arrived at it, so one of "
                                  f"them is stuck in it"), said
    ended(proc, out, elapsed, pids, TIMEOUT + SLACK)


def test_a_rank_that_never_comes_to_free_the_window_at_close_is_named():
    proc, out, elapsed, pids = run("stall_win_free")
    said = raised(out)
    assert list(said) == ["0"], out
    assert said["0"].startswith(f"mpi close (MPI_Win_free) on rank 0 of 2: not finished after {TIMEOUT} s; rank 1 "
                                f"never arrived (it had closed the communicator"), said
    ended(proc, out, elapsed, pids, 2 * TIMEOUT + SLACK)


def test_mpi_finalize_at_exit_does_not_wait_forever_for_a_rank_that_never_ends():
    # rank 1 closed its communicator, then stays in its own code: MPI_Finalize, at rank 0's exit, waited for it
    proc, out, elapsed, pids = run("closes_then_stalls")
    assert "CLOSED 0" in out and "CLOSED 1" in out, out
    assert re.search(r"rank 0: aborting the MPI job at exit: mpi exit \(every rank's end, before MPI_Finalize\) on "
                     rf"rank 0 of 2: not finished after {TIMEOUT} s; rank 1 never arrived", out), out
    ended(proc, out, elapsed, pids, TIMEOUT + SLACK)


@pytest.mark.parametrize("scenario, late", [("nccl_late", "rank 1 never arrived"),
                                            ("nccl_id_never_made", "rank 0, the root, never sent it")],
                         ids=["nccl_late", "nccl_id_never_made"])
def test_the_nccl_bootstrap_over_mpi_names_a_rank_that_never_comes(scenario, late):
    proc, out, elapsed, pids = run(scenario)
    said = raised(out)
    waiting = "1" if scenario == "nccl_id_never_made" else "0"
    assert list(said) == [waiting], out
    step = ("mpi nccl init: rank 0's unique id (its length)" if scenario == "nccl_id_never_made" else
            "mpi communicator setup (the split into hosts, MPI_Comm_split_type)")
    assert said[waiting].startswith(f"{step} on rank {waiting} of 2: not finished after {TIMEOUT} s; {late}"), said
    ended(proc, out, elapsed, pids, TIMEOUT + SLACK)


def test_the_nccl_bootstrap_over_mpi_hands_rank_0s_id_to_every_rank():
    proc, out, elapsed, pids = run("nccl_normal", 3)
    assert proc.returncode == 0, out
    ids = dict(re.findall(r"ID (\d) ([0-9a-f]+) LOCAL", out))
    assert sorted(ids) == ["0", "1", "2"] and len(set(ids.values())) == 1 and len(ids["0"]) == 256, out
    assert sorted(re.findall(r"LOCAL (\d) (\d)", out)) == [("0", "3"), ("1", "3"), ("2", "3")], out
    assert "RAISED" not in out and "abort" not in out.lower(), out
    assert not survivors(pids, seconds=10), out


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
