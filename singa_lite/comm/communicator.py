"""The one communicator interface every backend implements (mpi, shm; nccl with the CUDA build).

The public methods live here and do everything that does not depend on the backend: argument checks (wrong
dtypes, devices, sizes or roots raise before anything is sent), contiguous staging, output allocation,
asynchronous handles and object collectives. A backend implements only the ``_xxx`` hooks, each on
contiguous raw tensors already checked, blocking until done.

Tensors may be ``tensor.Tensor`` or raw ``_core.Tensor`` (what ``t.data`` gives, as SINGA scripts pass).
Outputs come back in the kind that went in.
"""
from __future__ import annotations

import base64
import json
import os
import queue
import threading
import time
import weakref

import numpy as np

from .. import _core, tensor
from ..tensor import Tensor
from .arrivals import POINT_TO_POINT

CTensor = _core.Tensor
CommError = _core.CommError  # a RuntimeError subclass, raised by the C++ backends too


def seconds_from_env(var: str, default: float) -> float:
    """The positive number of seconds environment variable `var` holds, or `default` when it is unset; anything
    else is a ValueError naming the variable."""
    raw = os.environ.get(var)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{var} must be a positive number of seconds, got {raw!r}")
    return value
# The ranks called a collective with different arguments: every backend raises this one type (a ValueError, as
# before it existed), on every rank alike. Defined by the bindings (csrc/comm/mismatch.h): shm's C++ raises it.
CollectiveMismatch = _core.CollectiveMismatch

REDUCE_OPS = ("sum", "avg", "max", "min", "prod")
# New dtypes go at the end: the mpi backend's call signature sends a dtype's index in this tuple.
DTYPES = (tensor.float16, tensor.float32, tensor.float64, tensor.int32, tensor.int64, tensor.bfloat16)
DEFAULT_TIMEOUT = 300.0  # seconds; SINGA_LITE_COMM_TIMEOUT or timeout= change it
# A backend that times out by itself reports its own, more precise CommError: waiters allow it this long.
WAIT_GRACE_S = 5.0


class Work:
    """Handle of an asynchronous operation: ``wait()`` returns its result (or raises its error)."""

    def __init__(self, name: str, comm=None):
        self.name = name
        self._comm = comm
        self._done = threading.Event()
        self._result = None
        self._error = None
        # perf_counter() when the operation started and ended on the communication thread (the timeline
        # draws them); None until then, and for backends that complete elsewhere.
        self.started_at = self.finished_at = None

    def _finish(self, result=None, error=None):
        self.finished_at = time.perf_counter()
        self._result, self._error = result, error
        self._done.set()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None):
        """Blocks until the operation finished; returns its result. timeout (seconds): how long to wait;
        default: the communicator's timeout. On expiry ``CommError`` is raised; when the communicator's own
        timeout expired, it names the ranks that had not arrived and the communicator is unusable after."""
        limit = timeout
        if limit is None and self._comm is not None:
            limit = self._comm.timeout + (WAIT_GRACE_S if self._comm._times_out_itself else 0.0)
        log = None if self._comm is None else self._comm.arrivals
        if log is not None and not self._done.is_set():  # the straggler report's time blocked in collectives
            t0 = time.perf_counter()
            done = self._done.wait(limit)
            log.blocked += time.perf_counter() - t0
        else:
            done = self._done.wait(limit)
        if not done:
            if timeout is None and self._comm is not None:
                raise self._comm._expired(self.name)
            raise CommError(f"{self.name}: not finished after waiting {timeout} s")
        if self._error is not None:
            if isinstance(self._error, CommError):
                # About the job (a rank died, a timeout), not about the communication thread's frames: the
                # waiter's own frames are what a user needs, and every surviving rank prints this traceback.
                raise self._error.with_traceback(None)
            raise self._error  # anything else may be a bug: keep where it happened
        return self._result


