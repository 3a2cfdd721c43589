"""Gradient fusion for DistOpt: small tensors are packed into one persistent flat buffer and all-reduced
together, so a model with many small parameters pays one collective's latency per bucket instead of one per
tensor; large tensors go alone. Buckets are launched asynchronously, so their communication overlaps
whatever the caller does next (DistOpt: the rest of the backward pass).

A Fuser owns one buffer per (dtype on the wire). Buckets occupy consecutive regions of it; when the next
tensor does not fit behind the buckets still in flight, the Fuser first waits for them and unpacks their
results (a bounds-checked ring: SINGA writes past the end of its buffer in that case).

One backward pass's gradients form a *pass*: ``begin(threshold, first_bucket)``, ``push(grad)`` for each
gradient as it comes, ``finish()``. The Fuser keeps the pass's bucket cap, so DistOpt and
parallel.DataParallel share one rule for when a bucket leaves.

When the ranks' buckets differ (a rank's backward gave no gradient for some parameters: its forward skipped a
layer), the communicator's signature check raises ValueError on every rank with the element counts. The owner
passes that error to :meth:`Fuser.explain`, which names the parameters instead: each rank compares the names
it pushed in the pass with the names every rank had at the first step (the owner's replica check), and when
no bucket of this rank was left in flight the ranks exchange those differences (one small all-gather, only
after such a failure: a normal step pays nothing).
"""
from __future__ import annotations

import numbers
import os
import sys
import time

from .. import _core, timeline
from ..comm.communicator import CollectiveMismatch, CommError

CTensor = _core.Tensor
DEFAULT_THRESHOLD = 2097152  # elements, SINGA's default
# Elements (1 MiB of float32) after which the first bucket of a pass leaves without waiting for `threshold`
# (PyTorch DDP's first bucket is 1 MiB too): a step's exchange then starts early in backward even when the
# whole model is smaller than `threshold`, as SINGA's seed models are.
DEFAULT_FIRST_BUCKET = 262144
_EMPTY = CTensor([0], _core.DType.float32, _core.Device("cpu"))  # what a tensor dropped after its send leaves behind


def check_threshold(threshold, buff_elems: int, who: str) -> int:
    """`threshold` as an int: a positive number of elements that fits a buffer of buff_elems elements."""
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Integral) or threshold < 1:
        raise ValueError(f"{who}: threshold must be a positive number of elements, got {threshold!r}")
    if threshold > buff_elems:
        raise ValueError(f"{who}: threshold {threshold} exceeds the fusion buffer (buffSize={buff_elems} "
                         f"elements); raise buffSize or lower the threshold")
    return int(threshold)


def check_first_bucket(first_bucket, who: str) -> int:
    """`first_bucket` as an int: a number of elements >= 0 (0: the first bucket waits for the threshold)."""
    if isinstance(first_bucket, bool) or not isinstance(first_bucket, numbers.Integral) or first_bucket < 0:
        raise ValueError(f"{who}: first_bucket must be a number of elements >= 0, got {first_bucket!r}")
    return int(first_bucket)


class _Bucket:
    __slots__ = ("start", "end", "members", "params", "work", "scale", "trace", "seq")

    def __init__(self, start: int):
        self.start, self.end, self.members, self.work, self.scale = start, start, [], None, None
        self.params = []  # the parameters of the members pushed with one (what a comm hook's bucket lists)
        self.seq = 0  # its place among the collectives this Fuser launched
        self.trace = None  # (name, launch time, bytes) while a timeline records


class _Completed:
    """A Work that completed without error, less its result: a tensor reap() dropped, or a collective the caller's
    thread ran to its end (an inline exchange). Its times stay for the timeline."""

    __slots__ = ("name", "started_at", "finished_at")

    def __init__(self, name: str, started_at, finished_at):
        self.name, self.started_at, self.finished_at = name, started_at, finished_at

    @classmethod
    def of(cls, work) -> "_Completed":
        return cls(getattr(work, "name", "collective"), getattr(work, "started_at", None),
                   getattr(work, "finished_at", None))

    def is_completed(self) -> bool:
        return True

    def wait(self, timeout=None):
        return None


