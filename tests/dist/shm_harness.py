"""Runs a function on P processes and collects each rank's result or exception, under a hard deadline.

Used by the shm communicator tests (tests/dist/test_shm_core.py); usable by any multi-process test:

    results = run_ranks(worker, P, *args)   # worker(rank, P, name, *args) -> picklable value
    values = ok_values(results)             # {rank: value}; fails the test naming any rank that raised

`name` is a fresh shared-memory segment name with this process's PREFIX, so `leftovers()` can tell
whether a test left a segment behind.
"""
from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import queue
import time

SHM_DIR = "/dev/shm"
PREFIX = f"sl_shmtest_{os.getpid()}_"
_names = itertools.count()


def new_name() -> str:
    return f"/{PREFIX}{next(_names)}"


def leftovers() -> list[str]:
    """Segments in /dev/shm created under this process's PREFIX (by it or by its workers)."""
    return sorted(f for f in os.listdir(SHM_DIR) if f.startswith(PREFIX))


def _entry(fn, rank, P, name, args, q):
    try:
        q.put((rank, "ok", fn(rank, P, name, *args)))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
        q.put((rank, "exc", (type(e).__name__, str(e))))


def run_ranks(fn, P, *args, ranks=None, ctx="spawn", timeout=60.0, silent=(), name=None):
    """Runs fn(rank, P, name, *args) on one process per rank in `ranks` (default all P) with the
    multiprocessing context `ctx`; returns {rank: (kind, value)}, kind "ok" or "exc" (value = (exception
    type name, message)). Ranks in `silent` are expected to die without reporting: they are neither waited
    for nor reaped until the others have reported (so a dead one stays a zombie meanwhile). Whatever is
    still running after `timeout` seconds is killed and the test fails."""
    name = name or new_name()
    context = mp.get_context(ctx)
    q = context.Queue()
    ranks = list(range(P)) if ranks is None else list(ranks)
    procs = {r: context.Process(target=_entry, args=(fn, r, P, name, args, q), daemon=True) for r in ranks}
    for p in procs.values():
        p.start()
    want = [r for r in ranks if r not in silent]
    results = {}
    deadline = time.monotonic() + timeout
    try:
        while any(r not in results for r in want):
            left = deadline - time.monotonic()
            missing = [r for r in want if r not in results]
            assert left > 0, f"ranks {missing} did not report within {timeout} s"
            try:
                r, kind, value = q.get(timeout=min(left, 0.5))
                results[r] = (kind, value)
            except queue.Empty:
                gone = [r for r in missing if procs[r].exitcode is not None]
                if gone:  # give the queue a moment: a rank may have reported just before exiting
                    try:
                        while True:
                            r, kind, value = q.get(timeout=1.0)
                            results[r] = (kind, value)
                    except queue.Empty:
                        pass
                    gone = [r for r in gone if r not in results]
                    assert not gone, f"ranks {gone} exited ({[procs[r].exitcode for r in gone]}) without reporting"
    finally:
        for p in procs.values():
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        q.close()
    return results


def ok_values(results):
    """{rank: value}, after checking that no rank raised."""
    for r, (kind, value) in sorted(results.items()):
        assert kind == "ok", f"rank {r} raised {value[0]}: {value[1]}"
    return {r: v for r, (_, v) in results.items()}
