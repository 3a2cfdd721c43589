"""Which rank is slow, and where its time goes: the straggler report of DistOpt (``DistOpt.stats()``,
``singa-run --report N``; docs/straggler.md).

An all-reduce hides a slow rank by making every other rank wait for it. Two measurements, both per rank and
both cheap, find it again:

- **Each collective's duration** (comm/arrivals.py). Every rank leaves a collective at about the same moment, so
  the rank that arrived last is the one whose call took least, and each other rank waited about its own duration
  minus that least one. Only durations are compared, never clock readings, so ranks on different hosts compare
  as well as ranks on one. (The nccl backend times nothing on the host: there each *step's* time blocked in the
  exchange is compared instead, and the report says "of steps".)
- **Each step's phases** (parallel/step_stats.py), on the training thread, from the end of one step to the end of
  the next: ``data`` (singa_lite's readers and ``data.timed`` / ``data.loading``: data/timing.py), ``forward``
  (the rest of the time before backward: the forward pass, the loss, whatever the script does there),
  ``backward`` (the backward pass, gradients queued for the exchange as they come), ``update`` (the optimizer,
  gradient clipping between the phases, ZeRO's broadcast, the replica check), and ``wait``: time blocked in
  collectives (the exchange's completion, the finiteness vote, any other collective of the communicator), taken
  out of whichever phase it happened in. The phases add up to the step. The first step (which compares the
  models and broadcasts rank 0's parameters) is left out.

Nothing crosses the wire per step. A report is one ``all_gather_object`` of each rank's figures since the last
one (its phase sums, its steps' waits and its collectives' durations), on every rank, every N steps
(``report_every``) or when ``DistOpt.stats()`` is called; the gather itself is neither timed nor counted. Rank 0
prints the table of each period; a timeline that records marks each verdict across the trace and names the
straggler's process. At exit every rank leaves its totals and what was not yet compared in the folder singa-run
gave it (``SINGA_LITE_REPORT_DIR``), and singa-run prints the table of the whole job; without that folder rank 0
prints the totals of the periods compared.

The verdict: the rank the others waited for the most (summed over the collectives where it was last) is the
straggler when it caused most of all the waiting (halfway between an even share and all of it: 75 % of it with
2 ranks, 67 % with 3) and the others' time blocked in collectives exceeds its own by at least 10 % of a step. Its
"extra" time is its working time per step (the step less its wait) minus the median of the other ranks', and the
phase where it exceeds them most is where that time went. "last in" counts the collectives where a rank waited
for the last one at least 0.1 ms and a tenth of the period's longest wait (when all came within less, which one
was last is chance).

This module compares the figures (DistOpt's ranks at each report, singa-run at the end of the job); the rank's
side, the clock and the gather, is parallel/step_stats.py.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics

import numpy as np

__all__ = ["PHASES", "StragglerReport", "RankStats", "Totals", "analyze", "report", "REPORT_VAR", "REPORT_DIR_VAR",
           "report_every_from_environment", "final_report"]

PHASES = ("data", "forward", "backward", "update", "wait")
DATA, FORWARD, BACKWARD, UPDATE, WAIT = range(len(PHASES))
WORK = PHASES[:WAIT]  # where a rank's extra time can be (wait is the others' extra time)
REPORT_VAR = "SINGA_LITE_REPORT"  # every N steps (singa-run --report N)
REPORT_DIR_VAR = "SINGA_LITE_REPORT_DIR"  # where each rank leaves its figures at exit (singa-run sets it)
SIGNIFICANT = 0.1  # of a step: a rank that costs the others less is no straggler
TIE_S = 1e-4  # seconds: ranks this close arrived together
TIE_SHARE = 0.1  # of the period's longest wait in a collective: ranks this close arrived together


def report_every_from_environment() -> int | None:
    """N from SINGA_LITE_REPORT (singa-run --report N), None when unset; ValueError for anything but N >= 1."""
    value = os.environ.get(REPORT_VAR)
    if value is None or value == "":
        return None
    if not value.strip().isdigit() or int(value) < 1:
        raise ValueError(f"{REPORT_VAR} must be a whole number of steps >= 1 (singa-run --report N), got {value!r}")
    return int(value)


def check_every(every, who: str) -> int | None:
    if every is None:
        return None
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"{who}: report_every must be None or a number of steps >= 1, got {every!r}")
    return every


# ---------------------------------------------------------------- the figures of ranks, compared
@dataclasses.dataclass
class Totals:
    """What the reports compared so far, summed (per rank: lists indexed by rank). The same on every rank."""

    world_size: int
    steps: list  # steps accounted
    phases: list  # [rank][phase] seconds
    time: list  # seconds of those steps
    compared: int = 0  # collectives compared (their durations known on every rank)
    contested: int = 0  # of those, where some rank waited for another (see _compare)
    last: list = None  # collectives where the rank was last
    waited: list = None  # seconds waited for others in collectives (own duration - the least one)
    caused: list = None  # seconds the others waited for it (their mean), where it was last
    steps_compared: int = 0  # the same by steps' time blocked in collectives (backends that time nothing)
    steps_contested: int = 0
    last_steps: list = None
    waited_steps: list = None
    caused_steps: list = None

    def __post_init__(self):
        for name in ("last", "waited", "caused", "last_steps", "waited_steps", "caused_steps"):
            if getattr(self, name) is None:
                setattr(self, name, [0] * self.world_size if name.startswith("last") else [0.0] * self.world_size)

    @classmethod
    def empty(cls, world_size: int) -> "Totals":
        return cls(world_size, [0] * world_size, [[0.0] * len(PHASES) for _ in range(world_size)],
                   [0.0] * world_size)

    def merged(self, other: "Totals") -> "Totals":
        if other.world_size != self.world_size:
            raise ValueError(f"Totals: cannot add figures of {other.world_size} ranks to those of {self.world_size}")

        def add(a, b):
            return [add(x, y) for x, y in zip(a, b)] if isinstance(a, list) else a + b
        return Totals(**{f.name: (self.world_size if f.name == "world_size" else add(getattr(self, f.name),
                                                                                     getattr(other, f.name)))
                         for f in dataclasses.fields(self)})

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Totals":
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(d, dict) or set(d) != names:
            raise ValueError(f"Totals.from_json: expected the keys {sorted(names)}, got {d!r:.200}")
        return cls(**d)


def analyze(payloads: list) -> tuple:
    """(Totals of one period, the number of the last collective compared) from every rank's figures of the
    period (``StepStats.payload()`` of parallel/step_stats.py, in rank order)."""
    P = len(payloads)
    totals = Totals.empty(P)
    for r, p in enumerate(payloads):
        totals.steps[r] = int(p["steps"])
        totals.phases[r] = [float(v) for v in p["phases"]]
        totals.time[r] = float(p["time"])
    durations = [seconds(p["durations"]) for p in payloads]
    waits = [seconds(p["waits"]) for p in payloads]
    # collectives: the numbers every rank has timed (asynchronous ones may still run on some ranks)
    first = max(int(p["first"]) for p in payloads)
    upto = min(int(p["first"]) + len(d) - 1 for p, d in zip(payloads, durations))
    if upto >= first and P > 1:
        d = np.stack([d[first - int(p["first"]):upto + 1 - int(p["first"])] for p, d in zip(payloads, durations)])
        totals.contested = _compare(d, totals.last, totals.waited, totals.caused)
        totals.compared = d.shape[1]
    # steps: each one's time blocked in collectives
    n = min(len(w) for w in waits)
    if n and P > 1:
        w = np.stack([w[len(w) - n:] for w in waits])
        totals.steps_contested = _compare(w, totals.last_steps, totals.waited_steps, totals.caused_steps)
        totals.steps_compared = n
    return totals, upto


def packed(seconds_list) -> bytes:
    """Durations as the payload carries them: float32 bytes (a JSON list of floats costs far more to send)."""
    return np.asarray(seconds_list, dtype=np.float32).tobytes()


def seconds(value) -> np.ndarray:
    """packed() bytes (or a list of numbers) as float64 seconds."""
    if isinstance(value, (bytes, bytearray)):
        if len(value) % 4:
            raise ValueError(f"durations: {len(value)} bytes is no whole number of float32 values")
        return np.frombuffer(value, dtype=np.float32).astype(np.float64)
    return np.asarray(value, dtype=np.float64).reshape(-1)


def _compare(d: np.ndarray, last: list, waited: list, caused: list) -> int:
    """d: [rank, item] durations. The rank with the least duration of an item arrived last; it counts as last
    where some rank waited for it, at least TIE_S and a tenth of the longest wait of the period: when the ranks
    came at about the same time, which one was last is chance. Returns how many items had such a wait."""
    P = d.shape[0]
    least = d.min(axis=0)
    who = d.argmin(axis=0)
    spread = d.max(axis=0) - least
    had_wait = spread >= max(TIE_S, TIE_SHARE * float(spread.max()))
    others = (d.sum(axis=0) - least) / (P - 1) - least  # the others' mean wait for the last one
    for r in range(P):
        mine = who == r
        last[r] += int((mine & had_wait).sum())
        waited[r] += float((d[r] - least).sum())
        caused[r] += float(others[mine].sum())
    return int(had_wait.sum())


# ---------------------------------------------------------------- the report
@dataclasses.dataclass
class RankStats:
    """One rank's line of the report; times are milliseconds per step (means over the steps compared)."""

    rank: int
    steps: int
    step_ms: float
    phase_ms: dict  # data, forward, backward, update, wait
    waited_ms: float  # waited for others inside collectives
    caused_ms: float  # the others waited for this rank (their mean), where it was last
    last: int  # collectives (or steps) where it arrived last and another rank waited for it
    last_share: float  # of those where a rank waited (the report's ``contested``)
    extra_ms: float  # working time (step - wait) minus the median of the other ranks'
    extra_phase: str  # the phase where it exceeds the others' median most
    extra_phase_ms: float


