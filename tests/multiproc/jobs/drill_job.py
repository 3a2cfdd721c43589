"""A failure drill, run by tests/multiproc/test_failure_drills.py: ranks train a small model with DistOpt and, at
step FAIL_STEP, one rank fails in the middle of its backward pass (a gradient hook fires while the other
ranks' buckets are already being exchanged):

    python drill_job.py <launcher> <failure> [mode] [world_size]

launcher: ``mpi`` (started by mpiexec), ``singa-run`` (started by singa-run) or ``multiprocessing`` (this
script starts the ranks itself, sharing an NcclIdHolder, SINGA's pattern; it then exits with the first
non-zero exit code of its ranks). failure: ``sigkill`` (the rank SIGKILLs itself), ``raise`` (a RuntimeError
from user code), ``sigkill-late`` (the same as sigkill, the mpiexec watcher stalled meanwhile as on a busy
host), ``nan`` (the rank's gradient turns NaN: DistOpt must skip that step on every rank),
``nan-raise`` (the same with on_nonfinite="raise": every rank raises FloatingPointError, none hangs).
mode: the DistOpt step, ``plain`` (default), ``half``, ``partial``, ``topk`` or ``threshold`` (sparse).
Every rank prints ``pid <pid>`` and ``shm <path>`` (the segments it maps) first, so the test can check that no
process and no segment is left behind."""
import os
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers"))

FAILING_RANK = 1
FAIL_STEP = 3
STEPS = 8
TIMEOUT_S = 60.0  # the communicator's; a dead rank must be noticed long before it
STEP = {"plain": ("backward_and_update", {}), "half": ("backward_and_update_half", {}),
        "partial": ("backward_and_partial_update", {"threshold": 64}),
        "topk": ("backward_and_sparse_update", {"spars": 0.2, "topK": True}),
        "threshold": ("backward_and_sparse_update", {"spars": 0.01, "topK": False})}


def snapshot(params, sgd):
    """Every number a skipped step must leave alone: parameters, optimizer state, residuals, counters."""
    from singa_lite import tensor

    flat = {k: tensor.to_numpy(v).copy() for k, v in params.items()}
    states = sgd.get_states()
    flat.update({f"opt {slot} {k}": np.array(v) for slot, d in states["opt"].items() if isinstance(d, dict)
                 for k, v in d.items()})
    flat.update({f"residual {k}": np.array(v) for k, v in states["residuals"].items()})
    flat["partial"] = np.array(states["partial"])
    return flat


def mapped_segments() -> set:
    """The shared-memory segments this process maps (names already unlinked included): those of its job,
    which must all be gone when the job ended, whatever else runs on the machine."""
    with open("/proc/self/maps") as f:
        return {line.split(None, 5)[5].split(" (deleted)")[0].strip() for line in f
                if len(line.split(None, 5)) == 6 and line.split(None, 5)[5].startswith("/dev/shm/")}


def stall_the_watcher(seconds: float) -> None:
    """Stops this host's mpiexec watcher (singa_lite/comm/watch.py) and has a detached shell resume it later,
    as a busy host would leave it unscheduled: it then finds every rank ended at once."""
    import subprocess

    from procs import processes_running

    for pid in processes_running(b"singa_lite/comm/watch.py"):
        os.kill(pid, signal.SIGSTOP)
        subprocess.Popen(["sh", "-c", f"sleep {seconds}; kill -CONT {pid}"], start_new_session=True)


def train(rank_hint, world_size, launcher, failure, mode, holder=None):
    from singa_lite import autograd, dist, opt

    import distopt_cases as cases

    sys.stdout.flush()
    os.write(1, f"pid {os.getpid()}\n".encode())  # one write: ranks sharing the parent's stdout cannot interleave
    if launcher == "multiprocessing":
        comm = dist.init(backend="shm", holder=holder, rank=rank_hint, world_size=world_size, timeout=TIMEOUT_S)
    else:
        comm = dist.init(timeout=TIMEOUT_S)
    r, n = comm.rank, comm.world_size
    os.write(1, "".join(f"shm {name}\n" for name in mapped_segments()).encode())
    params = cases.make_params(0)
    sgd = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm,
                      on_nonfinite="raise" if failure == "nan-raise" else "skip", first_bucket=64)
    step = [0]

    def fail(grad):  # W1's gradient is final late in backward: W2's and b2's buckets are on their way
        if step[0] != FAIL_STEP or r != FAILING_RANK:
            return None
        if failure == "sigkill-late":  # the mpiexec watcher runs only after mpiexec ended every rank
            stall_the_watcher(seconds=1.0)
        if failure.startswith("sigkill"):
            # Slow, then dead: the others are by now waiting for it in the step's last all-reduce, as they
            # would be after any death in the middle of a step (without the pause they may still be computing
            # when mpiexec ends them, and then no one, the watcher included, can tell who died first).
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGKILL)
        if failure == "raise":
            raise RuntimeError(f"bug in user code at step {FAIL_STEP}")
        return grad * float("nan")  # nan, nan-raise

    params["W1"].register_hook(fail)
    autograd.training = True
    before = None
    for step[0] in range(STEPS):
        x, y = cases.data(step[0])
        per = cases.N // n
        loss = cases.loss_of(params, x[r * per:(r + 1) * per], y[r * per:(r + 1) * per])
        if step[0] == FAIL_STEP:
            before = snapshot(params, sgd)
        method, kw = STEP[mode]
        getattr(sgd, method)(loss, **kw)
        if step[0] == FAIL_STEP:  # reached only when the step was skipped (nan): nothing may have changed
            after = snapshot(params, sgd)
            same = before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
            os.write(1, f"rank {r}: step {FAIL_STEP} skipped={sgd.skipped_steps == 1} unchanged={same}\n".encode())
    os.write(1, f"rank {r}: finished {STEPS} steps\n".encode())
    comm.close()


def main(launcher, failure, mode="plain", world_size=3):
    if launcher != "multiprocessing":
        train(None, None, launcher, failure, mode)
        return 0
    import multiprocessing

    from singa_lite import dist

    holder = dist.NcclIdHolder()
    procs = [multiprocessing.Process(target=train, args=(r, world_size, launcher, failure, mode, holder))
             for r in range(world_size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    codes = [p.exitcode for p in procs]
    print(f"exit codes {codes}", flush=True)
    return next((abs(c) + (128 if c < 0 else 0) for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4], *map(int, sys.argv[4:])))
