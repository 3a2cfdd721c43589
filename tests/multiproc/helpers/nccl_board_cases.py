"""Ranks of a nccl communicator on a stand-in for _core.NcclComm (no GPU, no NCCL), for the host board's tests
(tests/multiproc/test_nccl_board.py). Collectives complete at once on each rank's own data; the one numbered
`stuck_at` on a "stuck" rank never finishes: after `hang_s` its wait raises the watchdog's timeout error, as
the C++ side does, and the communicator is failed from then on."""
from __future__ import annotations

import hashlib
import os
import time

import numpy as np

from singa_lite import _core, tensor
from singa_lite.comm import nccl


class StandInWork:
    def __init__(self, comm, what, stuck):
        self.comm, self.what, self.stuck = comm, what, stuck

    def completed(self):
        return not self.stuck

    def order(self):
        if self.comm.error:
            raise _core.CommError(self.comm.error)

    def synchronize(self, timeout, abort_on_timeout):
        # the GPU runs a communicator's operations in order: any wait behind the stuck one times out with it
        blocker = self.comm.stuck_work
        if self.comm.error:
            raise _core.CommError(self.comm.error)
        if blocker is not None:
            time.sleep(self.comm.hang_s)
            # the text of csrc/comm/nccl.cpp's timeout_failure
            self.comm.error = (f"nccl {blocker.what} (rank {self.comm.rank} of {self.comm.world_size}, cuda:0): not "
                               f"finished after {self.comm.hang_s} s. A rank died, has not called it, or called a "
                               f"different operation (NCCL cannot tell which rank: look at the other ranks' "
                               f"output), or the timeout is too short for this job (timeout= or "
                               f"SINGA_LITE_COMM_TIMEOUT). The communicator is aborted and every later call on it "
                               f"raises this error; create a new one (dist.init) or restart the job.")
            raise _core.CommError(self.comm.error)


class StandInComm:
    stuck_at = 0  # the collective (1, 2, ...) that never finishes on this process; 0: none
    hang_s = 0.5

    def __init__(self, unique_id, rank, world_size, device, timeout):
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.error, self.closed, self.count = "", False, 0
        self.stuck_work = None

    def _work(self, what):
        if self.error:
            raise _core.CommError(self.error)
        self.count += 1
        work = StandInWork(self, what, self.count == self.stuck_at)
        if work.stuck:
            self.stuck_work = work
        return work

    def all_reduce(self, t, op): return self._work("all_reduce")
    def broadcast(self, t, root): return self._work("broadcast")
    def all_gather(self, out, t): return self._work("all_gather")
    def abort(self, reason): self.error = f"aborted: {reason}"
    def close(self): self.closed = True


class StandInGpu:
    core = _core.Device("cpu")
    index = 0

    def __str__(self):
        return "cuda:0 (stand-in)"


class Direct(nccl.NcclCommunicator):
    """CPU tensors taken as if on the GPU (no staging copies)."""

    def _staged(self, *tensors, written):
        import contextlib

        return contextlib.nullcontext(list(tensors))


def install(stuck_at=0, hang_s=0.5):
    """Puts the stand-in in place of NCCL in this process."""
    StandInComm.stuck_at, StandInComm.hang_s = stuck_at, hang_s
    nccl._core.NcclComm = StandInComm
    nccl._require_ready = lambda: None
    nccl.choose_device = lambda device, local_rank, local_size: StandInGpu()


def unique_id(name: str) -> bytes:
    return hashlib.sha512(name.encode()).digest() * 2


def _wait_for(path, seconds=30.0):
    end = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)


def hang_worker(rank, P, name, mode, flag_dir):
    """Rank 0 makes three all_reduces and waits on the third (which never finishes on it); rank 1 makes two,
    then, by `mode`: waits ("late"), closes its communicator ("closed"), exits at once ("dead"), or calls a
    broadcast as its third ("other_kind"); with "inside" it makes the third all_reduce too. Rank 0 returns the
    error's text and the line of its call; rank 1 returns what it did."""
    install(stuck_at=3 if rank == 0 else 0)
    c = Direct(unique_id(name), rank, P, timeout=30)
    end = time.monotonic() + 30
    while c._board.joined() < P and time.monotonic() < end:  # NCCL's init is a rendezvous; the stand-in's is not
        time.sleep(0.01)
    ready, finished = os.path.join(flag_dir, "ready"), os.path.join(flag_dir, "finished")
    t = tensor.from_numpy(np.ones(4, np.float32))
    if rank == 0:
        c.all_reduce(t)
        c.all_reduce(t)
        _wait_for(ready)  # rank 1 is where the mode puts it
        work = c.all_reduce(t, async_op=True); line = _line()  # noqa: E702 -- the call's line, for the test
        try:
            work.wait(timeout=5)
            return ("no error", line)
        except _core.CommError as e:
            return (str(e), line)
        finally:
            open(finished, "w").close()
    c.all_reduce(t)
    c.all_reduce(t)
    if mode == "other_kind":
        c.broadcast(t, 0)
    elif mode == "inside":
        c.all_reduce(t)
    elif mode == "closed":
        c.close()
    elif mode == "dead":
        open(ready, "w").close()
        os._exit(0)
    open(ready, "w").close()
    _wait_for(finished)
    return mode


def _line() -> int:
    import sys

    return sys._getframe(1).f_lineno