@dataclasses.dataclass
class StragglerReport:
    """What ``DistOpt.stats()`` returns (the same on every rank); ``str()`` gives the table and the verdict."""

    world_size: int
    steps: int  # steps compared (after the first, on every rank)
    basis: str  # "collectives" or "steps": what "last" counts
    compared: int  # how many of them
    contested: int  # of those, where a rank waited for another (what last_share divides)
    ranks: list  # RankStats, in rank order
    straggler: int | None  # the rank the others wait for, or None
    summary: str  # the verdict in one sentence
    backend: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def note(self) -> str:
        """A few words on the straggler (the timeline's label of its process); '' when there is none."""
        if self.straggler is None:
            return ""
        s = self.ranks[self.straggler]
        where = f", {_PHASE_WORDS[s.extra_phase]} {s.extra_phase_ms:+.1f} ms/step" if s.extra_phase_ms > 0 else ""
        return f"straggler: last in {100 * s.last_share:.0f}% of {self.basis}{where}"

    def __str__(self) -> str:
        ranks = f"{self.world_size} rank" + ("s" if self.world_size != 1 else "")
        head = (f"straggler report: {ranks}, {self.steps} steps, {self.compared} {self.basis} "
                f"compared ({self.contested} where a rank waited)"
                + (f", {self.backend} backend" if self.backend else "") + "; ms per step")
        cols = ("rank", "step", *PHASES, "waited", "caused", "last in")
        rows = [[str(s.rank), f"{s.step_ms:.1f}", *(f"{s.phase_ms[p]:.1f}" for p in PHASES), f"{s.waited_ms:.1f}",
                 f"{s.caused_ms:.1f}", f"{100 * s.last_share:.0f}%"] for s in self.ranks]
        widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
        lines = [head, "  ".join(c.rjust(w) for c, w in zip(cols, widths))]
        lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]
        lines.append(self.summary)
        return "\n".join(lines)


