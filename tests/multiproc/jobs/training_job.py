"""DistOpt's training-feature scenarios (training_cases.py) on the mpi backend, run by
test_training_features_mpi.py under ``mpiexec -n N``: ``python training_job.py [scenario ...]``. Prints
``OK rank r`` when every scenario held on that rank."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers"))

from singa_lite import dist  # noqa: E402


def main(names) -> None:
    import training_cases

    comm = dist.init(backend="mpi", timeout=float(os.environ.get("JOB_TIMEOUT", "60")))
    assert comm.backend == "mpi"
    if names == ["finished_early"]:  # rank 0 ends normally; the others wait for it in one more collective
        training_cases.scenario_finished_early(comm)
        return
    for name in names or [n for n in training_cases.SCENARIOS]:
        assert training_cases.run(comm, name) == "ok", name
        print(f"rank {comm.rank} {name} ok", flush=True)
    comm.barrier()
    print(f"OK rank {comm.rank}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
