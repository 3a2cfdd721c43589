"""Runs a function on P processes and collects each rank's result or exception, under a hard deadline.

Used by the shm communicator tests (tests/multiproc/test_shm_core.py); usable by any multi-process test:

    results = run_ranks(worker, P, *args)   # worker(rank, P, name, *args) -> picklable value
    values = ok_values(results)             # {rank: value}; fails the test naming any rank that raised

`name` is a fresh shared-memory segment name with this process's PREFIX, so `leftovers()` can tell
whether a test left a segment (or a rendezvous socket still listening) behind.
"""
from __future__ import annotations

import itertools
import os
import time

from ranks import run_group
from singa_lite import _core

SHM_DIR = "/dev/shm"
PREFIX = f"sl_shmtest_{os.getpid()}_"
_names = itertools.count()
_LISTENING = 0x10000  # __SO_ACCEPTCON in /proc/net/unix's Flags column


def new_name() -> str:
    return f"/{PREFIX}{next(_names)}"


def listening_addresses() -> set[str]:
    """The abstract addresses that a process of this network namespace listens at, as /proc/net/unix shows
    them ('@' for the leading NUL)."""
    found = set()
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            fields = line.split()
            if len(fields) >= 8 and int(fields[3], 16) & _LISTENING and fields[7].startswith("@"):
                found.add(fields[7])
    return found


def address_text(name: str) -> str:
    return "@" + _core.shm_rendezvous_address(name)[1:].decode()


def rendezvous_listening(name: str) -> bool:
    """Whether a creator serves `name` over the memfd transport right now."""
    return address_text(name) in listening_addresses()


def wait_for_rendezvous(name: str, seconds: float = 10.0) -> None:
    """Until a rank has created segment `name` and others can join: under memfd its creator listens at the
    rendezvous address, under named the segment is in /dev/shm (sized: created, if not yet initialised)."""
    path = os.path.join(SHM_DIR, name[1:])
    deadline = time.monotonic() + seconds
    while not (rendezvous_listening(name) if _core.shm_transport() == "memfd"
               else os.path.exists(path) and os.stat(path).st_size > 0):
        assert time.monotonic() < deadline, f"no rank created segment {name} within {seconds} s"
        time.sleep(0.001)


def memfd_links(pid, name: str) -> list[str]:
    """/proc/<pid>/fd entries of process `pid` that hold the memfd of segment `name` open."""
    label = f"/memfd:sl_shm{name} (deleted)"
    out = []
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            if os.readlink(os.path.join(fd_dir, fd)) == label:
                out.append(os.path.join(fd_dir, fd))
        except OSError:  # closed meanwhile
            pass
    return out


def leftovers() -> list[str]:
    """Segments in /dev/shm created under this process's PREFIX (by it or by its workers), and rendezvous
    sockets of that PREFIX that a process still listens at (a creator must close its socket once every rank
    joined, or when the rendezvous failed)."""
    listening = [a for a in listening_addresses() if a.startswith(f"@sl_shm/{PREFIX}")]
    return sorted(f for f in os.listdir(SHM_DIR) if f.startswith(PREFIX)) + sorted(listening)


def _call(rank, fn, P, name, args):
    return fn(rank, P, name, *args)


def run_ranks(fn, P, *args, ranks=None, ctx="spawn", timeout=60.0, silent=(), name=None):
    """Runs fn(rank, P, name, *args) on one process per rank in `ranks` (default all P) with the
    multiprocessing context `ctx`; returns {rank: (kind, value)}, kind "ok" or "exc" (value = (exception
    type name, message)). Ranks in `silent` are expected to die without reporting: they are neither waited
    for nor reaped until the others have reported (so a dead one stays a zombie meanwhile). A rank that exits
    without reporting, or whatever is still running after `timeout` seconds, fails the test (ranks.run_group)."""
    name = name or new_name()
    ranks = list(range(P)) if ranks is None else list(ranks)
    return run_group(_call, ranks, (fn, P, name, args), ctx=ctx, timeout=timeout, silent=silent).results


def ok_values(results):
    """{rank: value}, after checking that no rank raised."""
    for r, (kind, value) in sorted(results.items()):
        assert kind == "ok", f"rank {r} raised {value[0]}: {value[1]}"
    return {r: v for r, (_, v) in results.items()}
