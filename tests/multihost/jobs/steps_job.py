"""Run by tests/multihost/test_host_failures.py under mpiexec across simulated hosts: every rank trains
tests/multiproc's small DistOpt model (helpers/distopt_cases.py) step after step until the test cuts a host's
link or kills a host's ranks. The communicator's timeout is SINGA_LITE_COMM_TIMEOUT. Each rank prints, in
single writes: ``pid <pid> host <hostname>``, ``shm <path>`` for each shared-memory segment it maps (as
tests/multiproc/jobs/drill_job.py, whose helper it reuses), ``rank <r> started`` after its first step, and
``rank <r> finished`` if it ever runs out of steps (it must not, before the test's fault)."""
import os
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "multiproc", "jobs"))

from drill_job import mapped_segments  # noqa: E402  (also puts tests/multiproc/helpers on sys.path)

MAX_S = 60.0  # a rank that sees no fault trains at most this long


def main():
    from singa_lite import autograd, dist, opt

    import distopt_cases as cases

    os.write(1, f"pid {os.getpid()} host {socket.gethostname()}\n".encode())
    comm = dist.init()
    r, n = comm.rank, comm.world_size
    os.write(1, "".join(f"shm {name}\n" for name in mapped_segments()).encode())
    params = cases.make_params(0)
    sgd = opt.DistOpt(opt.SGD(lr=0.01, momentum=0.9), communicator=comm, first_bucket=64)
    autograd.training = True
    end = time.monotonic() + MAX_S
    step = 0
    while time.monotonic() < end:
        x, y = cases.data(step % 50)
        per = cases.N // n
        sgd.backward_and_update(cases.loss_of(params, x[r * per:(r + 1) * per], y[r * per:(r + 1) * per]))
        if step == 0:
            os.write(1, f"rank {r} started\n".encode())
        step += 1
        time.sleep(0.01)  # a step every ~10 ms: the fault lands mid-step or between steps, both are fine
    os.write(1, f"rank {r} finished {step} steps\n".encode())
    comm.close()


if __name__ == "__main__":
    main()
