"""Scenarios of issue 30 shared by the shm, tcp and mpi tests (tests/multiproc/test_collective_mismatch.py,
tests/multiproc/test_groups.py) and by the mpiexec job that runs them (jobs/group_job.py). Each takes a
Communicator and returns JSON data; the tests compare it across ranks."""
from __future__ import annotations

import numpy as np

from singa_lite import dist, tensor
from singa_lite.parallel import fusion


def T(a) -> tensor.Tensor:
    return tensor.from_numpy(np.ascontiguousarray(a))


# ---------------------------------------------------------------------------------------- CollectiveMismatch
# The same mismatched call on every backend: the last rank passes something else. "kind" (another collective)
# leaves the mpi communicator broken (its data collectives need not pair up), so it comes last and only where
# the communicator goes on.
MISMATCHES = {
    "shape": lambda c, odd: c.all_reduce(T(np.ones(10 + odd, np.float32))),
    "dtype": lambda c, odd: c.all_reduce(T(np.ones(10, np.float64 if odd else np.float32))),
    "op": lambda c, odd: c.all_reduce(T(np.ones(10, np.float32)), "max" if odd else "sum"),
    "root": lambda c, odd: c.broadcast(T(np.ones(10, np.float32)), 1 if odd else 0),
    "big": lambda c, odd: c.all_reduce(T(np.ones(300_000 + odd, np.float32))),  # past every fused path
    "kind": lambda c, odd: c.barrier() if odd else c.all_reduce(T(np.ones(10, np.float32))),
}


def mismatch_cases(comm, cases):
    """For each case: (type name, is a ValueError, fusion.is_mismatch, dist.CollectiveMismatch) of what the
    mismatched call raised (None when nothing was), then a matched all_reduce that proves the ranks are in step
    again."""
    out = {}
    odd = int(comm.rank == comm.world_size - 1)
    for case in cases:
        try:
            MISMATCHES[case](comm, odd)
            out[case] = None
        except Exception as e:  # noqa: BLE001 - reported to the test, which names the type it wants
            out[case] = [type(e).__name__, isinstance(e, ValueError), fusion.is_mismatch(e),
                         isinstance(e, dist.CollectiveMismatch), str(e)[:300]]
        if case != "kind":
            x = T(np.full(3, comm.rank + 1, np.int64))
            comm.all_reduce(x)
            out[case + "/after"] = tensor.to_numpy(x).tolist()
    return out
