"""The tcp backend's connections: one peer's message framing and buffers, and the poll loop that drives them.

Every message on a mesh connection starts with HEADER (magic, kind, dtype, root, op or tag, call number, element
count, payload bytes). A Peer holds what is queued to send to one rank and the buffer being filled from it (with
what to do once it is full); a Poller moves the bytes of a set of peers, non-blocking, until none has anything
queued or expected, or the deadline passes. Losing a peer (it closed or reset its connection) raises PeerLost,
which the communicator (tcp.py) turns into an error naming that rank.
"""
from __future__ import annotations

import collections
import select
import socket
import struct
import time

import numpy as np

from . import tls
from .communicator import DTYPES, REDUCE_OPS

HEADER = struct.Struct("!2sBbiiqqq")
MAGIC = b"ST"
KINDS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather", "scatter", "barrier",
         "send")
CODE = {k: i for i, k in enumerate(KINDS)}
P2P = CODE["send"]  # a point-to-point message (send / recv); every other kind is a collective's header
DTYPE_CODE = {d: i for i, d in enumerate(DTYPES)}
OP_CODE = {o: i for i, o in enumerate(REDUCE_OPS)}
RECV_CHUNK = 4 << 20  # at most this many bytes per recv_into
IOV_MAX = 64  # buffers per sendmsg


class PeerLost(Exception):
    """The connection to `peer` closed or broke; `what` says how."""

    def __init__(self, peer, what: str):
        super().__init__(what)
        self.peer, self.what = peer, what


class Peer:
    """One connection: what is queued to send, and the buffer being filled (with what to do once full)."""

    def __init__(self, rank: int, address: str, sock: socket.socket, hostname: str = "?"):
        self.rank, self.address, self.sock, self.hostname = rank, address, sock, hostname
        self.fd = sock.fileno()
        self.tls = tls.is_tls(sock)  # no sendmsg; decrypted bytes may wait inside it (pending)
        self.retry = tls.retryable(sock)  # would-block, in TLS's words too
        self.out: collections.deque = collections.deque()
        self.want = None  # memoryview being received into
        self.got = 0
        self.on_full = None
        self.mask = 0  # events registered with the poller

    def expect(self, view: memoryview, on_full=None) -> None:
        self.want, self.got, self.on_full = view, 0, on_full
        if len(view) == 0:
            self._filled()

    def _filled(self):
        callback, self.want, self.on_full = self.on_full, None, None
        if callback is not None:
            callback()

    def buffered(self) -> bool:
        """Bytes already decrypted inside a TLS socket: poll() would not report them."""
        return self.tls and self.want is not None and self.sock.pending() > 0

    def busy(self) -> bool:
        return self.want is not None or bool(self.out)

    def read(self) -> None:
        while self.want is not None:
            try:
                k = self.sock.recv_into(self.want[self.got:self.got + RECV_CHUNK])
            except self.retry:
                return
            except OSError as e:
                raise PeerLost(self, f"broke the connection ({e.strerror or e})") from None
            if k == 0:
                raise PeerLost(self, "closed its connection")
            self.got += k
            if self.got == len(self.want):
                self._filled()

    def write(self) -> None:
        while self.out:
            try:  # everything queued in one system call (a header and its data: one TCP segment when small)
                n = self.sock.sendmsg(list(self.out)[:IOV_MAX]) if len(self.out) > 1 and not self.tls else \
                    self.sock.send(self.out[0])
            except self.retry:
                return
            except OSError as e:
                raise PeerLost(self, f"broke the connection ({e.strerror or e})") from None
            while self.out and (n or not len(self.out[0])):  # empty buffers go too
                head = self.out[0]
                if n >= len(head):
                    n -= len(head)
                    self.out.popleft()
                else:
                    self.out[0] = head[n:]
                    return  # the socket's buffer is full


class Poller:
    """The poll loop over a communicator's peers (non-blocking sockets)."""

    def __init__(self, peers=()):
        self.peers = list(peers)
        self._by_fd = {p.fd: p for p in self.peers}
        self._poll = select.poll()

    def pump(self, deadline: float) -> list:
        """Moves bytes until no peer has anything queued or expected: [] then, else the peers still busy when
        the deadline passed. PeerLost on a lost peer. Only busy peers are polled: an idle one that has gone is
        noticed when it is next needed."""
        peers = self.peers
        for p in peers:  # what the sockets take or hold right now, before any poll (most small messages)
            if p.out:
                p.write()
            if p.want is not None:
                p.read()
        while True:
            busy = False
            for p in peers:
                mask = (select.POLLIN if p.want is not None else 0) | (select.POLLOUT if p.out else 0)
                if mask:
                    busy = True
                if mask != p.mask:
                    if not p.mask:
                        self._poll.register(p.fd, mask)
                    elif mask:
                        self._poll.modify(p.fd, mask)
                    else:
                        self._poll.unregister(p.fd)
                    p.mask = mask
            if not busy:
                return []
            ready = [p for p in peers if p.buffered()]
            if ready:
                for p in ready:
                    p.read()
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return [p for p in peers if p.busy()]
            for fd, ev in self._poll.poll(min(left, 1.0) * 1000 + 1):
                p = self._by_fd[fd]
                if p.out and ev & (select.POLLOUT | select.POLLERR | select.POLLHUP):
                    p.write()
                if p.want is not None and ev & (select.POLLIN | select.POLLERR | select.POLLHUP):
                    p.read()

    def forget(self) -> None:
        """Stops polling every peer (before their sockets close: a closed descriptor's number is reused)."""
        for p in self.peers:
            try:
                self._poll.unregister(p.fd)
            except (KeyError, ValueError, OSError):
                pass
        self.peers, self._by_fd = [], {}
        self._poll = select.poll()


def as_bytes(a: np.ndarray) -> memoryview:
    """The bytes of a contiguous array, writable in place."""
    return memoryview(a.reshape(-1).view(np.uint8)) if a.size else memoryview(bytearray(0))
