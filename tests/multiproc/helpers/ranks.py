"""The process-group mechanics behind every multi-process test: one process per rank, each reporting its
result or exception through one queue, collected under a hard deadline; whatever is still running at the end is
killed, so a test fails instead of hanging.

The two test-facing harnesses are thin wrappers over `run_group`:
- shm_harness.run_ranks: raw C++ ShmComm tests, fn(rank, P, name, *args); a missing rank fails the test.
- dist_cases.run_ranks: fn(comm, *args) after dist.init with a shared NcclIdHolder; a missing rank is a
  result the test judges (a killed or timed-out rank is what some scenarios expect).
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import queue
import time

POLL = 0.2  # seconds between checks on the processes while nothing arrives
DRAIN = 1.0  # how long a report sent just before a rank exited may take to come out of the queue


@dataclasses.dataclass
class Group:
    results: dict  # {rank: (kind, value)}: ("ok", return value) or ("exc", (exception type name, message))
    exitcodes: dict  # {rank: exit code after the group was reaped}; negative: killed by that signal
    seconds: float  # from the start of the first process to the last report (or the deadline)


def _entry(target, rank, args, reports, reraise):
    try:
        reports.put((rank, "ok", target(rank, *args)))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
        reports.put((rank, "exc", (type(e).__name__, str(e))))
        if reraise:  # the traceback on the rank's stderr, and exit code 1
            raise


def _drain(reports, results, wait):
    try:
        while True:
            rank, kind, value = reports.get(timeout=wait)
            results[rank] = (kind, value)
    except queue.Empty:
        pass


def run_group(target, ranks, args=(), *, ctx="spawn", timeout=60.0, silent=(), strict=True, exit_grace=5.0,
              reraise=False) -> Group:
    """Runs target(rank, *args) on one process per rank in `ranks`, started with the multiprocessing context
    `ctx`, and collects what each returns or raises until every rank not in `silent` has reported.

    Ranks in `silent` are expected to die without reporting: they are not waited for, only reaped at the end
    (so a dead one stays a zombie until then). With `strict`, a rank that exits without reporting or has not
    reported within `timeout` seconds fails the test (AssertionError naming the ranks and their exit codes);
    without it the collection just stops there and the test judges the partial results. At the end each process
    gets `exit_grace` seconds to exit (None: until the deadline) before it is killed."""
    context = mp.get_context(ctx)
    reports = context.Queue()
    ranks = list(ranks)
    procs = {r: context.Process(target=_entry, args=(target, r, args, reports, reraise), daemon=True)
             for r in ranks}
    start = time.monotonic()
    deadline = start + timeout
    for p in procs.values():
        p.start()
    results, dead = {}, set()  # dead: exited without a report

    def pending():
        return [r for r in ranks if r not in silent and r not in results]

    try:
        while pending():
            left = deadline - time.monotonic()
            if left <= 0:
                if strict:
                    raise AssertionError(f"ranks {pending()} did not report within {timeout} s "
                                         f"({_states(procs, pending())})")
                break
            try:
                rank, kind, value = reports.get(timeout=min(left, POLL))
                results[rank] = (kind, value)
                continue
            except queue.Empty:
                pass
            gone = [r for r in pending() if r not in dead and procs[r].exitcode is not None]
            if gone:  # give the queue a moment: a rank may have reported just before exiting
                _drain(reports, results, DRAIN)
                gone = [r for r in gone if r not in results]
                dead.update(gone)
                if gone and strict:
                    raise AssertionError(f"ranks {gone} exited without reporting ({_states(procs, gone)})")
            if all(r in dead for r in pending()):
                break
        seconds = time.monotonic() - start
    finally:
        for p in procs.values():
            p.join(max(0.0, deadline - time.monotonic()) if exit_grace is None else exit_grace)
            if p.is_alive():
                p.kill()
                p.join()
        reports.close()
    return Group(results, {r: p.exitcode for r, p in procs.items()}, seconds)


def _states(procs, ranks):
    codes = {r: procs[r].exitcode for r in ranks}
    return ", ".join(f"rank {r}: " + ("still running" if c is None else f"exit code {c}") for r, c in codes.items())
