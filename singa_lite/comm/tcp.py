"""The ``tcp`` backend: CPU tensors between processes on any hosts, over TCP sockets, with no MPI.

Bootstrap (tcp_mesh.py): every rank listens on a port, publishes ``host:port`` in the rendezvous store
(store.py), and connects a full mesh: rank j connects to every rank i < j and says who it is; rank i accepts them. The
listening address defaults to the one this rank's store connection uses (the interface that reaches
MASTER_ADDR), so the peers can reach it too; when that is a loopback address (MASTER_ADDR names this host),
the rank listens on every interface and publishes MASTER_ADDR. Each communicator made on a store gets its
own key prefix, counted in the store, so a long-lived store can serve several in turn.

Every collective starts with a header exchange over the mesh: each rank sends every other its call's
signature (operation, dtype, element count, root, op, call number). The ranks compare them before any data
moves, so a mismatched call (another size, dtype, op or collective) raises CollectiveMismatch (a ValueError) on
every rank naming what each rank passed, and the communicator stays usable. Small all-reduces (up to FUSE_BYTES)
carry their data in the header and are reduced locally in rank order (float16 and bfloat16 in float32, rounded once),
so they cost one exchange. Larger ones are a ring: reduce-scatter then all-gather, each rank sending and
receiving 2 (P - 1) / P of the tensor, reduced in place with numpy on views of the tensor's memory.

Sockets are non-blocking and driven by one ``poll`` loop per operation (tcp_peer.py), with the operation's
deadline: a peer that closes its connection or resets it (killed, crashed) fails the operation at once, naming
that rank and its address. A rank that fails (or aborts) writes the cause to the store and shuts its sockets,
so its peers fail promptly too and report that first cause rather than only "rank k went away".
"""
from __future__ import annotations

import atexit
import collections
import json
import os
import socket
import sys
import threading
import time
import weakref

import numpy as np

from .. import tensor
from . import auth, averaging
from ._arrays import array as _array, bf16_to_f32 as _bf16_to_f32, f32_to_bf16 as _f32_to_bf16
from .communicator import DEFAULT_TIMEOUT, DTYPES, REDUCE_OPS, CollectiveMismatch, CommError, Communicator
from .tcp_mesh import Mesh
from .tcp_peer import CODE, DTYPE_CODE, HEADER, KINDS, MAGIC, OP_CODE, P2P, Peer, PeerLost, Poller, as_bytes

FUSE_BYTES = 64 << 10  # all-reduces up to this size travel inside the header exchange
_UFUNCS = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}
_HALF = (tensor.float16, tensor.bfloat16)
REDUCE_CHUNK_BYTES = 1 << 20  # the ring reduces what it received in chunks of this size
REPORT_S = 1.0  # at most this long to write or read a failure report in the store


def _reduce_into(dst: np.ndarray, src: np.ndarray, op: str, bf16: bool) -> None:
    """dst = op(dst, src), elementwise, in dst's memory (bfloat16 as uint16 bits: computed in float32)."""
    ufunc = _UFUNCS[op]
    if bf16:
        dst[...] = _f32_to_bf16(ufunc(_bf16_to_f32(dst), _bf16_to_f32(src)))
    else:
        ufunc(dst, src, out=dst)


