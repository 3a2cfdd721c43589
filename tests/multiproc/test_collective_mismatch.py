"""Issue 30: one typed error for a mismatched collective. The same mismatched call (another shape, dtype, op,
root or collective on the last rank) raises dist.CollectiveMismatch, a ValueError, on every rank of every CPU
backend: shm (its C++ check, translated by the bindings), tcp and mpi (their Python checks); and
fusion.is_mismatch recognises it by type, not by the backend's words."""
import json
import re
import subprocess
import sys

import pytest

from dist_cases import run_ranks
from group_cases import mismatch_cases
from paths import job

CASES = ["shape", "dtype", "op", "root", "big", "kind"]
MPI_CASES = CASES[:-1]  # a different kind of collective leaves MPI's communicator broken (test_hardening_mpi)


def check(out: dict, world_size: int, cases) -> None:
    for r in range(world_size):
        got = out[r]
        for case in cases:
            assert got[case] is not None, f"rank {r}: the mismatched {case} call raised nothing"
            name, is_value_error, recognised, typed, message = got[case]
            assert (name, is_value_error, recognised, typed) == ("CollectiveMismatch", True, True, True), \
                f"rank {r}, case {case}: {got[case]}"
            if case != "kind":
                total = world_size * (world_size + 1) // 2
                assert got[case + "/after"] == [total] * 3, f"rank {r}: out of step after {case}: {got}"


@pytest.mark.parametrize("world_size", [2, 3])
def test_shm_raises_collective_mismatch(world_size):
    out, _, _ = run_ranks(mismatch_cases, world_size, args=(CASES,), timeout=120)
    assert sorted(out) == list(range(world_size)), out
    assert all(v[0] == "ok" for v in out.values()), out
    check({r: v[1] for r, v in out.items()}, world_size, CASES)


def test_tcp_raises_collective_mismatch():
    from test_tcp_backend import run_tcp

    out, _ = run_tcp(mismatch_cases, 3, args=(CASES,), timeout=120)
    assert all(v[0] == "ok" for v in out.values()), out
    check({r: v[1] for r, v in out.items()}, 3, CASES)


def run_mpi(n: int, scenario: str, *args, timeout: float = 180.0):
    pytest.importorskip("mpi4py")
    from test_dist_mpi import mpiexec

    proc = subprocess.run([mpiexec(), "-n", str(n), sys.executable, job("group_job.py"), scenario,
                           json.dumps(list(args))], capture_output=True, text=True, timeout=timeout)
    text = proc.stdout + proc.stderr
    # (mpiexec may join two ranks' lines into one: each result is decoded from its own start)
    found = {int(m.group(1)): json.JSONDecoder().raw_decode(text, m.end())[0]
             for m in re.finditer(r"RESULT (\d+) ", text)}
    return proc, found, text


def test_mpi_raises_collective_mismatch():
    proc, found, text = run_mpi(3, "mismatch_cases", MPI_CASES)
    assert sorted(found) == [0, 1, 2], text
    check(found, 3, MPI_CASES)
    assert proc.returncode == 0, text