_PHASE_WORDS = {"data": "data loading", "forward": "forward", "backward": "backward", "update": "the update"}


def report(totals: Totals, backend: str = "") -> StragglerReport:
    """The report of `totals` (see the module docstring for the verdict's rule)."""
    P = totals.world_size
    by_collectives = totals.compared > 0
    basis = "collectives" if by_collectives else "steps"
    compared = totals.compared if by_collectives else totals.steps_compared
    contested = totals.contested if by_collectives else totals.steps_contested
    last = totals.last if by_collectives else totals.last_steps
    waited = totals.waited if by_collectives else totals.waited_steps
    caused = totals.caused if by_collectives else totals.caused_steps

    def per_step(seconds, r):
        return 1e3 * seconds / totals.steps[r] if totals.steps[r] else 0.0
    busy = [per_step(totals.time[r] - totals.phases[r][WAIT], r) for r in range(P)]
    phase_ms = [[per_step(totals.phases[r][i], r) for i in range(len(PHASES))] for r in range(P)]
    ranks = []
    for r in range(P):
        others = [q for q in range(P) if q != r]
        extra = busy[r] - statistics.median(busy[q] for q in others) if others else 0.0
        excess = [phase_ms[r][i] - (statistics.median(phase_ms[q][i] for q in others) if others else 0.0)
                  for i in range(len(WORK))]
        worst = int(np.argmax(excess))
        ranks.append(RankStats(r, totals.steps[r], per_step(totals.time[r], r),
                               {p: phase_ms[r][i] for i, p in enumerate(PHASES)}, per_step(waited[r], r),
                               per_step(caused[r], r), int(last[r]), last[r] / contested if contested else 0.0,
                               extra, WORK[worst], excess[worst]))
    steps = min(totals.steps) if P else 0
    straggler, summary = _verdict(ranks, basis, compared, steps)
    return StragglerReport(P, steps, basis, compared, contested, ranks, straggler, summary, backend)