class _Runner:
    """Runs one communicator's operations one at a time, in call order, on a background thread: every rank
    issues the same sequence of collectives, so a second operation must never start before the first ended."""

    def __init__(self, label: str):
        self._queue: queue.Queue = queue.Queue()
        self._label = label
        self._thread = None
        self.pending = 0  # submitted and not yet finished
        self._count = threading.Lock()  # guards pending (changed from two threads)
        self.lock = threading.Lock()  # held while an operation runs, inline or on the thread

    def submit(self, name: str, fn, comm=None) -> Work:
        work = Work(name, comm)
        with self._count:
            self.pending += 1
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"singa_lite-{self._label}", daemon=True)
            self._thread.start()
        self._queue.put((work, fn))
        return work

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    def stop(self) -> None:
        """Ends the thread once the operations queued before are done (the communicator was closed)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread = None  # a later submission (raising at once: closed) starts another

    def _loop(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, fn = item
            try:
                with self.lock:
                    work.started_at = time.perf_counter()
                    result = fn()
                work._finish(result=result)
            except BaseException as e:  # handed to whoever waits on the work
                work._finish(error=e)
            finally:
                with self._count:
                    self.pending -= 1


def raw_tensor(t, what: str) -> CTensor:
    """The C++ tensor of a tensor.Tensor, or a raw one as it is; what: the caller, for the error."""
    if isinstance(t, Tensor):
        return t.data
    if isinstance(t, CTensor):
        return t
    raise TypeError(f"{what}: expected a tensor.Tensor or a raw tensor (t.data), got {type(t).__name__}")


def _like_input(t, raw: CTensor):
    """raw, wrapped as a tensor.Tensor when the caller passed one."""
    return Tensor(data=raw, requires_grad=False) if isinstance(t, Tensor) else raw


class Communicator:
    """A group of ``world_size`` processes (ranks) that exchange tensors.

    Collectives (every rank calls them in the same order with matching arguments): ``all_reduce``,
    ``broadcast``, ``reduce`` (in place); ``all_gather``, ``reduce_scatter``, ``gather``, ``scatter`` (new
    outputs); ``barrier``; point to point ``send`` / ``recv``; ``broadcast_object`` /
    ``all_gather_object`` for small metadata. Reduction ``op``: "sum", "avg", "max", "min", "prod" ("avg"
    only for floating dtypes). Supported dtypes: float16, float32, float64, int32, int64. Pass
    ``async_op=True`` to get a :class:`Work` handle instead of waiting.

    Every operation has a timeout (``timeout``, seconds); on expiry, or when a rank dies or aborts, the
    surviving ranks raise ``CommError`` naming the ranks concerned, and the communicator is unusable after.
    When the ranks' calls of a collective differ (shape, dtype, op, root or operation), every rank raises
    ``CollectiveMismatch`` (a ValueError).

    ``new_group(ranks)`` makes a communicator of some of the ranks (see there).

    ``backend`` is the backend's name, for people. Code that must decide what a communicator can do reads its
    capabilities instead: ``device_kind``, ``spans_hosts``, ``routes_across_hosts``, ``supports_groups``,
    ``keeps_store``, ``is_member``. ``rendezvous_store``: the store it holds open, if any (see there).
    """

    backend = "?"
    # ----- capabilities (class attributes; compare these, not backend names)
    device_kind = "cpu"  # the memory its collectives move: "cpu" or "cuda"
    spans_hosts = True  # its ranks may run on several hosts (False: shm, one host's shared memory)
    routes_across_hosts = False  # it arranges cross-host traffic itself (NCCL's rings and trees, hierarchical)
    supports_groups = False  # new_group() works
    keeps_store = False  # it keeps using its rendezvous store after its creation (tcp: addresses, failure reports)
    # A rank waiting for its transfer sleeps in the kernel while the bytes move (tcp: poll() on sockets), so other
    # work of the rank overlaps the transfer; False where a thread must poll for them to move (MPI's progress
    # engine): the hierarchical all-reduce pipelines its pieces only where this holds (comm/hierarchical.py).
    sleeps_while_waiting = False
    is_member = True  # False only for what new_group returns on a rank outside the group
    # The rendezvous store (store.TcpStore) this communicator holds for as long as it lives, or None. tcp keeps
    # the store it met its peers through (keeps_store); dist.init's environment rendezvous gives rank 0's store
    # to the communicator of any other backend, so that rank 0 serves it as long as the job runs: stopping at
    # once could cut off a rank whose last reply is still on its way.
    rendezvous_store = None
    # True: the backend's calls time out by themselves (they raise CommError); waiters on asynchronous work
    # then allow a grace period for that error. False: only the waiter's timeout ends a stuck operation.
    _times_out_itself = True
    _parent_ranks = None  # on a group: its members as ranks of the communicator it was made from
    _closed_because = None  # why close() was called for the user (its parent was closed), for later errors
    # An arrivals.ArrivalLog once the straggler report attached one: each collective's duration, in call order
    arrivals = None

    def __init__(self, rank: int, world_size: int, local_rank: int, local_size: int, timeout: float):
        self._rank, self._world_size = int(rank), int(world_size)
        self._local_rank, self._local_size = int(local_rank), int(local_size)
        self._timeout = check_timeout(timeout)
        self._runner = _Runner(f"{self.backend}-rank{rank}")
        self._broken = None  # the CommError that made this communicator unusable
        self.closed = False
        # The groups new_group made from this one (weak references), in the order made: closed with it, the latest
        # first, in the same order on every rank (closing may be collective: mpi).
        self._groups = []

    # ----- who we are
    @property
    def rank(self) -> int:
        return self._rank

    global_rank = rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def local_rank(self) -> int:
        return self._local_rank

    @property
    def local_size(self) -> int:
        return self._local_size

    @property
    def timeout(self) -> float:
        """Seconds an operation may take before every surviving rank raises CommError."""
        return self._timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._timeout = check_timeout(seconds)
        self._timeout_changed()

    @property
    def ranks(self) -> list:
        """On a group made by new_group: its members as ranks of the communicator it was made from, in group rank
        order (group rank i is ranks[i] there). Otherwise [0, 1, ..., world_size - 1]."""
        return list(self._parent_ranks) if self._parent_ranks is not None else list(range(self.world_size))

    def __repr__(self):
        return (f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size}, "
                f"local_rank={self.local_rank}, local_size={self.local_size}, timeout={self.timeout})")

    # ----- collectives
    def all_reduce(self, t, op: str = "sum", async_op: bool = False):
        """t = op over ranks of t, in place; returns t (or a Work whose wait() returns t)."""
        raw = self._check_tensor(t, "all_reduce")
        self._check_op(op, raw, "all_reduce")
        return self._run("all_reduce", lambda: self._in_place(raw, lambda c: self._all_reduce(c, op)) or t,
                         async_op)

    def broadcast(self, t, root: int = 0, async_op: bool = False):
        """Rank `root`'s t copied into every rank's t, in place; returns t."""
        raw = self._check_tensor(t, "broadcast")
        self.check_rank(root, "broadcast", "root")
        return self._run("broadcast", lambda: self._in_place(raw, lambda c: self._broadcast(c, root)) or t,
                         async_op)

    def reduce(self, t, root: int = 0, op: str = "sum", async_op: bool = False):
        """op over ranks of t into rank `root`'s t (in place); other ranks' t are left as they were."""
        raw = self._check_tensor(t, "reduce")
        self._check_op(op, raw, "reduce")
        self.check_rank(root, "reduce", "root")
        return self._run("reduce", lambda: self._in_place(raw, lambda c: self._reduce(c, root, op)) or t,
                         async_op)

    def all_gather(self, t, async_op: bool = False):
        """A new tensor of shape (world_size, *t.shape): row r is rank r's t."""
        raw = self._check_tensor(t, "all_gather")

        def go():
            out = CTensor([self.world_size, *raw.shape], raw.dtype, raw.device)
            self._all_gather(out, raw.contiguous())
            return _like_input(t, out)
        return self._run("all_gather", go, async_op)

    def reduce_scatter(self, t, op: str = "sum", async_op: bool = False):
        """t has shape (world_size * m, ...): rank r gets op over ranks of rows [r*m, (r+1)*m), a new tensor
        of shape (m, ...)."""
        raw = self._check_tensor(t, "reduce_scatter")
        self._check_op(op, raw, "reduce_scatter")
        shape = self._split_shape(raw, "reduce_scatter")

        def go():
            out = CTensor(shape, raw.dtype, raw.device)
            self._reduce_scatter(out, raw.contiguous(), op)
            return _like_input(t, out)
        return self._run("reduce_scatter", go, async_op)

    def gather(self, t, root: int = 0, async_op: bool = False):
        """On `root`: a new tensor (world_size, *t.shape) of every rank's t; on the other ranks: None."""
        raw = self._check_tensor(t, "gather")
        self.check_rank(root, "gather", "root")

        def go():
            out = CTensor([self.world_size, *raw.shape], raw.dtype, raw.device) if self.rank == root else None
            self._gather(out, raw.contiguous(), root)
            return None if out is None else _like_input(t, out)
        return self._run("gather", go, async_op)

    def scatter(self, t, root: int = 0, async_op: bool = False):
        """t has shape (world_size * m, ...) on every rank (only root's values are used): rank r gets rows
        [r*m, (r+1)*m) of root's t, a new tensor of shape (m, ...)."""
        raw = self._check_tensor(t, "scatter")
        self.check_rank(root, "scatter", "root")
        shape = self._split_shape(raw, "scatter")

        def go():
            out = CTensor(shape, raw.dtype, raw.device)
            self._scatter(out, raw.contiguous() if self.rank == root else None, root)
            return _like_input(t, out)
        return self._run("scatter", go, async_op)

    def barrier(self, async_op: bool = False):
        """Returns once every rank has called barrier."""
        return self._run("barrier", self._barrier, async_op)

    def send(self, t, dst: int, tag: int = 0, async_op: bool = False):
        """Sends t to rank `dst`, which must call recv(t_like, src=this rank, tag=tag)."""
        raw = self._check_tensor(t, "send")
        self._check_peer(dst, "send", "dst")
        return self._run("send", lambda: self._send(raw.contiguous(), dst, int(tag)), async_op)

    def recv(self, t, src: int, tag: int = 0, async_op: bool = False):
        """Receives into t (in place) what rank `src` sent with the same tag; returns t."""
        raw = self._check_tensor(t, "recv")
        self._check_peer(src, "recv", "src")
        return self._run("recv", lambda: self._in_place(raw, lambda c: self._recv(c, src, int(tag))) or t,
                         async_op)

    # ----- small Python objects (metadata), as JSON: no pickle, so nothing received can run code
    def broadcast_object(self, obj=None, root: int = 0):
        """Rank `root`'s obj on every rank. obj: JSON data (dict with str keys, list, str, int, float, bool,
        None) plus bytes; tuples come back as lists."""
        self.check_rank(root, "broadcast_object", "root")
        data = encode_object(obj, "broadcast_object") if self.rank == root else b""
        size = self._int_tensor([len(data)])
        self.broadcast(size, root)
        buf = self._bytes_tensor(data, int(np.asarray(size)[0]))
        self.broadcast(buf, root)
        return decode_object(np.asarray(buf).tobytes()[:int(np.asarray(size)[0])])

    def all_gather_object(self, obj) -> list:
        """[obj of rank 0, obj of rank 1, ...] on every rank (same object rules as broadcast_object)."""
        data = encode_object(obj, "all_gather_object")
        sizes = np.asarray(self.all_gather(self._int_tensor([len(data)])))[:, 0]
        gathered = np.asarray(self.all_gather(self._bytes_tensor(data, int(sizes.max()))))
        return [decode_object(gathered[r].tobytes()[:int(sizes[r])]) for r in range(self.world_size)]

    # ----- process groups
    def new_group(self, ranks, timeout: float | None = None) -> "Communicator":
        """A communicator of some of this one's ranks, as torch.distributed.new_group.

        Collective: every rank of this communicator calls it, with the same `ranks`, those not listed too.
        ranks: the members, distinct ranks of this communicator; the group numbers them in this order (group rank
        i is this communicator's rank ranks[i]; ``group.ranks`` gives the list back). timeout: the group's
        (default: this communicator's). On a member: a communicator of the same backend with every collective,
        checks and timeouts, usable with ``DistOpt(opt, communicator=group)``; errors about a group's ranks add
        which of this communicator's ranks they are. On a rank not listed: a placeholder (``is_member`` False)
        whose every use raises ValueError saying so. Closing this communicator closes its groups (their later
        use raises CommError saying why). Ranks that differ across callers raise CollectiveMismatch on every
        rank; a bad list (empty, repeated or out of range ranks, not ints) raises ValueError."""
        if self._broken is not None:
            raise self._broken
        who = f"{self.backend} new_group (rank {self.rank} of {self.world_size})"
        members = check_group_ranks(ranks, self.world_size, who)
        chosen = self.timeout if timeout is None else check_timeout(timeout)
        if not self.supports_groups:
            raise ValueError(f"{who}: the {type(self).__name__} communicator cannot make groups")
        group = self._new_group(members, chosen)
        if self.rank not in members:
            return NonMember(self, members)
        group._parent_ranks = members
        self._groups = [g for g in self._groups if g() is not None] + [weakref.ref(group)]
        return group

    def split(self, member: bool) -> "Communicator | None":
        """Collective: a group (see new_group) of the ranks that pass member=True, in this communicator's rank
        order; None on the others."""
        members = [r for r, m in enumerate(self.all_gather_object(bool(member))) if m]
        if not members:
            return None
        group = self.new_group(members)
        return group if group.is_member else None

    def _new_group(self, ranks: list, timeout: float) -> "Communicator | None":
        """Backend hook of new_group (ranks checked): the members' communicator, None on the other ranks."""
        raise NotImplementedError

    def _agree_on_group(self, ranks: list, mine=None) -> list:
        """The first step of _new_group on every backend: every rank's `mine` (JSON data), in rank order, once
        the ranks are known to have passed the same group (CollectiveMismatch on every rank otherwise)."""
        every = self.all_gather_object([ranks, mine])
        differ = [r for r, (theirs, _) in enumerate(every) if theirs != every[0][0]]
        if differ:
            raise CollectiveMismatch(
                f"{self.backend} new_group: the ranks passed different groups: rank 0 passed {every[0][0]}; "
                + "; ".join(f"rank {r} passed {every[r][0]}" for r in differ)
                + ". Every rank calls new_group with the same ranks, also the ranks not in the group")
        return [m for _, m in every]

    def _in_parent_terms(self, error: Exception) -> Exception:
        """On a group: `error` (about group ranks) with which ranks of the parent communicator they are."""
        if self._parent_ranks is None or getattr(error, "_group_noted", False):
            return error
        pairs = ", ".join(f"{i} = {r}" for i, r in enumerate(self._parent_ranks))
        noted = type(error)(f"{error} [this {self.backend} communicator is a group of ranks {self._parent_ranks} "
                            f"of the communicator new_group made it from; group rank = rank there: {pairs}]")
        noted._group_noted = True
        return noted

    # ----- failure handling
    def abort(self, reason: str = "aborted by the user") -> None:
        """Makes every rank's current and future operations raise CommError with this reason, those of the groups
        made from this communicator too."""
        self._abort(str(reason))
        for ref in reversed(getattr(self, "_groups", ())):
            group = ref()
            if group is not None and not group.closed:
                try:
                    group.abort(reason)
                except CommError:
                    pass

    def close(self) -> None:
        """Releases the backend's resources, and those of the groups made from this communicator; later
        operations raise CommError."""
        failed = self._close_groups()
        if self._broken is None:  # a communicator that failed is not torn down (MPI could block in it)
            why = f" ({self._closed_because})" if self._closed_because else ""
            self._broken = CommError(f"{self.backend} communicator of rank {self.rank}: used after close(){why}")
            self.closed = True
            self._close()
        self._runner.stop()  # a failed one's too: an operation stuck in it still ends by its timeout
        if failed is not None:
            raise failed

    def _close_groups(self):
        """Closes the groups made from this communicator (a group outliving it could not report a dead rank
        through it); returns the first CommError one raised (the others are closed all the same)."""
        failed = None
        for ref in reversed(getattr(self, "_groups", ())):
            group = ref()
            if group is None or group.closed:
                continue
            group._closed_because = (f"it is a group of the {self.backend} communicator of rank {self.rank}, "
                                     f"which was closed")
            try:
                group.close()
            except CommError as e:
                failed = failed or e
        return failed

    # ----- hooks for backends (contiguous raw tensors, checked; blocking)
    def _all_reduce(self, t, op): raise NotImplementedError
    def _broadcast(self, t, root): raise NotImplementedError
    def _reduce(self, t, root, op): raise NotImplementedError
    def _all_gather(self, out, t): raise NotImplementedError
    def _reduce_scatter(self, out, t, op): raise NotImplementedError
    def _gather(self, out, t, root): raise NotImplementedError
    def _scatter(self, out, t, root): raise NotImplementedError
    def _barrier(self): raise NotImplementedError
    def _send(self, t, dst, tag): raise NotImplementedError
    def _recv(self, t, src, tag): raise NotImplementedError
    def _abort(self, reason): raise NotImplementedError
    def _close(self): pass
    def _timeout_changed(self): pass
    def _on_timeout(self, name: str) -> CommError:
        return CommError(f"{self.backend} {name} (rank {self.rank}): not finished after {self.timeout} s")
    def _check_device(self, raw: CTensor, what: str) -> None:
        if raw.device.kind != self.device_kind:
            raise ValueError(f"{what}: the {self.backend} backend moves CPU tensors, got one on {raw.device}; "
                             f"use the nccl backend for GPU tensors or move it with to_host()")

    # ----- helpers
    def _run(self, name: str, fn, async_op: bool):
        if self._broken is not None:
            raise self._broken
        inline = not async_op and self._runner.pending == 0
        log = self.arrivals
        if log is not None and not log.paused and name not in POINT_TO_POINT:
            fn = log.timed(fn, inline)
        if async_op:
            return self._runner.submit(name, lambda: self._guard(fn), self)
        if inline:
            with self._runner.lock:  # nothing queued: run here, saving a thread hand-off per call
                return self._guard(fn)
        return self._runner.submit(name, lambda: self._guard(fn), self).wait()

    def _expired(self, name: str) -> CommError:
        """A waiter's timeout expired on an operation still running: the communicator is unusable now."""
        if self._broken is None:
            self._broken = self._in_parent_terms(self._on_timeout(name))
        return self._broken

    def _guard(self, fn):
        try:
            return fn()
        except (CommError, CollectiveMismatch) as e:
            self._reraise(e)

    def _reraise(self, e) -> None:
        """Inside an except clause for `e`: raises it in this communicator's terms (a group's ranks named as the
        parent's); a CommError also breaks the communicator."""
        noted = self._in_parent_terms(e)
        if isinstance(e, CommError):
            self._broken = noted
        if noted is e:
            raise
        raise noted from None

    def _check_tensor(self, t, what: str) -> CTensor:
        raw = raw_tensor(t, what)
        if raw.dtype not in DTYPES:
            raise TypeError(f"{what}: tensors of {', '.join(d.name for d in DTYPES)} can be communicated, got "
                            f"{raw.dtype.name}; cast with as_type()")
        self._check_device(raw, what)
        return raw

    def _check_op(self, op, raw: CTensor, what: str) -> None:
        if op not in REDUCE_OPS:
            raise ValueError(f"{what}: op must be one of {', '.join(REDUCE_OPS)}, got {op!r}")
        if op == "avg" and raw.dtype in (tensor.int32, tensor.int64):
            raise TypeError(f"{what}: op='avg' needs a floating dtype, got {raw.dtype.name}; use op='sum' and "
                            f"divide, or cast to float32")

    def check_rank(self, r, what: str, name: str) -> None:
        """ValueError naming `what` (the caller) and `name` (its argument) unless r is a rank of this
        communicator."""
        if not isinstance(r, (int, np.integer)) or isinstance(r, bool) or not 0 <= r < self.world_size:
            raise ValueError(f"{what}: {name} must be a rank in [0, {self.world_size}), got {r!r}")

    def _check_peer(self, r, what: str, name: str) -> None:
        self.check_rank(r, what, name)
        if r == self.rank:
            raise ValueError(f"{what}: {name}={r} is this rank itself")

    def _split_shape(self, raw: CTensor, what: str) -> list:
        if raw.ndim == 0 or raw.shape[0] % self.world_size:
            raise ValueError(f"{what}: the first axis must be a multiple of world_size={self.world_size}, got "
                             f"shape {tuple(raw.shape)}")
        return [raw.shape[0] // self.world_size, *raw.shape[1:]]

    @staticmethod
    def _in_place(raw: CTensor, fn) -> None:
        """Runs fn on raw, or on a contiguous copy written back afterwards."""
        if raw.is_contiguous():
            fn(raw)
            return None
        tmp = raw.contiguous()
        fn(tmp)
        _core.copy_(raw, tmp)
        return None

    @staticmethod
    def _int_tensor(values) -> CTensor:
        return CTensor.from_buffer(np.asarray(values, np.int64))

    @staticmethod
    def _bytes_tensor(data: bytes, size: int) -> CTensor:
        padded = np.zeros(max((size + 3) // 4, 1), np.int32)
        padded.view(np.uint8)[:len(data)] = np.frombuffer(data, np.uint8)
        return CTensor.from_buffer(padded)


class NonMember(Communicator):
    """What new_group returns on a rank outside the group: every use raises ValueError saying so (only
    ``is_member``, ``ranks``, ``backend``, ``closed`` and ``close()``, which does nothing, answer)."""

    is_member = False
    _ANSWERS = frozenset({"is_member", "ranks", "backend", "closed", "close", "_info", "_error"})

    def __init__(self, parent: Communicator, ranks: list):  # no super().__init__: there is nothing to run
        object.__setattr__(self, "_info", (parent.backend, parent.rank, list(ranks)))

    def __getattribute__(self, name):
        if name in NonMember._ANSWERS or (name.startswith("__") and name.endswith("__")):
            return object.__getattribute__(self, name)
        raise object.__getattribute__(self, "_error")(name)

    def _error(self, name: str) -> ValueError:
        backend, rank, ranks = object.__getattribute__(self, "_info")
        return ValueError(f"rank {rank} is not in the group {ranks}; only its members may use it (this rank used "
                          f"its {name!r}). Every rank calls new_group, but only the ranks listed use what it "
                          f"returns: test group.is_member first")

    @property
    def ranks(self) -> list:
        return list(object.__getattribute__(self, "_info")[2])

    @property
    def backend(self) -> str:
        return object.__getattribute__(self, "_info")[0]

    closed = False

    def close(self) -> None:
        pass

    def __repr__(self):
        backend, rank, ranks = object.__getattribute__(self, "_info")
        return f"NonMember(backend={backend!r}, rank={rank}, group={ranks})"


def check_group_ranks(ranks, world_size: int, who: str) -> list:
    """`ranks` as a list of ints: a non-empty sequence of distinct ranks in [0, world_size); ValueError saying
    what is wrong otherwise."""
    if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
        raise ValueError(f"{who}: ranks must be a list of ranks, e.g. [0, 2], got {ranks!r}")
    given = list(ranks)
    if not given:
        raise ValueError(f"{who}: ranks must name at least one rank, got {ranks!r}")
    for r in given:
        if not isinstance(r, (int, np.integer)) or isinstance(r, bool):
            raise ValueError(f"{who}: ranks must be ints, got {r!r} ({type(r).__name__}) in {given!r}")
    members = [int(r) for r in given]
    outside = [r for r in members if not 0 <= r < world_size]
    if outside:
        raise ValueError(f"{who}: ranks must be in [0, {world_size}) (this communicator has {world_size} ranks), got "
                         f"{outside[0]} in {members}")
    twice = sorted({r for r in members if members.count(r) > 1})
    if twice:
        raise ValueError(f"{who}: ranks must be distinct, got {twice[0]} more than once in {members}")
    return members


def check_timeout(seconds) -> float:
    """seconds as a float; ValueError unless it is a positive number (a communicator's timeout)."""
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        value = float("nan")
    if not value > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {seconds!r}")
    return value


def encode_object(obj, what: str) -> bytes:
    """The bytes broadcast_object and all_gather_object send: obj as JSON, bytes in base64 (TypeError naming
    `what` for anything JSON cannot hold)."""
    def default(o):
        if isinstance(o, (bytes, bytearray)):
            return {"__bytes__": base64.b64encode(bytes(o)).decode()}
        if isinstance(o, np.generic):
            return o.item()
        raise TypeError(f"{what}: objects are sent as JSON (dict, list, str, int, float, bool, None, bytes); "
                        f"cannot send {type(o).__name__}")
    return json.dumps(obj, default=default).encode()


def decode_object(data: bytes):
    """The object encode_object's bytes hold (tuples come back as lists)."""
    def hook(d):
        return base64.b64decode(d["__bytes__"]) if set(d) == {"__bytes__"} else d
    return json.loads(data.decode(), object_hook=hook)
