"""A timeline of training, per rank, as a Chrome-trace / Perfetto JSON file (open it in ui.perfetto.dev or
chrome://tracing).

    SINGA_LITE_TIMELINE=trace.json python train.py      # writes trace.rank0.json at exit
    singa-run -np 2 --timeline tl/ train.py              # tl/timeline.rank{0,1}.json + merged tl/timeline.json

or from Python::

    from singa_lite import timeline
    with timeline.timeline("trace.json"):               # or timeline.start(path) ... timeline.stop()
        train()

What is recorded (``ph: "X"`` complete events, ``pid`` = rank, ``ts``/``dur`` in microseconds of the host's
monotonic clock, so the files of ranks on one host line up):

- track 0, "training thread": every operator's forward and backward (name: the operator instance's name,
  ``args.type``: its type), the waits for the gradient exchange (``Fuser.wait``: the time the training thread
  blocks in synchronize), the launch of each all-reduce bucket (``send``), the optimizer update, and the steps:
  ``step N`` spans from the first operator after the previous step's end to the end of the step (DistOpt's
  ``PendingStep.finish`` / ``discard``, a ``Model`` training step, or :func:`mark_step`), and ``between steps``
  spans the gap before it (data loading, logging: whatever the host did between two steps).
- tracks 1.., "communication": each bucket's all-reduce from when the communicator started it to when it
  completed (``args``: bytes, elements, tensors, ``queued_us``: how long it waited behind earlier ones since
  its launch). Collectives run one at a time, so they rarely overlap; when they do (a backend that reports
  no times), the later ones go to a second track.
- the straggler report (comm/straggler.py), when DistOpt makes one: its verdict as an instant event
  (``ph: "i"``, ``cat: "mark"``, ``args.summary``) on every rank, and the straggler's process named
  "rank r (straggler: ...)".

The path: ``.rank{r}`` is inserted before the extension (``trace.json`` -> ``trace.rank0.json``); a path that
is a directory (or ends with ``/``) gets ``timeline.rank{r}.json`` inside. The rank is the one given to
start(), else that of the communicator DistOpt uses, else ``RANK`` from the environment, else 0. Ranks that
a script starts with multiprocessing (fork or spawn) inherit the variable and write their own files; a
process that recorded nothing (the parent that started them) writes none at exit.

Cost: while off, each operator call pays the engine's one test of its operator hook (``device.on_op_hook``),
the same test as without this module, and DistOpt a few per step. While on, each operator adds two clock
reads and one list append (see docs/benchmarks.md). Memory is bounded: after ``max_events`` events (default
1,000,000, about 200 MB; ``SINGA_LITE_TIMELINE_MAX_EVENTS``) new ones are dropped with one warning, and the
file says how many (``otherData.dropped_events``). The file is written at stop() or at exit, atomically,
through a private temporary file in its directory (``checkpoint_io.atomic_file``: a fresh random name
created with O_EXCL and mode 0600, so a file or symbolic link planted at a name it could take is never
written through; fsynced, then renamed into place; removed if writing fails); the trace is owner-only
(0600), as checkpoints are. On a GPU, operator times are the host's: kernels run asynchronously.
"""
from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import sys
import time
import warnings

from . import device
from .checkpoint_io import atomic_file

__all__ = ["start", "stop", "timeline", "mark_step", "mark", "is_active", "recorder", "rank_path", "merge", "ENV_VAR"]

ENV_VAR = "SINGA_LITE_TIMELINE"
MAX_EVENTS_VAR = "SINGA_LITE_TIMELINE_MAX_EVENTS"
DEFAULT_MAX_EVENTS = 1_000_000
COMPUTE, COMM = 0, 1  # track (tid) numbers; communication lanes are COMM, COMM + 1, ...

_active = None  # the _Recorder while a timeline records; None otherwise (the one test callers make)
_now = time.perf_counter


def is_active() -> bool:
    return _active is not None


