"""How long each of this rank's collectives took, for the straggler report (parallel/straggler.py).

Clocks of different hosts cannot be compared, but durations can: every rank leaves a collective at about the
same moment (no rank can finish before the last one has arrived), so the rank that arrived last is the one whose
call took least, and each other rank waited for it about its own duration minus that least one. A log only needs
this rank's own durations, in call order; the ranks compare them later (one small all-gather every N steps).

A communicator keeps no log until one is attached (``Communicator.arrivals``, None by default: one attribute
test per call). With a log, every collective called through ``Communicator._run`` (and the mpi backend's
in-line all_reduce) is timed from when it starts running (on the background thread for asynchronous work, once
the operations queued before it are done) to when it ends, and numbered in call order, which is the same on
every rank. Point-to-point send / recv are not collectives and are not logged. ``blocked`` adds up the time the
calling threads spent blocked in this communicator (calls without async_op, and ``Work.wait``).

The nccl backend queues its collectives on the GPU and times nothing here (its host-side times are enqueue
times): the report then compares steps instead (see parallel/straggler.py).
"""
from __future__ import annotations

import collections
import contextlib
import threading
import time

_now = time.perf_counter

POINT_TO_POINT = frozenset({"send", "recv"})
DEFAULT_CAPACITY = 1 << 14  # durations kept (older ones are dropped: the same ones on every rank)


class ArrivalLog:
    """Durations (seconds) of one communicator's collectives, numbered from 1 in call order.

    ``first`` is the number of the oldest duration kept; ``taken(upto)`` forgets what the caller has compared."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"ArrivalLog: capacity must be an int >= 1, got {capacity!r}")
        self.capacity = capacity
        self.durations = collections.deque(maxlen=capacity)  # the oldest go first, in constant time
        self.first = 1
        self.blocked = 0.0  # seconds the calling threads spent blocked in this communicator's operations
        self.paused = 0  # > 0: calls are neither numbered nor timed (the report's own gather)
        self._lock = threading.Lock()  # first and durations change together (the communication thread adds)

    def timed(self, fn, inline: bool):
        """fn, timed into the log when it runs. inline: it runs on the calling thread, which is blocked meanwhile."""
        def run():
            t0 = _now()
            result = fn()
            took = _now() - t0
            if inline:
                self.blocked += took
            self.add(took)
            return result
        return run

    def add(self, seconds: float) -> None:
        with self._lock:
            if len(self.durations) == self.capacity:  # every rank drops the same ones: the numbers stay aligned
                self.first += 1
            self.durations.append(seconds)

    def snapshot(self) -> tuple:
        """(number of the first duration, [durations]) of what is logged now."""
        with self._lock:
            return self.first, list(self.durations)

    def taken(self, upto: int) -> None:
        """Forgets the durations numbered up to `upto`."""
        with self._lock:
            for _ in range(min(max(upto - self.first + 1, 0), len(self.durations))):
                self.durations.popleft()
                self.first += 1

    @contextlib.contextmanager
    def pause(self):
        """Calls inside (on this thread's communicator) are not logged: a report's own gather."""
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1


def attach(comm) -> ArrivalLog:
    """The log of `comm`, attached now if it had none. Every rank attaches at the same point of its sequence of
    collectives (e.g. in a constructor every rank calls), so that the numbers agree."""
    log = comm.arrivals
    if log is None:
        comm.arrivals = log = ArrivalLog()
    return log