class TcpCommunicator(Communicator):
    """``world_size`` ranks connected by TCP, found through a rendezvous store (store.TcpStore, or anything
    with its set/get). rank, world_size, local_rank, local_size: this process's place in the job (the
    launcher's, e.g. torchrun's RANK / LOCAL_RANK). timeout: seconds for the connections and for each
    operation. host: the address the peers reach this rank at (default: the local address of this rank's
    store connection). prefix: the store keys' prefix (default: one per communicator made on that store).
    single_host: every rank runs on this host (the rendezvous knows; then the mesh listens on loopback only).
    credentials: the job's identity and key (default: the store's): every mesh connection proves it.
    """

    backend = "tcp"

    def __init__(self, store, rank: int, world_size: int, local_rank: int = 0, local_size: int = 1,
                 timeout: float = DEFAULT_TIMEOUT, host: str | None = None, prefix: str | None = None,
                 single_host: bool | None = None, credentials: auth.Credentials | None = None):
        for what, v in (("rank", rank), ("world_size", world_size), ("local_rank", local_rank),
                        ("local_size", local_size)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise TypeError(f"tcp communicator: {what} must be an int, got {type(v).__name__}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"tcp communicator: need 0 <= rank < world_size, got rank={rank}, "
                             f"world_size={world_size}")
        if local_size < 1 or not 0 <= local_rank < local_size:
            raise ValueError(f"tcp communicator: need 0 <= local_rank < local_size, got local_rank={local_rank}, "
                             f"local_size={local_size}")
        super().__init__(rank, world_size, local_rank, local_size, timeout)
        self._store = self.rendezvous_store = store
        self._host = host  # as given (None: found from the store connection); new_group() passes it on
        self._single_host = single_host
        self._credentials = credentials or getattr(store, "credentials", None) or auth.credentials(
            single_host=bool(single_host))
        self._splits = 0
        self._pid = os.getpid()
        if prefix is None:
            # Every rank counts itself in: the k-th communicator of the job (on this store) is the one whose
            # arrivals are k * world_size + 1 ... (k + 1) * world_size, as no rank can make the next one before
            # every rank joined this one. Its keys then never meet those of an earlier one.
            prefix = f"tcp{(store.add('tcp/joined', 1) - 1) // world_size}"
        self._prefix = prefix
        self._seq = 0
        self._stash = collections.defaultdict(collections.deque)  # (src, tag) -> messages received early
        self._aborted = None
        self._peers: dict[int, Peer] = {}  # (none until the mesh is made: a failed start leaves nothing to close)
        self._poller = Poller()
        self._peers = Mesh(store, prefix, rank, world_size, self.timeout, self._credentials).connect(host, single_host)
        for p in self._peers.values():
            p.sock.setblocking(False)
        self._poller = Poller(self._peers.values())
        _exits.watch(self)

    supports_groups = True
    keeps_store = True
    sleeps_while_waiting = True  # the poller waits in poll(); the kernel's socket buffers move the bytes

    def _new_group(self, ranks: list, timeout: float) -> "TcpCommunicator | None":
        """new_group's mesh: the members meet on this communicator's store under keys of their own. Its local
        ranks count the members on each host (by host name)."""
        hosts = self._agree_on_group(ranks, socket.gethostname())
        self._splits += 1
        if self.rank not in ranks:
            return None
        here = [r for r in ranks if hosts[r] == hosts[self.rank]]
        return TcpCommunicator(self._store, ranks.index(self.rank), len(ranks), here.index(self.rank), len(here),
                               timeout=timeout, host=self._host, prefix=f"{self._prefix}/split{self._splits}",
                               single_host=self._single_host, credentials=self._credentials)

    # ----- the poll loop
    def _pump(self, name: str, deadline: float) -> None:
        """Moves the queued and expected bytes of every peer (tcp_peer.Poller); CommError on a lost peer or at
        the deadline."""
        try:
            late = self._poller.pump(deadline)
        except PeerLost as e:
            raise self._lost(name, e.peer, e.what) from None
        if late:
            raise self._timed_out(name, late)

    def _timed_out(self, name: str, late) -> CommError:
        who = ", ".join(f"rank {p.rank} ({p.address})" for p in late) or "none"
        hosts = {}
        for p in late:
            hosts.setdefault(p.hostname, []).append(p.rank)
        where = (f", on host {next(iter(hosts))}" if len(hosts) == 1 else
                 ", on hosts " + ", ".join(f"{h} (rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, sorted(rs)))})"
                                          for h, rs in hosts.items()) if hosts else "")
        return self._fail(f"tcp {name} #{self._seq} (rank {self.rank} of {self.world_size}): not finished after "
                          f"{self.timeout:g} s; still waiting to exchange data with {who}{where}. Look at those ranks' "
                          f"output (is their host up and reachable from this one?), or raise the timeout (timeout= "
                          f"or SINGA_LITE_COMM_TIMEOUT)", report=True)

    def _lost(self, name: str, peer: Peer, what: str) -> CommError:
        if self._aborted is not None:
            return CommError(f"tcp communicator of rank {self.rank}: aborted: {self._aborted}")
        here = f"tcp {name} #{self._seq} (rank {self.rank} of {self.world_size})"
        ended = self._read_exit(peer.rank)
        if ended is not None:
            how, calls = ended
            cause = (f"rank {peer.rank} ({peer.address}, host {peer.hostname}) {_ENDS.get(how, _ENDS['exit'])} after "
                     f"{calls} collective call{'s' * (calls != 1)}, while this rank is in {name} #{self._seq}")
            hint = ("look at its output" if how == "exception" else
                    "did the ranks run different numbers of steps? Give every rank the same number of batches, or "
                    "train inside `with dist_opt.join():` (see DistOpt.join)")
            return self._fail(f"{here}: {cause}: {hint}", report=f"{cause}: {hint}")
        cause = self._read_report(peer.rank)
        if cause:
            return self._fail(f"{here}: {cause} (reported by rank {peer.rank}, which then left)", report=cause)
        cause = (f"rank {peer.rank} ({peer.address}, host {peer.hostname}) {what} without reporting a cause: it died "
                 f"(killed or crashed), or its host is unreachable")
        return self._fail(f"{here}: {cause}", report=cause)

    def _fail(self, message: str, report) -> CommError:
        """Makes the communicator unusable: the cause goes to the store (for the peers' errors), the sockets
        are shut so that peers still waiting on this rank fail now rather than at their timeout."""
        if report:
            self._write_report(message if report is True else report)
        self._shut()
        self._broken = CommError(message)
        return self._broken

    def _write_report(self, cause: str) -> None:
        _bounded(lambda: self._store.set(f"{self._prefix}/fail/{self.rank}", cause.encode()), REPORT_S)

    def _read_exit(self, r: int):
        """(how, calls) when rank r recorded its end (it exits or closes this communicator, see _ExitRecords),
        else None. The record is written before its connections close, so it is there by the time they do."""
        got = _bounded(lambda: self._store.get(f"{self._prefix}/exit/{r}", 0.0), REPORT_S)
        try:
            record = json.loads(got)
            return str(record["how"]), int(record["calls"])
        except (TypeError, ValueError, KeyError):
            return None

    def _record_exit(self, how: str) -> None:
        """Tells the store how this rank's part in the communicator ended (see _ExitRecords)."""
        if self._broken is None and not self.closed and self._peers:
            record = json.dumps({"how": how, "calls": self._seq}).encode()
            _bounded(lambda: self._store.set(f"{self._prefix}/exit/{self.rank}", record), REPORT_S)

    def _read_report(self, r: int) -> str:
        got = _bounded(lambda: self._store.get(f"{self._prefix}/fail/{r}", REPORT_S / 2), REPORT_S)
        return got.decode(errors="replace") if got else ""

    def _shut(self) -> None:
        for p in self._peers.values():
            try:
                p.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # ----- messages
    def _signature(self, kind, t=None, root=-1, op="") -> tuple:
        dtype = -1 if t is None else DTYPE_CODE[t.dtype]
        count = 0 if t is None else t.numel
        return (CODE[kind], dtype, root, OP_CODE.get(op, -1), self._seq, count)

    def _header_exchange(self, kind, t=None, root=-1, op="", payload: memoryview | None = None,
                         payload_to=None) -> dict:
        """Sends every peer this call's signature (with payload to all peers, or only to rank payload_to),
        receives theirs; CollectiveMismatch on every rank when they differ. Returns {rank: payload received}."""
        self._seq += 1
        deadline = time.monotonic() + self.timeout
        mine = self._signature(kind, t, root, op)
        sigs = {self.rank: mine}
        got = {}
        for p in self._peers.values():
            data = payload if payload is not None and payload_to in (None, p.rank) else None
            p.out.append(HEADER.pack(MAGIC, *mine[:4], mine[4], mine[5], 0 if data is None else len(data)))
            if data is not None and len(data):
                p.out.append(data)
            self._read_header(p, lambda p, h, sigs=sigs, got=got: self._on_collective(p, h, sigs, got))
        self._pump(kind, deadline)
        if any(s != mine for s in sigs.values()):
            raise CollectiveMismatch(self._mismatch(sigs))
        return got

    def _read_header(self, p: Peer, on_collective, again: bool = True) -> None:
        """Expects a message header from p: a collective's goes to on_collective(p, header); a point-to-point
        message is stashed for recv(), then (again=True) the next header is expected."""
        buf = memoryview(bytearray(HEADER.size))

        def parsed():
            magic, kind, dtype, root, op, seq, count, size = HEADER.unpack(buf)
            if magic != MAGIC or not 0 <= kind < len(KINDS) or size < 0:
                raise PeerLost(p, f"sent bytes out of step with the protocol ({bytes(buf[:8])!r})")
            if kind == P2P:  # a point-to-point message sent before this collective: kept for recv()
                data = memoryview(bytearray(size))

                def stash():
                    self._stash[(p.rank, op)].append(((dtype, count), data))
                    if again:
                        self._read_header(p, on_collective)
                p.expect(data, stash)
                return
            on_collective(p, (kind, dtype, root, op, seq, count, size))
        p.expect(buf, parsed)

    def _on_collective(self, p, h, sigs, got):
        sigs[p.rank] = h[:6]
        data = memoryview(bytearray(h[6]))
        got[p.rank] = data
        p.expect(data)

    def _mismatch(self, sigs: dict) -> str:
        def says(s) -> str:
            kind, dtype, root, op, seq, count = s
            args = [] if KINDS[kind] == "barrier" else [f"{count} {DTYPES[dtype].name}"]
            if root >= 0:
                args.append(f"root={root}")
            if op >= 0:
                args.append(f"op={REDUCE_OPS[op]}")
            return f"{KINDS[kind]}({', '.join(args)}) as its call #{seq}"
        return ("tcp: the ranks made different collective calls: "
                + "; ".join(f"rank {r} called {says(s)}" for r, s in sorted(sigs.items()))
                + ". Every rank must make the same collective calls, with the same sizes, dtypes, roots and ops, "
                  "in the same order")

    def _exchange(self, name: str, sends=(), recvs=()) -> None:
        """Data phase: sends [(rank, bytes)] and receives [(rank, writable bytes)] concurrently."""
        for r, data in sends:
            if len(data):
                self._peers[r].out.append(data)
        for r, view in recvs:
            self._peers[r].expect(view)
        self._pump(name, time.monotonic() + self.timeout)

    # ----- reductions
    def _ring_reduce_scatter(self, a: np.ndarray, bounds, op: str, bf16: bool, name: str) -> None:
        """Ring reduce-scatter over the flat array a, cut at bounds (P + 1 offsets): afterwards segment r of
        this rank holds the reduction over ranks of segment r. In place; P - 1 steps. Each step's incoming
        segment is reduced chunk by chunk as it arrives (REDUCE_CHUNK_BYTES: the chunk stays in cache, and the
        sender goes on filling the socket meanwhile)."""
        P, r = self.world_size, self.rank
        right, left = self._peers[(r + 1) % P], self._peers[(r - 1) % P]
        seg = [a[bounds[i]:bounds[i + 1]] for i in range(P)]
        step = max(1, REDUCE_CHUNK_BYTES // a.itemsize)
        tmp = np.empty(min(step, max(len(s) for s in seg)), a.dtype)

        def receive(into: np.ndarray, lo: int) -> None:
            hi = min(lo + step, len(into))
            buf = tmp[:hi - lo]

            def arrived():
                _reduce_into(into[lo:hi], buf, op, bf16)
                if hi < len(into):
                    receive(into, hi)
            left.expect(as_bytes(buf), arrived)

        with np.errstate(over="ignore", invalid="ignore"):
            for s in range(P - 1):
                out, into = seg[(r - s - 1) % P], seg[(r - s - 2) % P]
                if len(out):
                    right.out.append(as_bytes(out))
                if len(into):
                    receive(into, 0)
                self._pump(name, time.monotonic() + self.timeout)

    def _ring_all_gather(self, a: np.ndarray, bounds, name: str) -> None:
        """Ring all-gather: each rank starts with its segment r of a; afterwards every segment is full."""
        P, r = self.world_size, self.rank
        right, left = (r + 1) % P, (r - 1) % P
        seg = [a[bounds[i]:bounds[i + 1]] for i in range(P)]
        for s in range(P - 1):
            self._exchange(name, [(right, as_bytes(seg[(r - s) % P]))], [(left, as_bytes(seg[(r - s - 1) % P]))])

    def _reduce_rows(self, rows: np.ndarray, op: str, dtype) -> np.ndarray:
        """op over rows (one per rank, in rank order) -> one row: float16 / bfloat16 in float32 rounded once,
        avg divided at the end. The same bits on every rank."""
        if dtype == tensor.bfloat16:
            rows = _bf16_to_f32(rows)
        elif dtype == tensor.float16:
            rows = rows.astype(np.float32)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            out = _UFUNCS[op].reduce(rows, axis=0)
            if op == "avg":
                out = out / self.world_size
        if dtype == tensor.bfloat16:
            return _f32_to_bf16(out)
        return out.astype(rows.dtype if dtype not in _HALF else np.float16, copy=False)

    def _gathered_rows(self, a: np.ndarray, got: dict) -> np.ndarray:
        rows = np.empty((self.world_size, a.size), a.dtype)
        for q in range(self.world_size):
            rows[q] = a.reshape(-1) if q == self.rank else np.frombuffer(got[q], a.dtype)
        return rows

    def _before_sum(self, a: np.ndarray, dtype, op: str) -> None:
        """The ring's sum rounds at every step: an "avg" follows comm/averaging.py's rule."""
        if op == "avg":
            averaging.before_sum(a, self.world_size, dtype)

    def _finish_avg(self, a: np.ndarray, dtype, op: str) -> None:
        if op == "avg":
            averaging.after_sum(a, self.world_size, dtype)

    def _bounds(self, n: int, P: int | None = None) -> list:
        P = P or self.world_size
        return [(i * n) // P for i in range(P + 1)]

    # ----- hooks
    def _all_reduce(self, t, op):
        if self.world_size == 1:
            return
        a = _array(t).reshape(-1)
        if a.nbytes <= FUSE_BYTES:
            got = self._header_exchange("all_reduce", t, op=op, payload=as_bytes(a))
            a[...] = self._reduce_rows(self._gathered_rows(a, got), op, t.dtype)
            return
        self._header_exchange("all_reduce", t, op=op)
        self._before_sum(a, t.dtype, op)
        bounds = self._bounds(a.size)
        self._ring_reduce_scatter(a, bounds, "sum" if op == "avg" else op, t.dtype == tensor.bfloat16,
                                  "all_reduce")
        self._finish_avg(a[bounds[self.rank]:bounds[self.rank + 1]], t.dtype, op)
        self._ring_all_gather(a, bounds, "all_reduce")

    def _broadcast(self, t, root):
        a = _array(t).reshape(-1)
        small = a.nbytes <= FUSE_BYTES
        got = self._header_exchange("broadcast", t, root, payload=as_bytes(a) if small and self.rank == root
                                    else None)
        if self.rank == root or self.world_size == 1:
            if not small:
                self._exchange("broadcast", [(q, as_bytes(a)) for q in self._peers])
            return
        if small:
            a[...] = np.frombuffer(got[root], a.dtype)
        else:
            self._exchange("broadcast", recvs=[(root, as_bytes(a))])

    def _reduce(self, t, root, op):
        a = _array(t).reshape(-1)
        bf16 = t.dtype == tensor.bfloat16
        if a.nbytes <= FUSE_BYTES or self.world_size == 1:
            got = self._header_exchange("reduce", t, root, op, payload=as_bytes(a), payload_to=root)
            if self.rank == root:
                a[...] = self._reduce_rows(self._gathered_rows(a, got), op, t.dtype)
            return
        self._header_exchange("reduce", t, root, op)
        work = a if self.rank == root else a.copy()  # the other ranks' tensors stay as they were
        self._before_sum(work, t.dtype, op)
        bounds = self._bounds(work.size)
        self._ring_reduce_scatter(work, bounds, "sum" if op == "avg" else op, bf16, "reduce")
        mine = work[bounds[self.rank]:bounds[self.rank + 1]]
        self._finish_avg(mine, t.dtype, op)
        if self.rank == root:
            self._exchange("reduce", recvs=[(q, as_bytes(work[bounds[q]:bounds[q + 1]])) for q in self._peers])
        else:
            self._exchange("reduce", sends=[(root, as_bytes(mine))])

    def _all_gather(self, out, t):
        a, rows = _array(t).reshape(-1), _array(out).reshape(self.world_size, -1)
        self._header_exchange("all_gather", t)
        rows[self.rank] = a
        self._exchange("all_gather", [(q, as_bytes(a)) for q in self._peers],
                       [(q, as_bytes(rows[q])) for q in self._peers])

    def _reduce_scatter(self, out, t, op):
        a, o = _array(t).reshape(-1), _array(out).reshape(-1)
        self._header_exchange("reduce_scatter", t, op=op)
        work = a.copy()  # the input is the caller's tensor
        self._before_sum(work, t.dtype, op)
        bounds = self._bounds(work.size)
        if self.world_size > 1:
            self._ring_reduce_scatter(work, bounds, "sum" if op == "avg" else op, t.dtype == tensor.bfloat16,
                                      "reduce_scatter")
        mine = work[bounds[self.rank]:bounds[self.rank + 1]]
        self._finish_avg(mine, t.dtype, op)
        o[...] = mine

    def _gather(self, out, t, root):
        a = _array(t).reshape(-1)
        self._header_exchange("gather", t, root)
        if self.rank != root:
            self._exchange("gather", sends=[(root, as_bytes(a))])
            return
        rows = _array(out).reshape(self.world_size, -1)
        rows[self.rank] = a
        self._exchange("gather", recvs=[(q, as_bytes(rows[q])) for q in self._peers])

    def _scatter(self, out, t, root):
        o = _array(out).reshape(-1)
        self._header_exchange("scatter", out, root)
        if self.rank != root:
            self._exchange("scatter", recvs=[(root, as_bytes(o))])
            return
        rows = _array(t).reshape(self.world_size, -1)
        o[...] = rows[self.rank]
        self._exchange("scatter", sends=[(q, as_bytes(rows[q])) for q in self._peers])

    def _barrier(self):
        self._header_exchange("barrier")

    def _send(self, t, dst, tag):
        a = _array(t).reshape(-1)
        data = as_bytes(a)
        p = self._peers[dst]
        p.out.append(HEADER.pack(MAGIC, P2P, DTYPE_CODE[t.dtype], -1, tag, 0, t.numel, len(data)))
        p.out.append(data)
        self._pump("send", time.monotonic() + self.timeout)

    def _recv(self, t, src, tag):
        a = _array(t).reshape(-1)
        want = (DTYPE_CODE[t.dtype], t.numel)
        deadline = time.monotonic() + self.timeout
        p = self._peers[src]
        while not self._stash[(src, tag)]:
            def on_collective(p, h):
                raise ValueError(f"tcp recv(src={src}, tag={tag}) on rank {self.rank}: rank {src} started "
                                 f"{KINDS[h[0]]} (its call #{h[4]}) instead of sending: every rank must make the "
                                 f"same calls in the same order")
            self._read_header(p, on_collective, again=False)
            try:
                self._pump("recv", deadline)
            except ValueError as e:  # the stream from src is out of step now: the communicator is broken
                raise self._fail(str(e), report=True) from None
        sig, data = self._stash[(src, tag)].popleft()
        if sig != want:
            raise ValueError(f"tcp recv(src={src}, tag={tag}) on rank {self.rank}: rank {src} sent {sig[1]} "
                             f"{DTYPES[sig[0]].name}, this rank receives {want[1]} {DTYPES[want[0]].name}")
        a[...] = np.frombuffer(data, a.dtype)

    def _abort(self, reason):
        self._aborted = f"rank {self.rank} aborted: {reason}"
        self._write_report(self._aborted)
        self._shut()
        if self._broken is None:
            self._broken = CommError(f"tcp communicator of rank {self.rank}: {self._aborted}")

    def close(self) -> None:
        """Releases the sockets, also after a failure (the base class keeps a failed communicator as it is: MPI
        could block in its teardown; closing sockets cannot)."""
        self._record_exit("close")
        super().close()
        if not self.closed:
            self.closed = True
            self._close()

    def _close(self):
        self._poller.forget()
        for p in self._peers.values():
            try:
                if os.getpid() == self._pid:  # a forked child's copy must not cut its parent's connections
                    p.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            p.sock.close()
        self._peers = {}

    def _on_timeout(self, name: str) -> CommError:
        busy = ", ".join(f"rank {p.rank} ({p.address})" for p in self._peers.values() if p.busy())
        return CommError(f"tcp {name} (rank {self.rank} of {self.world_size}): not finished after {self.timeout:g} s"
                         + (f"; still waiting to exchange data with {busy}" if busy else ""))


_ENDS = {"exit": "exited normally (its script ended without an uncaught exception)",
         "close": "closed its communicator",
         "exception": "ended with an uncaught exception"}


class _ExitRecords:
    """How each rank's tcp communicators ended, for the peers' errors: a peer that sees a connection close
    reads the record and can say "rank 1 exited normally after 11 calls" (different numbers of steps) instead
    of "died". At exit (atexit) every live communicator records "exit", or "exception" after an uncaught
    exception (seen by a sys.excepthook wrapper); close() records "close". Communicators are held weakly."""

    def __init__(self):
        self._comms = weakref.WeakSet()
        self._installed = False
        self._uncaught = False

    def watch(self, comm) -> None:
        if not self._installed:
            self._installed = True
            atexit.register(self._at_exit)
            previous = sys.excepthook

            def hook(kind, value, tb):
                self._uncaught = True
                previous(kind, value, tb)
            sys.excepthook = hook
        self._comms.add(comm)

    def _at_exit(self) -> None:
        for comm in list(self._comms):
            if os.getpid() == comm._pid:
                comm._record_exit("exception" if self._uncaught else "exit")


_exits = _ExitRecords()


def _bounded(fn, seconds: float):
    """fn()'s result, or None when it failed or took longer than seconds (failure reports are best effort:
    the store may be gone with its rank)."""
    result = []

    def run():
        try:
            result.append(fn())
        except Exception:
            pass
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return result[0] if result else None


def create(store=None, rank=None, world_size=None, timeout: float = DEFAULT_TIMEOUT, holder=None, local_rank=None,
           local_size=None, **options) -> TcpCommunicator:
    """The tcp communicator ``dist.init(backend="tcp", store=..., rank=..., world_size=...)`` makes. The ranks
    meet through a rendezvous store (store.TcpStore): ``init_method="env"`` makes one from MASTER_ADDR /
    MASTER_PORT; a one-rank job without one gets a private store."""
    if holder is not None:
        raise ValueError("backend 'tcp' meets its peers through a rendezvous store (store=TcpStore(...)), not a "
                         "NcclIdHolder; for processes started by multiprocessing with a holder use backend 'shm'")
    if store is None:
        if world_size not in (None, 1):
            raise ValueError(f"backend 'tcp' with world_size={world_size} needs a rendezvous store: use "
                             f"dist.init(init_method='env') with MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE set "
                             f"(as torchrun and Slurm do), or pass store=TcpStore(...), rank= and world_size=")
        from .store import TcpStore
        store, rank, world_size = TcpStore("127.0.0.1", 0, 1, is_server=True, timeout=timeout), 0, 1
    if rank is None or world_size is None:
        raise ValueError("backend 'tcp' needs rank= and world_size= with its store")
    return TcpCommunicator(store, rank, world_size, 0 if local_rank is None else local_rank,
                           1 if local_size is None else local_size, timeout=timeout, **options)
