"""bfloat16 on the mpi backend, run under mpiexec by test_amp_mpi.py: every collective in bfloat16 (the small
fused all_reduce, the reduction callback, broadcast, all_gather), then amp_cases' DistOpt scenarios (bfloat16 on
the wire; an overflow on one rank skips the step on every rank). Prints "OK rank r" when all passed."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers"))

from singa_lite import tensor  # noqa: E402
from singa_lite.comm.mpi import MpiCommunicator  # noqa: E402

import amp_cases  # noqa: E402


def bf(x):
    return amp_cases.bf16_round(x)


def collectives(comm):
    r, P = comm.rank, comm.world_size
    for n in (10, 5000, 100000):  # inside the signature check's all-gather, and through the MPI reduction
        every = bf(np.random.default_rng(n).standard_normal((P, n)))
        f = every.astype(np.float32)
        wants = {"sum": f.sum(0), "avg": f.sum(0) / np.float32(P), "max": f.max(0), "min": f.min(0)}
        for op, want in wants.items():
            t = tensor.Tensor(data=every[r], dtype=tensor.bfloat16).data
            comm.all_reduce(t, op)
            got = np.asarray(t.cast(tensor.float32))
            want = bf(want)
            # The MPI reduction rounds each partial result to bfloat16 (as float16's callback does): with more
            # than two ranks it may differ from one rounding of the float32 sum by a rounding per step, each
            # at most half an ulp of the partial sums' magnitudes.
            bound = 2.0 ** (np.frexp(np.abs(want) + 1e-30)[1] - 8) + P * 2.0 ** -8 * np.abs(f).sum(0)
            assert (np.abs(got - want) <= bound).all(), (n, op, np.max(np.abs(got - want) / bound))
            if P <= 2 or op in ("max", "min"):  # one combine (or exact ops): one rounding, the same bits
                np.testing.assert_array_equal(got, want, err_msg=f"{n} {op}")
        t = tensor.Tensor(data=every[r], dtype=tensor.bfloat16).data
        comm.broadcast(t, 0)
        assert np.array_equal(np.asarray(t.cast(tensor.float32)), every[0])
        g = comm.all_gather(tensor.Tensor(data=every[r], dtype=tensor.bfloat16).data)
        assert np.array_equal(np.asarray(g.cast(tensor.float32)), every)


def main():
    comm = MpiCommunicator()
    collectives(comm)
    for name in ("half_bf16", "amp_skip"):
        assert amp_cases.run(comm, name) == "ok", name
    print(f"OK rank {comm.rank}", flush=True)


if __name__ == "__main__":
    main()
