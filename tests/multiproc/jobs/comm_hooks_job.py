"""The communication hooks on the mpi backend, run by tests/multiproc/test_comm_hooks_dist.py under
``mpiexec -n N``: ``python comm_hooks_job.py <scenario>`` with scenario "hooks" (helpers/comm_hook_cases.py)
or "replicas" (helpers/replica_cases.py). Prints ``OK rank r`` when every check held on that rank."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers"))

from singa_lite import dist  # noqa: E402


def main(scenario: str) -> None:
    comm = dist.init(backend="mpi", timeout=120)
    if scenario == "hooks":
        import comm_hook_cases
        done, conv = comm_hook_cases.scenario_all(comm)
        print(f"rank {comm.rank}: {done} {conv}", flush=True)
    elif scenario == "replicas":
        import replica_cases
        print(f"rank {comm.rank}: {replica_cases.scenario_all(comm)}", flush=True)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    comm.barrier()
    print(f"OK rank {comm.rank}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
