"""Runs a function on P processes and collects each rank's result or exception, under a hard deadline.

Used by the shm communicator tests (tests/multiproc/test_shm_core.py); usable by any multi-process test:

    results = run_ranks(worker, P, *args)   # worker(rank, P, name, *args) -> picklable value
    values = ok_values(results)             # {rank: value}; fails the test naming any rank that raised

`name` is a fresh shared-memory segment name with this process's PREFIX, so `leftovers()` can tell
whether a test left a segment behind.
"""
from __future__ import annotations

import itertools
import os

from ranks import run_group

SHM_DIR = "/dev/shm"
PREFIX = f"sl_shmtest_{os.getpid()}_"
_names = itertools.count()


def new_name() -> str:
    return f"/{PREFIX}{next(_names)}"


def leftovers() -> list[str]:
    """Segments in /dev/shm created under this process's PREFIX (by it or by its workers)."""
    return sorted(f for f in os.listdir(SHM_DIR) if f.startswith(PREFIX))


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