def recorder():
    """The recorder while a timeline records, else None: what other modules add their own spans to."""
    return _active


def start(path, rank: int | None = None, max_events: int | None = None) -> None:
    """Starts recording; the file is written by stop() (or at exit). path: a file name or a directory (see
    the module docstring); rank: this process's rank (default: found at stop()); max_events: the cap."""
    global _active
    if _active is not None:
        raise RuntimeError(f"timeline: already recording to {_active.path!r}; stop() it before starting another")
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise TypeError(f"timeline: path must be a non-empty file or directory name, got {path!r}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise ValueError(f"timeline: rank must be an int >= 0 or None, got {rank!r}")
    if max_events is None:
        max_events = _env_max_events()
    if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
        raise ValueError(f"timeline: max_events must be an int >= 1, got {max_events!r}")
    _active = _Recorder(os.fspath(path), rank, max_events)
    _install()
    atexit.register(_stop_at_exit)
    _at_process_exit(_active)


def stop() -> str | None:
    """Stops recording and writes the file; returns its path (None when nothing was recording)."""
    global _active
    rec, _active = _active, None
    if rec is None:
        return None
    _install()
    atexit.unregister(_stop_at_exit)
    return rec.write()


@contextlib.contextmanager
def timeline(path, rank: int | None = None, max_events: int | None = None):
    """``with timeline(path): ...`` records the block; the file is written when it ends. Yields the
    recorder: its ``path`` attribute is the file written, once the block is over."""
    start(path, rank, max_events)
    rec = _active
    try:
        yield rec
    finally:
        if _active is rec:
            stop()


def mark_step() -> None:
    """Ends the training step under way (for loops that use neither DistOpt nor Model): the next operator
    starts the next step, and the time in between is drawn as ``between steps``."""
    if _active is not None:
        _active.step_end()


def rank_path(path: str, rank: int) -> str:
    """The file of one rank: ``.rank{r}`` inserted before the extension, or ``timeline.rank{r}.json`` inside a
    directory."""
    if path.endswith(os.sep) or os.path.isdir(path):
        return os.path.join(path, f"timeline.rank{rank}.json")
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext or '.json'}"


def merge(paths, out: str) -> str:
    """Writes one trace holding the events of every file in paths (one process per rank: the pids are the
    ranks already); returns out, written as the ranks' files are (see the module docstring). Files that are
    missing are skipped; an unreadable one raises ValueError."""
    events, other = [], {"ranks": []}
    for p in paths:
        if not os.path.exists(p):
            continue
        try:
            with open(p) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"timeline.merge: {p} is not a readable trace ({e})") from e
        events.extend(doc.get("traceEvents", []))
        other["ranks"].append(doc.get("otherData", {}))
    _write_json(out, {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other})
    return out


# ---------------------------------------------------------------- event points (called by the library)
def record(name: str, cat: str, t0: float, args=None) -> None:
    """An event on the training thread from t0 (a perf_counter() value) to now, if recording."""
    if _active is not None:
        _active.add(name, cat, COMPUTE, t0, _now(), args)


def step_end() -> None:
    """A training step ended (DistOpt's PendingStep, Model's training step)."""
    if _active is not None:
        _active.step_end()


def mark(name: str, args=None, note: str | None = None) -> None:
    """If recording: an instant event `name` (``ph: "i"``, drawn as a line through this rank's tracks; the
    straggler report's verdicts); note: a few words after this rank's process name ("rank 1 (straggler: ...)"),
    '' to clear it, None to leave it."""
    if _active is not None:
        t = _now()
        _active.add(name, "mark", COMPUTE, t, t, args)
        if note is not None:
            _active.note = note