def share_needed(world_size: int) -> float:
    """The share of all the waiting one rank must cause to be the straggler: halfway between an even share and
    all of it (2 ranks: 75 %, 3: 67 %, 8: 56 %)."""
    return 0.5 + 0.5 / world_size


def _verdict(ranks: list, basis: str, compared: int, steps: int) -> tuple:
    if len(ranks) < 2:
        return None, "one rank: nobody to wait for"
    if not steps or not compared:
        return None, f"nothing to compare yet ({steps} steps after the first, {compared} {basis})"
    total = sum(s.caused_ms for s in ranks)
    s = max(ranks, key=lambda s: s.caused_ms)
    step = statistics.median(x.step_ms for x in ranks)
    # what it costs the others: their time blocked in collectives beyond its own (the transfer every rank pays)
    cost = statistics.median(x.phase_ms["wait"] for x in ranks if x is not s) - s.phase_ms["wait"]
    if total <= 0 or s.caused_ms < share_needed(len(ranks)) * total:
        most = f"; the most, {100 * s.caused_ms / total:.0f}%, for rank {s.rank}" if total > 0 else ""
        return None, (f"no straggler: the waiting in {basis} ({total:.2f} ms/step in all) is spread over the "
                      f"ranks{most}")
    if cost < SIGNIFICANT * step:
        return None, (f"no straggler: the others waited mostly for rank {s.rank} ({100 * s.caused_ms / total:.0f}% "
                      f"of the waiting in {basis}), but blocked only {cost:.2f} ms/step longer than it, under "
                      f"{100 * SIGNIFICANT:.0f}% of a {step:.1f} ms step")
    where = (f"mostly in {_PHASE_WORDS[s.extra_phase]} (+{s.extra_phase_ms:.1f} ms/step)" if s.extra_phase_ms > 0
             else "though no phase of its own took longer than the others' (a slower link or host?)")
    return s.rank, (f"rank {s.rank} is the straggler: last in {100 * s.last_share:.0f}% of the {basis} where a "
                    f"rank waited, the others blocked {cost:.1f} ms/step longer than it ({100 * cost / step:.0f}% of "
                    f"a step); its work took {s.extra_ms:+.1f} ms/step over the median rank, {where}")


# ---------------------------------------------------------------- the job's report, from the ranks' files
def figures_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"report.rank{rank}.json")


def write_figures(folder: str, rank: int, doc: dict) -> None:
    """Writes a rank's figures for final_report (packed durations as lists of seconds), replacing any older file
    whole."""
    def default(o):
        if isinstance(o, (bytes, bytearray)):
            return seconds(o).tolist()
        raise TypeError(f"write_figures: {type(o).__name__} is not JSON data")
    path = figures_path(folder, rank)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, default=default)
    os.replace(tmp, path)


def final_report(folder: str, world_size: int) -> tuple:
    """(StragglerReport of the whole job, '') from the files the ranks left in `folder`, or (None, why not)."""
    docs = []
    for r in range(world_size):
        try:
            with open(figures_path(folder, r)) as f:
                docs.append(json.load(f))
        except FileNotFoundError:
            return None, f"rank {r} left no figures (it did not make a DistOpt, or it did not end normally)"
        except (OSError, ValueError) as e:
            return None, f"the figures of rank {r} cannot be read ({e})"
    try:
        totals = Totals.from_json(docs[0]["totals"])
        tail, _ = analyze([d["tail"] for d in docs])
        return report(totals.merged(tail), docs[0].get("backend", "")), ""
    except (KeyError, TypeError, ValueError) as e:
        return None, f"the ranks' figures do not fit together ({e})"