class Fuser:
    """Packs tensors, all-reduces buckets with `op` asynchronously, and writes the results back.

    comm: a Communicator. buff_elems: the buffer's size in elements. wire_dtype: the dtype sent (None: each
    tensor's own; float16 or bfloat16: cast on packing, back on unpacking). op: the reduction ("sum" or "avg").
    scale: a factor applied to results after unpacking (e.g. world_size, to turn an fp16 average back into
    a sum computed without fp16 overflow).

    reduce: None, or what replaces the all-reduce of a pass's buckets (a comm hook, parallel/exchange.py):
    ``reduce(region, params, offsets, index, last)`` returns an object whose ``wait()`` leaves the reduced
    values in `region`. So that `last` is known when it is called, each bucket is handed over when the pass
    shows what follows it: at the next push (last=False) or at finish (last=True) -- one gradient of
    backward later than the plain all-reduce would start.
    """

    def __init__(self, comm, buff_elems: int, wire_dtype=None, op: str = "avg", scale: float | None = None,
                 reduce=None):
        self.comm, self.buff_elems, self.wire_dtype, self.op, self.scale = comm, buff_elems, wire_dtype, op, scale
        self.reduce = reduce
        self._held = None  # with reduce: (entry, region, params, offsets) sent, not yet handed over
        self._index = 0  # buckets of this pass handed to reduce
        self._buffers = {}  # dtype -> flat CTensor of buff_elems elements, allocated on first use
        self._open = {}  # dtype -> the bucket being filled
        self._in_flight = []  # buckets sent and not yet unpacked, in send order
        self._direct = []  # (work, tensor, staging or None, trace, seq): tensors all-reduced on their own
        self._launched = 0  # collectives launched so far: they are waited for in this order
        self.bytes_sent = 0  # payload handed to all-reduces (per rank), for measurements
        self._threshold = self._cap = None  # the pass under way (begin .. finish); None between passes
        self._launches = 0  # collectives launched in this pass (names them on the timeline)
        self.passes = 0  # passes begun: the step number in error messages
        self.names = []  # names of the tensors pushed in this pass (those given one), for explain()
        self.left_behind = 0  # collectives still in flight when the last wait() failed (not waited for)
        # True: each bucket's collective runs on the caller's thread as the bucket is sent (start_now), instead of
        # on the communicator's thread while the caller goes on (start); see docs/training.md, "Where the
        # exchange runs". Its owner sets it per pass; a subclass whose start() differs keeps False.
        self.inline = False

    # ----- a pass: one backward's gradients
    def begin(self, threshold: int, first_bucket: int = 0) -> None:
        """Starts a pass: tensors pushed until finish() travel in buckets of up to `threshold` elements (a
        larger one alone), and the pass's first bucket leaves as soon as it holds `first_bucket` elements (0:
        at threshold too), so that the exchange starts early in backward even for a model smaller than
        threshold."""
        if self._cap is not None:
            raise RuntimeError("fusion: a pass is already under way; finish() it before beginning another")
        threshold = check_threshold(threshold, self.buff_elems, "fusion")
        first_bucket = check_first_bucket(first_bucket, "fusion")
        self._threshold, self._cap = threshold, min(threshold, first_bucket or threshold)
        self._launches = 0
        self._index = 0
        self.passes += 1
        self.names = []

    @property
    def in_pass(self) -> bool:
        """Whether a pass was begun and not finished."""
        return self._cap is not None

    def push(self, t: CTensor, name: str | None = None, param=None) -> None:
        """Queues t (a gradient just computed) for the pass's exchange; see launch(). name: its parameter's
        name, which explain() reports when the ranks' buckets differ; param: the parameter (a comm hook's
        bucket lists them)."""
        if self._cap is None:
            raise RuntimeError("fusion: push() outside a pass; call begin(threshold, first_bucket) first")
        if name is not None:
            self.names.append(name)
        if self._held is not None:  # more follows: the bucket sent last is not the pass's last
            self._hand_over(last=False)
        self._cap = self.launch(t, self._threshold, self._cap, param)

    def cancel(self) -> None:
        """Ends a pass without sending its open bucket (the backward pass failed: nothing here waits on a
        collective). Buckets already sent complete at the next wait(); one not yet handed to `reduce` never
        is."""
        self._open.clear()
        self._drop_held()
        self._threshold = self._cap = None

    def finish(self) -> list:
        """Ends the pass: sends what is open, waits for every bucket and writes the results back into the
        pushed tensors. Returns the reduced regions, as wait()."""
        self._threshold = self._cap = None
        return self.wait()

    # ----- packing
    def add(self, t: CTensor, param=None) -> None:
        """Copies t (contiguous or not) into the open bucket of its wire dtype."""
        dtype = self.wire_dtype or t.dtype
        n = t.numel
        if n > self.buff_elems:
            raise ValueError(f"fusion: a tensor of {n} elements does not fit the fusion buffer of "
                             f"{self.buff_elems} elements; send it alone (all_reduce) or raise buffSize")
        bucket = self._open.get(dtype)
        if bucket is None:
            bucket = self._open[dtype] = _Bucket(self._free_start(dtype, n))
        elif bucket.end + n > self.buff_elems:  # no room behind: send what we have, start again at 0
            self.send(dtype)
            bucket = self._open[dtype] = _Bucket(self._free_start(dtype, n))
        region = self._buffer(dtype, t.device).slice(0, bucket.end, bucket.end + n)
        _core.copy_(region, t.reshape([n]) if t.is_contiguous() else t.contiguous().reshape([n]))
        bucket.members.append((t, bucket.end, n))
        if param is not None:
            bucket.params.append(param)
        bucket.end += n

    def launch(self, t: CTensor, threshold: int, cap: int, param=None) -> int:
        """Queues t for the exchange, as a gradient comes out of backward: alone when larger than threshold,
        else into the open bucket, which is sent first if t would take it past threshold, and right after if
        it now holds cap elements or more. Returns the cap for the next bucket: threshold once one has gone
        (a pass passes a smaller first cap so that a step's exchange starts early; begin/push/finish keep
        the cap for their caller)."""
        if t.numel > threshold:
            self.send_alone(t, param)
            return cap
        if self.open_elems(t.dtype) + t.numel > threshold:
            self.send()
            cap = threshold
        self.add(t, param)
        if self.open_elems(t.dtype) >= cap:
            self.send()
            cap = threshold
        return cap

    def open_elems(self, dtype) -> int:
        """Elements in the open bucket that a tensor of `dtype` would join."""
        bucket = self._open.get(self.wire_dtype or dtype)
        return 0 if bucket is None else bucket.end - bucket.start

    def send(self, dtype=None) -> None:
        """Launches the all-reduce of the open bucket(s) (all dtypes when dtype is None)."""
        for d in ([dtype] if dtype is not None else list(self._open)):
            bucket = self._open.pop(d, None)
            if bucket is None or bucket.end == bucket.start:
                continue
            region = self._buffers[d].slice(0, bucket.start, bucket.end)
            self.bytes_sent += region.nbytes
            t0 = time.perf_counter()
            if self.reduce is None:
                bucket.work = self._launch_work(region)
            self._launched += 1
            bucket.seq = self._launched
            self._in_flight.append((d, bucket))
            if self.reduce is not None:
                self._hold(bucket, region, bucket.params, [off - bucket.start for _, off, _ in bucket.members])
            elif timeline.recorder() is not None:
                bucket.trace = self._traced_launch("bucket", t0, region.nbytes)

    def send_alone(self, t: CTensor, param=None) -> None:
        """All-reduces t by itself (a tensor larger than the fusion threshold), asynchronously."""
        wire = self.wire_dtype or t.dtype
        staging = None
        if wire != t.dtype or not t.is_contiguous():
            staging = CTensor(list(t.shape), wire, t.device)
            _core.copy_(staging, t)
        sent = t if staging is None else staging
        self.bytes_sent += sent.nbytes
        t0 = time.perf_counter()
        work = self._launch_work(sent) if self.reduce is None else None
        self._launched += 1
        # work, tensor, staging, trace, seq, whether the tensor may be dropped once sent (reap)
        entry = [work, t, staging, None, self._launched, not self.writes_back()]
        self._direct.append(entry)
        if self.reduce is not None:
            self._hold(entry, sent.reshape([sent.numel]), [] if param is None else [param], [0])
        elif timeline.recorder() is not None:
            entry[3] = self._traced_launch("tensor", t0, sent.nbytes)

    def start(self, region: CTensor):
        """Launches the collective of one bucket (or lone tensor) and returns its Work: the all-reduce with
        `op`. A subclass may reduce differently (zero.ShardedExchange: into the bucket's owner only)."""
        return self.comm.all_reduce(region, self.op, async_op=True)

    def start_now(self, region: CTensor) -> None:
        """The collective of start(), run to its end on this thread (an inline exchange)."""
        self.comm.all_reduce(region, self.op)

    def _launch_work(self, region: CTensor):
        if not self.inline:
            return self.start(region)
        t0 = time.perf_counter()
        try:
            self.start_now(region)
        except BaseException:
            # As a failed wait(): the pass is over, and nothing is left in flight (what ran inline had completed)
            self.left_behind = 0
            self._in_flight.clear()
            self._direct.clear()
            raise
        return _Completed("all_reduce", t0, time.perf_counter())

    def forget_last_member(self, dtype) -> None:
        """The open bucket of `dtype` keeps no reference to the tensor added last (its results are not
        written back: see writes_back())."""
        bucket = self._open.get(self.wire_dtype or dtype)
        if bucket is not None and bucket.members:
            _, off, n = bucket.members[-1]
            bucket.members[-1] = (_EMPTY, off, n)

    def writes_back(self) -> bool:
        """Whether the results of what is sent now are written back into the pushed tensors (True here;
        zero.ShardedExchange: only for the buckets this rank owns)."""
        return True

    def reap(self, limit_bytes: int | None = None) -> None:
        """Drops the references to tensors sent alone whose results are not written back (writes_back() was
        False when they were sent) once their collective has completed, so their memory can go before the
        pass ends; each leaves an empty tensor for finish()'s regions. limit_bytes: first wait for the oldest
        of them until those still held come to at most this many bytes (collectives complete in launch order,
        so this waits for nothing launched after them)."""
        droppable = [e for e in self._direct if e[5] and e[0] is not None]
        held = sum(e[1].nbytes for e in droppable)
        for entry in droppable:
            if not entry[0].is_completed() and (limit_bytes is None or held <= limit_bytes):
                break  # the later ones complete after this one
            try:
                entry[0].wait()
            except BaseException:  # left as it is: finish() meets the error where every error is handled
                return
            held -= entry[1].nbytes
            # the Work keeps its result (the tensor itself): a completed stand-in takes its place
            entry[0], entry[1], entry[2], entry[5] = _Completed.of(entry[0]), _EMPTY, None, False

    def idle_buffer(self, dtype, device):
        """This Fuser's flat buffer of `dtype` on `device` while no pass uses it (nothing open or in flight),
        for scratch work between steps (the ZeRO parameter broadcast); None when it has none or it is busy."""
        buf = self._buffers.get(dtype)
        if buf is None or buf.device != device or self._cap is not None or self._in_flight or self._direct:
            return None
        return buf

    @property
    def buffer_bytes(self) -> int:
        """Bytes of the fusion buffers allocated so far (one per dtype on the wire)."""
        return sum(b.nbytes for b in self._buffers.values())

    # ----- handing buckets to `reduce` (a comm hook)
    def _hold(self, entry, region: CTensor, params, offsets) -> None:
        if self._held is not None:  # a bucket follows it: not the last
            self._hand_over(last=False)
        self._held = (entry, region, list(params), offsets)

    def _hand_over(self, last: bool) -> None:
        entry, region, params, offsets = self._held
        self._held = None
        t0 = time.perf_counter()
        try:
            work = self.reduce(region, params, offsets, self._index, last)
        except BaseException:
            self._forget(entry)  # never started: nothing to wait for
            raise
        self._index += 1
        what = "bucket" if isinstance(entry, _Bucket) else "tensor"
        trace = self._traced_launch(what, t0, region.nbytes) if timeline.recorder() is not None else None
        if isinstance(entry, _Bucket):
            entry.work, entry.trace = work, trace
        else:
            entry[0], entry[3] = work, trace

    def _drop_held(self) -> None:
        if self._held is not None:
            self._forget(self._held[0])
            self._held = None

    def _forget(self, entry) -> None:
        if isinstance(entry, _Bucket):
            self._in_flight[:] = [(d, b) for d, b in self._in_flight if b is not entry]
        else:
            self._direct[:] = [e for e in self._direct if e is not entry]

    # ----- unpacking
    def wait(self, last: bool = True) -> list:
        """Sends what is still open, waits for every bucket, writes results back into the tensors. Returns
        the reduced wire-format regions (for checks such as finiteness). last=False: more of the pass
        follows (a full buffer waited for mid-pass)."""
        self.send()
        t0 = time.perf_counter()
        waited = len(self._in_flight) + len(self._direct)
        self.left_behind = 0
        try:
            if self._held is not None:
                self._hand_over(last)
            regions = self._unpack()
        except BaseException:
            # A failed collective (mismatched buckets, a timeout) ends the pass: what is still in flight is not
            # waited for (it may never complete), and the buffer starts empty again.
            self.left_behind = len(self._in_flight) + len(self._direct)  # the failed one was taken off already
            self._in_flight.clear()
            self._direct.clear()
            raise
        if waited:  # the time the caller blocked on the exchange (and unpacked it), for the timeline
            timeline.record("wait", "wait", t0, {"collectives": waited})
        return regions

    def _unpack(self) -> list:
        """Waits for the collectives in the order they were launched (the order every rank's communicator runs
        them): when the ranks' collectives differ, each rank then meets the first difference, the same one.
        """
        regions = []
        in_flight, direct = self._in_flight, self._direct
        while in_flight or direct:
            if direct and (not in_flight or direct[0][4] < in_flight[0][1].seq):
                regions.append(self._unpack_direct())
                continue
            d, bucket = in_flight.pop(0)  # taken off before the wait: a failed one is not left behind
            bucket.work.wait()
            if bucket.trace is not None:
                self._traced_end(bucket.trace, bucket.work, bucket.end - bucket.start, len(bucket.members), d)
            buf = self._buffers[d]
            for t, off, n in bucket.members:
                if t is not _EMPTY:
                    self._write_back(t, buf.slice(0, off, off + n))
            regions.append(buf.slice(0, bucket.start, bucket.end))
        return regions

    def _unpack_direct(self) -> CTensor:
        work, t, staging, trace, _, dropped = self._direct.pop(0)
        work.wait()
        if trace is not None:
            self._traced_end(trace, work, t.numel, 1, (staging if staging is not None else t).dtype)
        if dropped or t is _EMPTY:  # not this rank's: nothing to write back, nothing of it to vote on
            return _EMPTY
        if staging is not None:
            self._write_back(t, staging)
        elif self.scale is not None:
            _core.mul_scalar(t, self.scale, out=t)
        return t if staging is None else staging

    # ----- when the ranks' buckets differ
    def explain(self, error: Exception, who: str, reference, names=None) -> Exception:
        """A ValueError naming the parameters one rank skipped, for a collective's mismatch `error` raised in
        this pass (by wait(), or by a collective the owner made right after it); other errors come back as
        they are. reference: the parameter names every rank had at the first step (the same on every rank);
        names: those of this rank's pass (default: the names pushed). Call it on every rank: when no
        collective of this pass was left in flight here, the ranks exchange what they lack (one all-gather;
        a rank that left some in flight does not take part, and the others then fall back to their own view).
        """
        if not is_mismatch(error) or reference is None:
            return error
        names = list(self.names if names is None else names)
        mine = set(names)
        lacks = [n for n in reference if n not in mine]
        known = set(reference)
        extra = [n for n in names if n not in known]
        rank = self.comm.rank
        every = None
        if self.left_behind == 0 and self.comm.world_size > 1:
            try:
                every = self.comm.all_gather_object([lacks, extra])
            except (ValueError, CommError):
                every = None  # the ranks' calls did not pair up again: each says what it knows
        step = f"at step {self.passes}" + (f" (called from {user_line()})" if user_line() else "")
        if every is not None:
            said = [f"{', '.join(ls)} skipped on rank {r}" for r, (ls, _) in enumerate(every) if ls]
            said += [f"{', '.join(ex)} sent by rank {r} only (not a parameter at the first step)"
                     for r, (_, ex) in enumerate(every) if ex]
            if not said:
                said = ["every rank had gradients for the same parameters as at the first step, in buckets of "
                        "different sizes (a different threshold or buffSize per rank?)"]
        elif lacks or extra:
            said = ([f"{', '.join(lacks)} skipped on this rank (rank {rank})"] if lacks else []) + \
                   ([f"{', '.join(extra)} sent by this rank (rank {rank}) only"] if extra else [])
        else:
            said = [f"this rank (rank {rank}) had gradients for all {len(reference)} parameters of the first step, "
                    f"so another rank skipped some (its own error names them)"]
        fix = ("pass find_unused_parameters=True and parameters=model.get_params() to DistOpt, or use every "
               "layer on every rank" if who.startswith("DistOpt") else
               "use every layer on every rank, or train with DistOpt(..., find_unused_parameters=True) instead "
               "of DataParallel" if who.startswith("DataParallel") else "use every layer on every rank")
        return ValueError(f"{who}: the ranks' gradients differ {step}: {'; '.join(said)}. A parameter is "
                          f"skipped when the rank's forward did not use it, so its backward gave it no gradient; "
                          f"every rank must give gradients for the same parameters at each step ({fix}, e.g. "
                          f"add 0 * the unused branch). The communicator said: {error}")

    # ----- timeline events (only while a timeline records)
    def _traced_launch(self, what: str, t0: float, nbytes: int):
        rec = timeline.recorder()
        if rec is None:  # stopped between the test and here
            return None
        rec.saw_communicator(self.comm)
        name = f"all_reduce {what} {self._launches}"
        self._launches += 1
        rec.add(f"send {what}", "launch", timeline.COMPUTE, t0, time.perf_counter(), {"bytes": nbytes})
        return name, t0, nbytes

    def _traced_end(self, trace, work, elems: int, tensors: int, dtype) -> None:
        rec = timeline.recorder()
        if rec is not None:
            name, launched, nbytes = trace
            rec.bucket(name, work, launched, nbytes, elems, tensors, dtype)

    def _write_back(self, t: CTensor, region: CTensor) -> None:
        _core.copy_(t, region.reshape(list(t.shape)))  # casts back from the wire dtype
        if self.scale is not None:
            _core.mul_scalar(t, self.scale, out=t)

    # ----- buffer regions
    def _buffer(self, dtype, device) -> CTensor:
        buf = self._buffers.get(dtype)
        if buf is None or buf.device != device:
            buf = self._buffers[dtype] = CTensor([self.buff_elems], dtype, device)
        return buf

    def _free_start(self, dtype, n: int) -> int:
        """Where a new bucket of this dtype may start: behind the buckets in flight, or at 0 once they are
        done (waiting for them if the space behind is too short)."""
        ends = [b.end for d, b in self._in_flight if d == dtype]
        start = max(ends) if ends else 0
        if start + n > self.buff_elems:
            self.wait(last=False)
            start = 0
        return start


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def user_line() -> str:
    """'file:line' of the nearest caller outside singa_lite (the line of the user's script), or ''."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    return "" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


def is_mismatch(error: Exception) -> bool:
    """Whether `error` is a communicator's report that the ranks' calls differ: the CollectiveMismatch every
    backend raises, on every rank alike."""
    return isinstance(error, CollectiveMismatch)
