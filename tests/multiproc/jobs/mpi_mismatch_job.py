"""Mismatched collective calls under ``mpiexec -n 2`` with the mpi backend's defaults, for
tests/multiproc/test_hardening_mpi.py: ``python mpi_mismatch_job.py <case>``. Rank 0 calls all_reduce of ten
float32 (sum); rank 1 calls what the case says. Each rank prints ``RAISED <rank> <message>`` when its call
raised ValueError, ``RESULT <rank> <values>`` when it returned, then (for the cases whose MPI collectives
still pair up) ``AFTER <rank> <values>`` for one more, matched, all_reduce."""
import sys

import numpy as np

from singa_lite import dist, tensor

RANK1 = {  # what rank 1 calls instead of rank 0's all_reduce of ten float32 with op sum
    "barrier": lambda comm, t: comm.barrier(),
    "broadcast": lambda comm, t: comm.broadcast(t),
    "dtype": lambda comm, t: comm.all_reduce(tensor.from_numpy(np.ones(10, np.float64))),
    "op": lambda comm, t: comm.all_reduce(t, op="max"),
    "count": lambda comm, t: comm.all_reduce(tensor.from_numpy(np.ones(11, np.float32))),
    "same": lambda comm, t: comm.all_reduce(t),
}


def main(case: str, verify: str) -> None:
    comm = dist.init(backend="mpi", timeout=30, **({} if verify == "default" else {"verify": False}))
    if case == "overflow":  # matched calls whose sums overflow (3e38 + 3e38) or are inf - inf: inf and nan
        t = tensor.from_numpy(np.array([3e38, np.inf if comm.rank == 0 else -np.inf, 1.0], np.float32))
        comm.all_reduce(t)
        print(f"RESULT {comm.rank} {tensor.to_numpy(t).tolist()}", flush=True)
        return
    t = tensor.from_numpy(np.arange(10, dtype=np.float32))
    try:
        if comm.rank == 0:
            comm.all_reduce(t)
        else:
            RANK1[case](comm, t)
        print(f"RESULT {comm.rank} {tensor.to_numpy(t).tolist()}", flush=True)
    except ValueError as e:
        print(f"RAISED {comm.rank} {e}", flush=True)
    if case not in ("barrier", "broadcast"):
        after = tensor.from_numpy(np.ones(3, np.float32))
        comm.all_reduce(after)
        print(f"AFTER {comm.rank} {tensor.to_numpy(after).tolist()}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "default")
