"""DistOpt(zero_stage=1|2) under ``mpiexec -n N`` (tests/multiproc/test_zero.py): stages 1 and 2 equal stage 0
(SGD with momentum and Adam, the half wire, clipping, accumulation) on the mpi backend; the 16-bit wires at
stage 2 within 1e-3 (zero_cases.scenario_features says why). Prints ``OK rank r``."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers"))

import zero_cases  # noqa: E402
from singa_lite import dist  # noqa: E402


def main() -> None:
    comm = dist.init(backend="mpi", timeout=60)
    done = zero_cases.scenario_equivalence(comm, ("sgd", "adam")) + zero_cases.scenario_features(comm, half_tol=1e-3)
    assert len(done) == 16, done
    print(f"rank {comm.rank} zero scenarios: {', '.join(done)}", flush=True)
    print(f"OK rank {comm.rank}", flush=True)


if __name__ == "__main__":
    main()
