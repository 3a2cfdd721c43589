"""This rank's side of the straggler report (comm/straggler.py says what it measures and how the ranks'
figures are compared): the clock of each step's phases, which the reducer advances at the points of a step, and
the report every N steps (one all-gather of the figures since the last one)."""
from __future__ import annotations

import atexit
import collections
import os
import sys
import time

from .. import timeline
from ..comm import arrivals
from ..comm.straggler import (BACKWARD, DATA, FORWARD, PHASES, REPORT_DIR_VAR, UPDATE, WAIT, StragglerReport, Totals,
                              analyze, packed, report, write_figures)
from ..data import timing

__all__ = ["StepStats", "DATA", "FORWARD", "BACKWARD", "UPDATE", "WAIT", "StragglerReport"]

MAX_STEPS_KEPT = 1 << 14  # per-step waits kept between two reports (the oldest are dropped beyond)
_now = time.perf_counter


class StepStats:
    """This rank's phases and collectives since the last report, and the reports so far. Made by DistOpt;
    the reducer calls :meth:`charge` and :meth:`step_over` at the points of a step (see the module docstring)."""

    def __init__(self, communicator, every: int | None = None):
        self.comm = communicator
        self.rank, self.world_size = communicator.rank, communicator.world_size
        self.backend = getattr(communicator, "backend", "")
        self.log = arrivals.attach(communicator)
        self.every = every
        self.ended = 0  # steps ended (the first too): what `every` counts
        self.cursor = None  # perf_counter() of the last charge; None until the first step ended
        self._data = self._blocked = 0.0  # the running counts at the last charge
        self._new_window()
        self.totals = Totals.empty(self.world_size)
        self.reports = 0
        if every is not None or os.environ.get(REPORT_DIR_VAR):
            atexit.register(self.at_exit)

    def _new_window(self) -> None:
        self.steps, self.time = 0, 0.0
        self.phases = [0.0] * len(PHASES)
        self.waits = collections.deque(maxlen=MAX_STEPS_KEPT)  # each step's time blocked in collectives
        self._step_wait = 0.0

    def _restart_clock(self) -> None:
        self.cursor = _now()
        self._data = timing.total
        self._blocked = self.log.blocked

    # ----- the clock
    def charge(self, phase: int) -> None:
        """The time since the last charge goes to `phase`, less what was data loading (to data) and blocked in
        collectives (to wait) meanwhile."""
        cursor = self.cursor
        if cursor is None:
            return
        now = _now()
        data_total, blocked_total = timing.total, self.log.blocked
        span = now - cursor
        data, blocked = data_total - self._data, blocked_total - self._blocked
        self._data, self._blocked, self.cursor = data_total, blocked_total, now
        rest = span - data - blocked
        if rest < 0:  # another thread's counts too: scaled down to what this thread could have spent
            scale = span / (data + blocked)
            data, blocked, rest = data * scale, blocked * scale, 0.0
        phases = self.phases
        phases[DATA] += data
        phases[WAIT] += blocked
        phases[phase] += rest
        self._step_wait += blocked + rest if phase == WAIT else blocked
        self.time += span

    def step_over(self, completed: bool = True) -> None:
        """A step ended (the rest of its time is the update's); every `every` steps, a report (completed: the
        step ended normally on this rank, as on every other)."""
        if self.cursor is None:  # the end of the first step: the clock starts
            self._restart_clock()
        else:
            self.charge(UPDATE)
            self.steps += 1
            self.waits.append(self._step_wait)
        self._step_wait = 0.0
        self.ended += 1
        if completed and self.every is not None and self.ended % self.every == 0:
            self.gather(print_table=self.rank == 0, whole_run=False)

    # ----- reports
    def payload(self) -> dict:
        """This rank's figures since the last report (JSON data)."""
        first, durations = self.log.snapshot()
        return {"steps": self.steps, "phases": list(self.phases), "time": self.time, "waits": packed(self.waits),
                "first": first, "durations": packed(durations)}

    def gather(self, print_table: bool = False, whole_run: bool = True) -> StragglerReport | None:
        """Collective: every rank's figures since the last report, compared; returns the report of the whole run
        so far (the same on every rank; None unless whole_run). print_table: print the period's report to
        stderr."""
        mine = self.payload()
        with self.log.pause():
            every = self.comm.all_gather_object(mine)
        window, upto = analyze(every)
        self.log.taken(upto)
        self._new_window()
        self.totals = self.totals.merged(window)
        self.reports += 1
        period = report(window, self.backend) if print_table or timeline.is_active() else None
        whole = report(self.totals, self.backend) if whole_run or timeline.is_active() else None
        if timeline.is_active():
            note = whole.note() if whole.straggler == self.rank else ""
            timeline.mark("straggler: " + ("none" if period.straggler is None else f"rank {period.straggler}"),
                          {"summary": period.summary, "steps": period.steps}, note=note)
        if print_table:
            print(f"singa_lite: {period}", file=sys.stderr, flush=True)
        if self.cursor is not None:
            self._restart_clock()  # the gather is nobody's step
        return whole

    def at_exit(self) -> None:
        """Leaves this rank's figures for singa-run (SINGA_LITE_REPORT_DIR), or on rank 0 prints the totals of
        the reports made; never a collective (the other ranks may be gone)."""
        folder = os.environ.get(REPORT_DIR_VAR)
        try:
            if folder:
                write_figures(folder, self.rank, {"rank": self.rank, "world_size": self.world_size,
                                                  "backend": self.backend, "totals": self.totals.to_json(),
                                                  "tail": self.payload()})
            elif self.rank == 0 and self.reports:
                whole = report(self.totals, self.backend)
                print(f"singa_lite: the whole run up to the last report:\n{whole}", file=sys.stderr, flush=True)
        except Exception as e:  # at exit nobody can catch it: say what went wrong
            print(f"singa_lite straggler report: {e}", file=sys.stderr)