# ---------------------------------------------------------------- the recorder
class _Recorder:
    """Installed as the engine's operator hook while recording (around the time profiler, if one is on)."""

    def __init__(self, path: str, rank, max_events: int):
        self.path, self.rank, self.max_events = path, rank, max_events
        self.world_size = None
        self.inner = None  # the device's time profiler, when one is on: we time around it
        # (name, cat, tid, t0, t1, args) in seconds of perf_counter(); args: a dict, or an op's type name (a
        # shared string: an op event then costs one tuple, two floats and its name, about 200 bytes)
        self.events = []
        self.dropped = 0
        self.steps = 0
        self.step_start = None  # perf_counter() of the open step's first operator; None between steps
        self.last_end = None  # perf_counter() at the end of the previous step
        self.note = ""  # shown after this rank's process name (mark())

    def restart(self) -> None:
        """Forgets what was recorded (in a forked child) and the rank (the child has its own)."""
        self.events, self.dropped, self.steps, self.step_start, self.last_end = [], 0, 0, None, None
        self.note = ""
        self.rank = self.world_size = None

    def add(self, name, cat, tid, t0, t1, args=None) -> None:
        if len(self.events) >= self.max_events:
            if not self.dropped:
                warnings.warn(f"timeline: {self.max_events} events recorded, the cap; later events are dropped "
                              f"(raise it with {MAX_EVENTS_VAR} or start(max_events=...))", RuntimeWarning,
                              stacklevel=3)
            self.dropped += 1
            return
        self.events.append((name, cat, tid, t0, t1, args))

    # the engine's hook: the same calls as device._Timer's
    def forward(self, op, raw):
        t0 = _now()
        if self.step_start is None:
            self._step_begins(t0)
        out = op.forward(*raw) if self.inner is None else self.inner.forward(op, raw)
        self.add(op.name, "forward", COMPUTE, t0, _now(), type(op).__name__)
        return out

    def backward(self, op, dys):
        t0 = _now()
        if self.step_start is None:
            self._step_begins(t0)
        out = op.backward(*dys) if self.inner is None else self.inner.backward(op, dys)
        self.add(op.name, "backward", COMPUTE, t0, _now(), type(op).__name__)
        return out

    def _step_begins(self, t0: float) -> None:
        self.step_start = t0
        if self.last_end is not None:
            self.add("between steps", "gap", COMPUTE, self.last_end, t0, {"after_step": self.steps - 1})

    def step_end(self) -> None:
        if self.step_start is None:  # nothing ran since the last end (e.g. Model's end after DistOpt's)
            return
        t1 = _now()
        self.add(f"step {self.steps}", "step", COMPUTE, self.step_start, t1, {"step": self.steps})
        self.steps += 1
        self.step_start, self.last_end = None, t1

    def bucket(self, name: str, work, launched: float, nbytes: int, elems: int, tensors: int, dtype) -> None:
        """A collective that completed: from when the communicator started it (its launch when the backend
        does not say) to when it ended (when the waiter saw it, likewise)."""
        began = getattr(work, "started_at", None) or launched
        ended = getattr(work, "finished_at", None) or _now()
        self.add(name, "comm", COMM, began, ended,
                 {"bytes": nbytes, "elements": elems, "tensors": tensors, "dtype": getattr(dtype, "name", str(dtype)),
                  "queued_us": _us(began - launched)})

    def saw_communicator(self, comm) -> None:
        if self.rank is None:
            self.rank = comm.rank
        self.world_size = comm.world_size

    # the file
    def write(self) -> str:
        rank = self.rank if self.rank is not None else _rank_from_environment()
        self.path = out = rank_path(self.path, rank)
        _write_json(out, self.trace(rank))
        return out

    def trace(self, rank: int) -> dict:
        lanes = []  # end time of the last event on each communication lane
        evs = []
        for name, cat, tid, t0, t1, args in sorted(self.events, key=lambda e: (e[3], e[3] - e[4])):
            if tid == COMM:  # collectives that overlap (no times from the backend) go to the next lane
                lane = next((i for i, end in enumerate(lanes) if end <= t0), len(lanes))
                if lane == len(lanes):
                    lanes.append(t1)
                lanes[lane] = t1
                tid = COMM + lane
            if cat == "mark":
                ev = {"name": name, "cat": cat, "ph": "i", "s": "p", "pid": rank, "tid": tid, "ts": _us(t0)}
            else:
                ev = {"name": name, "cat": cat, "ph": "X", "pid": rank, "tid": tid, "ts": _us(t0),
                      "dur": _us(t1 - t0)}
            if args:
                ev["args"] = {"type": args} if isinstance(args, str) else args
            evs.append(ev)
        label = f"rank {rank} ({self.note})" if self.note else f"rank {rank}"
        meta = [{"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": label}},
                {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
                {"name": "thread_name", "ph": "M", "pid": rank, "tid": COMPUTE, "args": {"name": "training thread"}}]
        for i in range(max(1, len(lanes))):
            meta.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": COMM + i,
                         "args": {"name": "communication" + (f" {i + 1}" if i else "")}})
        return {"traceEvents": meta + evs, "displayTimeUnit": "ms",
                "otherData": {"rank": rank, "world_size": self.world_size, "steps": self.steps,
                              "events": len(self.events), "dropped_events": self.dropped,
                              "max_events": self.max_events}}


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _write_json(path: str, doc: dict) -> None:
    """Writes doc to path atomically, streaming the JSON (a trace can be hundreds of MB), through a private
    temporary file that is removed if anything fails (checkpoint_io.atomic_file)."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with atomic_file(path) as raw:
        f = io.TextIOWrapper(raw, encoding="utf-8")
        json.dump(doc, f, separators=(",", ":"))
        f.flush()
        f.detach()  # atomic_file fsyncs and closes the file itself


def _rank_from_environment() -> int:
    value = os.environ.get("RANK", "0")
    return int(value) if value.isdigit() else 0


def _env_max_events() -> int:
    value = os.environ.get(MAX_EVENTS_VAR)
    if value is None:
        return DEFAULT_MAX_EVENTS
    if not value.strip().isdigit() or int(value) < 1:
        raise ValueError(f"{MAX_EVENTS_VAR} must be a whole number >= 1, got {value!r}")
    return int(value)


def _install() -> None:
    device.refresh_op_hook()  # the hook is decided in one place, with the time profiler's


def wrap(profiler):
    """The operator hook (device.wrap_op_hook): the recorder (timing around `profiler`) while recording,
    else `profiler` itself (None when no device profiles)."""
    if _active is None:
        return profiler
    _active.inner = profiler
    return _active


device.wrap_op_hook(wrap)


def _stop_at_exit() -> None:
    global _active
    if _active is not None and not _active.events:
        # A process that ran no step, e.g. the parent that started multiprocessing ranks: its empty file
        # would take the name of rank 0's (it has no rank of its own) and replace it.
        _active = None
        _install()
        print(f"singa_lite timeline: nothing recorded in process {os.getpid()}, no file written", file=sys.stderr)
        return
    try:
        path = stop()
    except Exception as e:  # at exit there is nobody left to catch it: say what went wrong
        print(f"singa_lite timeline: could not write the trace: {e}", file=sys.stderr)
        return
    if path:
        print(f"singa_lite timeline: wrote {path}", file=sys.stderr)


def _at_process_exit(rec) -> None:
    """Writes rec's file when this process ends. A multiprocessing child ends with os._exit, which skips
    atexit, and its start clears the exit hooks it inherited or registered while unpickling its target:
    the hook is registered again once the child has started (register_after_fork runs in every child,
    whatever the start method)."""
    from multiprocessing import util

    util.Finalize(None, _stop_at_exit, exitpriority=0)
    util.register_after_fork(rec, _in_child)


def _in_child(rec) -> None:
    if _active is rec:
        rec.restart()  # a forked child: the parent's events are the parent's
        _at_process_exit(rec)


def start_from_environment() -> None:
    path = os.environ.get(ENV_VAR)
    if path and _active is None:
        start(path)
