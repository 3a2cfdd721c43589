"""The mpi backend's default must never hand back a silently wrong result when the ranks' calls differ:
every mismatch of kind, op, dtype or count raises ValueError on every rank, naming what each rank called
(before, small calls were checked only with verify=True: rank 0's all_reduce of ten float32 against rank 1's
barrier returned -1.6e29 and exited 0; float32 against float64 returned 2.875)."""
import re
import subprocess
import sys

import pytest

from test_dist_mpi import mpiexec

from paths import job

JOB = job("mpi_mismatch_job.py")
RANK0 = "rank 0 called all_reduce of 10 float32 elements, op sum"
RANK1 = {
    "barrier": "rank 1 called barrier",
    "broadcast": "rank 1 called broadcast of 10 float32 elements, root 0",
    "dtype": "rank 1 called all_reduce of 10 float64 elements, op sum",
    "op": "rank 1 called all_reduce of 10 float32 elements, op max",
    "count": "rank 1 called all_reduce of 11 float32 elements, op sum",
}


def run(case, *extra):
    proc = subprocess.run([mpiexec(), "-n", "2", sys.executable, JOB, case, *extra], capture_output=True,
                          text=True, timeout=120)
    return proc, proc.stdout + proc.stderr


@pytest.mark.parametrize("case", sorted(RANK1))
def test_every_mismatch_raises_on_every_rank_naming_both_calls(case):
    proc, out = run(case)
    # (mpiexec may join two ranks' lines into one: each message is found by its own end)
    raised = dict(re.findall(r"RAISED (\d) (mpi .*? in the same order)", out))
    for r in ("0", "1"):
        assert r in raised, f"rank {r} did not raise\n{out}"
        assert RANK0 in raised[r] and RANK1[case] in raised[r], raised[r]
    assert "RESULT" not in out, out
    if case in ("dtype", "op", "count"):  # the data collectives paired up: the communicator goes on
        assert proc.returncode == 0, out
        assert "AFTER 0 [2.0, 2.0, 2.0]" in out and "AFTER 1 [2.0, 2.0, 2.0]" in out, out
    else:  # different kinds may never pair up in MPI: the communicator is broken, the job aborted at exit
        assert proc.returncode != 0, out


def test_matching_calls_pass_and_the_unchecked_path_remains():
    proc, out = run("same")
    assert proc.returncode == 0, out
    expected = str([2.0 * i for i in range(10)])
    assert f"RESULT 0 {expected}" in out and f"RESULT 1 {expected}" in out, out
    proc, out = run("dtype", "unchecked")  # verify=False: what the default used to do for small calls
    assert "RAISED" not in out, out


def test_a_fused_all_reduce_that_overflows_gives_inf_and_nan_without_warnings():
    # A small all_reduce is reduced by numpy inside the check (see mpi.py, FUSE_BYTES): numpy warned where MPI
    # silently gives inf / nan; under -W error the warning was an exception.
    proc = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-W", "error::RuntimeWarning", JOB, "overflow"],
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "RESULT 0 [inf, nan, 2.0]" in out and "RESULT 1 [inf, nan, 2.0]" in out, out
