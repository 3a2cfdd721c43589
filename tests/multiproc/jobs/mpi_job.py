"""One scenario of the mpi backend, run by tests/multiproc/test_dist_mpi.py under ``mpiexec -n N``:
``python mpi_job.py <scenario>``. Prints ``OK rank r`` when the scenario's expectations held on that rank."""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers"))

import numpy as np  # noqa: E402

from singa_lite import dist, tensor  # noqa: E402


def main(scenario: str) -> None:
    comm = dist.init(backend="mpi", timeout=float(os.environ.get("JOB_TIMEOUT", "60")))
    r = comm.rank
    if scenario == "collectives":
        import dist_cases
        assert comm.backend == "mpi" and comm.local_size == comm.world_size and comm.local_rank == r
        dist_cases.check_all(comm)
    elif scenario == "distopt":
        import distopt_cases
        done = distopt_cases.run_all(comm)
        print(f"rank {r} DistOpt scenarios: {', '.join(done)}", flush=True)
    elif scenario == "mismatch":  # rank 1 passes one element more: every rank raises ValueError
        for n, verify in ((10, True), (1 << 20, "auto")):  # small calls are checked with verify=True only
            comm.verify = verify
            t = tensor.from_numpy(np.zeros(n + (r == 1), np.float32))
            try:
                comm.all_reduce(t)
            except ValueError as e:
                assert f"rank 1 called all_reduce of {n + 1} float32" in str(e), e
                assert f"rank 0 called all_reduce of {n} float32" in str(e), e
                comm.all_reduce(tensor.from_numpy(np.ones(3, np.float32)))  # still usable afterwards
            else:
                raise AssertionError("no error on mismatched sizes")
    elif scenario == "timeout":  # rank 1 never arrives: the others name it
        if r == 1:
            time.sleep(60)
            return
        try:
            comm.all_reduce(tensor.from_numpy(np.ones(4, np.float32)))
        except dist.CommError as e:
            print(f"rank {r} CommError: {e}", flush=True)
            assert "had not entered it: 1" in str(e), e
            print(f"OK rank {r}", flush=True)
            return  # exiting aborts the job (the collective is stuck): mpiexec ends rank 1 too
        raise AssertionError("no timeout")
    elif scenario == "killed":  # rank 1 dies in the middle of the job
        comm.barrier()
        if r == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        comm.all_reduce(tensor.from_numpy(np.ones(4, np.float32)))
        raise AssertionError("the collective finished without rank 1")
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    comm.barrier()
    print(f"OK rank {r}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
