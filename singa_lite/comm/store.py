"""A small TCP key-value store for rendezvous without MPI (``dist.init(init_method="env")``), in the style of
torch's TCPStore, in the standard library only.

Rank 0 serves it at MASTER_ADDR:MASTER_PORT from a daemon thread; every rank (rank 0 too) is a client. The
ranks publish what the others need (their listening address, NCCL's unique id) with ``set`` and read it with
``get``, which blocks until the key exists. Every call has a deadline and every failure is a ``CommError``
saying what to check: nothing listening (wrong MASTER_PORT, rank 0 not started, a firewall), a peer that is
not a store (another service on that port), a rank that never arrived (``get`` of ``<prefix>/<rank>``, and
``barrier``, name it).

Who may connect: every connection begins with the job's handshake (comm/auth.py): both sides prove they hold
the job's key and carry the same job id, and a client claims its rank. Another job's rank hears "another job
(id X) uses this port"; a stranger is refused before it can read or write a key; a second process claiming a
rank that is taken is refused, naming both. Rank 0 listens only where MASTER_ADDR points on its host
(loopback when that is a loopback address).

Bounded against hostile or broken peers: a connection costs at most a few KiB and auth.HANDSHAKE_S seconds
before it has proved the key, and at most MAX_HANDSHAKES wait at once; a message is read as its bytes arrive
(a header announcing 64 MiB reserves nothing); stored keys and bytes have a quota (QUOTA_BYTES, MAX_KEYS);
every number read from the wire is checked (finite timeouts, no integer overflow); ``accept`` survives running
out of file descriptors (it backs off, says so once, and goes on).

Wire format after the handshake: every message is a 12-byte header (magic ``SLKV``, protocol version,
operation or status, payload length) and a payload of length-prefixed fields. Keys and values are bounded
(MAX_KEY_BYTES, MAX_VALUE_BYTES); one connection's failure never stops the server.
"""
from __future__ import annotations

import collections
import errno
import ipaddress
import math
import os
import re
import socket
import struct
import sys
import threading
import time

from . import auth
from .communicator import CommError

MAGIC = b"SLKV"
VERSION = 2  # 2: after the job handshake of comm/auth.py
_HEADER = struct.Struct("!4sBBHI")  # magic, version, op/status, reserved, payload length
_FIELD = struct.Struct("!I")
DOUBLE = struct.Struct("!d")
_INT = struct.Struct("!q")
MAX_KEY_BYTES = 4096
MAX_VALUE_BYTES = 64 << 20
MAX_PAYLOAD_BYTES = MAX_VALUE_BYTES + 64 * MAX_KEY_BYTES  # a set's value and key, or a wait's keys
MAX_WAIT_KEYS = 65536
MAX_TIMEOUT_S = 1e7  # about 115 days: the longest wait a call may ask for
QUOTA_BYTES = 1 << 30  # keys and values held at once
MAX_KEYS = 1 << 20
MAX_HANDSHAKES = 128  # connections that have not proved the key yet, at once; more are closed at once
REPLY_GRACE_S = 10.0  # a blocking get/wait's reply may come this long after its own timeout
_RETRY_MAX_S = 1.0  # longest pause between two connection attempts
_RECV_CHUNK = 1 << 20
_INT64 = (-(1 << 63), (1 << 63) - 1)
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

# The wire protocol: a message is a header (magic, version, code, reserved, payload length) and a payload of
# length-prefixed fields (pack_message, read_message_header, split_fields); a request's code is an operation,
# a reply's a status. Public for the tests that speak it by hand.
# operations (requests)
OP_SET, OP_GET, OP_ADD, OP_WAIT, OP_DELETE, OP_DELETE_PREFIX, OP_KEYS = 2, 3, 4, 5, 6, 7, 8
MAX_LISTED_KEYS = 10000  # the most names one keys() reply carries
# statuses (replies)
STATUS_OK, STATUS_TIMEOUT, STATUS_ERROR = 100, 101, 102
_RANK_KEY = re.compile(r"^(.*)/(\d+)$")


class _Closed(Exception):
    """The peer closed the connection (EOF) in the middle of, or before, a message."""


def pack_message(code: int, fields=()) -> bytes:
    body = b"".join(_FIELD.pack(len(f)) + bytes(f) for f in fields)
    return _HEADER.pack(MAGIC, VERSION, code, 0, len(body)) + body


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """n bytes, gathered as they arrive: memory grows with what the peer really sent, not with what its
    header announced."""
    parts, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, _RECV_CHUNK))
        if not chunk:
            raise _Closed()
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def read_message_header(sock: socket.socket) -> tuple[int, int, int]:
    """(version, code, payload length); ValueError when the bytes are not a store message."""
    magic, version, code, _, length = _HEADER.unpack(recv_exact(sock, _HEADER.size))
    if magic != MAGIC:
        raise ValueError(f"not a singa_lite store message (first bytes {magic!r})")
    if length > MAX_PAYLOAD_BYTES:
        raise ValueError(f"message of {length} bytes is over the limit of {MAX_PAYLOAD_BYTES}")
    return version, code, length


def split_fields(payload: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(payload):
        if at + _FIELD.size > len(payload):
            raise ValueError("truncated field length")
        (n,) = _FIELD.unpack_from(payload, at)
        at += _FIELD.size
        if at + n > len(payload):
            raise ValueError("field longer than its message")
        out.append(payload[at:at + n])
        at += n
    return out


def _key(key, what: str) -> bytes:
    if not isinstance(key, str):
        raise TypeError(f"TcpStore.{what}: key must be a str, got {type(key).__name__}")
    data = key.encode()
    if not data or len(data) > MAX_KEY_BYTES:
        raise ValueError(f"TcpStore.{what}: key must be 1 to {MAX_KEY_BYTES} bytes of UTF-8, got {len(data)}")
    return data


def _missing_rank_hint(keys) -> str:
    """For keys of the form <prefix>/<rank>: which ranks never published them."""
    ranks = [m.group(2) for m in (_RANK_KEY.match(k) for k in keys) if m]
    if not ranks:
        return ""
    return (f"; rank{'s' if len(ranks) > 1 else ''} {', '.join(ranks)} never arrived: check that every rank "
            f"started, with the same WORLD_SIZE, MASTER_ADDR and MASTER_PORT, and look at their output")


def check_timeout(value, what: str) -> float:
    """A wait's length in seconds: finite, from 0 to MAX_TIMEOUT_S; ValueError otherwise."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_TIMEOUT_S):
        raise ValueError(f"{what}: timeout must be a finite number of seconds from 0 to {MAX_TIMEOUT_S:g}, "
                         f"got {value!r}")
    return seconds


def is_loopback(host: str, by_name: bool = True) -> bool:
    """Whether `host` means this host's loopback interface: a loopback address, ``localhost``, or (by_name) a
    name that resolves only to loopback addresses here."""
    if host.strip("[]").lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0]).is_loopback
    except ValueError:
        if not by_name:
            return False
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


class _Server:
    """The store's data and the threads serving it (one per connection: a job has few ranks)."""

    def __init__(self, listener: socket.socket, world_size: int, credentials: auth.Credentials, generation: int = 0):
        self._listener = listener
        self._world_size = world_size
        self._generation = generation
        self._credentials = credentials
        self._data: dict[bytes, bytes] = {}
        self._bytes = 0  # of keys and values held
        self._changed = threading.Condition()
        self._conns: set[socket.socket] = set()
        self._claims: dict[int, tuple] = {}  # rank -> (host, pid) of the process that claimed it
        self._lock = threading.Lock()  # guards _conns and _claims
        self._handshakes = threading.BoundedSemaphore(MAX_HANDSHAKES)
        self.refused = collections.deque(maxlen=5)  # why the last peers that spoke the protocol were refused
        self._stopped = False
        self._thread = threading.Thread(target=self._accept_loop, name="singa_lite-store", daemon=True)
        self._thread.start()

    def _accept_loop(self):
        pause, said = 0.05, False
        while not self._stopped:
            try:
                conn, _ = self._listener.accept()
            except OSError as e:
                if self._stopped or e.errno in (errno.EBADF, errno.EINVAL):  # closed by stop()
                    return
                if e.errno in _OUT_OF_DESCRIPTORS:  # the connection waits in the backlog meanwhile
                    if not said:
                        said = True
                        print(f"singa_lite: rendezvous store: cannot accept a connection ({e.strerror}); waiting for "
                              f"file descriptors to be freed (raise `ulimit -n`?)", file=sys.stderr, flush=True)
                    time.sleep(pause)
                    pause = min(pause * 2, 1.0)
                continue  # ECONNABORTED and the like: that client gave up
            pause = 0.05
            if not self._handshakes.acquire(blocking=False):  # a flood of connections that prove nothing
                conn.close()
                continue
            with self._lock:
                if self._stopped:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="singa_lite-store-conn", daemon=True).start()

    def _serve(self, conn: socket.socket):
        try:
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self._credentials.tls is not None:
                    wrapped = self._encrypted(conn)
                    if wrapped is None:
                        return
                    conn = wrapped
                peer = auth.serve(conn, self._credentials, "store", admit=self._admit,
                                  extra={"store": VERSION, "world": self._world_size,
                                         "generation": self._generation}, on_refuse=self.refused.append)
            finally:
                self._handshakes.release()
            if peer is None:
                return
            conn.settimeout(None)  # a client may stay quiet for long between calls
            while not self._stopped:
                version, code, length = read_message_header(conn)
                if version != VERSION:
                    return
                reply = self._handle(code, split_fields(recv_exact(conn, length)))
                conn.sendall(reply)
        except Exception:  # noqa: BLE001 -- that client is gone or broken: drop it, serve the others
            pass
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _encrypted(self, conn: socket.socket):
        """The TLS side of an accepted connection (within the handshake's time), tracked in its place."""
        start = time.monotonic()
        wrapped = auth.accept_tls(conn, self._credentials)
        with self._lock:
            self._conns.discard(conn)
            if wrapped is not None:
                self._conns.add(wrapped)
        if wrapped is None:
            conn.close()
            return None
        wrapped.settimeout(max(auth.HANDSHAKE_S - (time.monotonic() - start), 0.01))
        return wrapped

    def _admit(self, hello: dict) -> str | None:
        """Whether an authenticated client's claim stands: the same store protocol and world size, and a rank
        no other process holds."""
        store, world, rank = hello.get("store"), hello.get("world"), hello.get("rank")
        if store != VERSION:
            return (f"this store speaks protocol {VERSION}, the client {store!r}: every rank must run the same "
                    f"singa_lite version")
        if world is not None and world != self._world_size:
            return (f"this job has WORLD_SIZE={self._world_size} (rank 0's), the client was started with "
                    f"WORLD_SIZE={world!r}: give every rank the same WORLD_SIZE")
        theirs = hello.get("generation", 0)
        if theirs != self._generation:
            which = "an earlier" if type(theirs) is int and theirs < self._generation else "another"
            return (f"this store serves generation {self._generation} of the job (restarts so far), the client "
                    f"is of generation {theirs!r}: a rank of {which} start of the job; only the ranks its "
                    f"launcher started last may join")
        if rank is None:
            return None
        host, pid = hello.get("host"), hello.get("pid")
        if not (type(rank) is int and 0 <= rank < self._world_size and isinstance(host, str) and len(host) <= 256
                and type(pid) is int):
            return f"a claim must name a rank from 0 to {self._world_size - 1}, a host and a pid"
        with self._lock:
            held = self._claims.setdefault(rank, (host, pid))
        if held != (host, pid):
            return (f"rank {rank} is taken: pid {held[1]} on host {held[0]} joined as rank {rank} first, and this "
                    f"process (pid {pid} on host {host}) says it is rank {rank} too: two processes were given "
                    f"the same RANK (or two jobs share MASTER_PORT)")
        return None

    def _handle(self, code: int, f: list[bytes]) -> bytes:
        try:
            if code == OP_SET and len(f) == 2:
                return self._set(f[0], f[1])
            if code == OP_GET and len(f) == 2:
                timeout = _wire_timeout(f[1])
                with self._changed:
                    if not self._changed.wait_for(lambda: f[0] in self._data or self._stopped, timeout):
                        return pack_message(STATUS_TIMEOUT)
                    if f[0] not in self._data:
                        return pack_message(STATUS_ERROR, [b"the store is closing"])
                    return pack_message(STATUS_OK, [self._data[f[0]]])
            if code == OP_ADD and len(f) == 2:
                (amount,) = _INT.unpack(f[1])
                with self._changed:
                    try:
                        value = int(self._data.get(f[0], b"0")) + amount
                    except ValueError:
                        return pack_message(STATUS_ERROR, [b"add on a key whose value is not an integer"])
                    if not _INT64[0] <= value <= _INT64[1]:
                        return pack_message(STATUS_ERROR, [b"add would overflow a 64-bit integer"])
                reply = self._set(f[0], str(value).encode())
                ok = reply[4:6] == pack_message(STATUS_OK)[4:6]
                return pack_message(STATUS_OK, [_INT.pack(value)]) if ok else reply
            if code == OP_WAIT and f and len(f) <= MAX_WAIT_KEYS + 1:
                timeout = _wire_timeout(f[0])
                keys = f[1:]
                with self._changed:
                    done = self._changed.wait_for(lambda: all(k in self._data for k in keys) or self._stopped,
                                                  timeout)
                    missing = [k for k in keys if k not in self._data]
                return pack_message(STATUS_OK if done and not missing else STATUS_TIMEOUT, missing)
            if code == OP_DELETE and len(f) == 1:
                with self._changed:
                    old = self._data.pop(f[0], None)
                    if old is not None:
                        self._bytes -= len(f[0]) + len(old)
                return pack_message(STATUS_OK, [b"1" if old is not None else b"0"])
            if code == OP_DELETE_PREFIX and len(f) == 1 and f[0]:
                with self._changed:
                    doomed = [k for k in self._data if k.startswith(f[0])]
                    for k in doomed:
                        self._bytes -= len(k) + len(self._data.pop(k))
                return pack_message(STATUS_OK, [_INT.pack(len(doomed))])
            if code == OP_KEYS and len(f) == 1:
                with self._changed:
                    names = sorted(k for k in self._data if k.startswith(f[0]))
                return pack_message(STATUS_OK, [_INT.pack(len(names))] + names[:MAX_LISTED_KEYS])
        except (struct.error, ValueError) as e:
            return pack_message(STATUS_ERROR, [f"malformed request (operation {code}): {e}".encode()])
        return pack_message(STATUS_ERROR, [f"malformed request (operation {code}, {len(f)} fields)".encode()])

    def _set(self, key: bytes, value: bytes) -> bytes:
        if not 0 < len(key) <= MAX_KEY_BYTES or len(value) > MAX_VALUE_BYTES:
            return pack_message(STATUS_ERROR, [b"key or value over the store's limits"])
        with self._changed:
            old = self._data.get(key)
            grown = len(value) - (len(old) if old is not None else -len(key))
            if self._bytes + grown > QUOTA_BYTES or (old is None and len(self._data) >= MAX_KEYS):
                full = f"the store is full (quota {QUOTA_BYTES} bytes in at most {MAX_KEYS} keys): it is for small " \
                       f"rendezvous data"
                return pack_message(STATUS_ERROR, [full.encode()])
            self._data[key] = value
            self._bytes += grown
            self._changed.notify_all()
        return pack_message(STATUS_OK)

    def stop(self, shutdown: bool = True):
        """Stops serving. shutdown=False (a forked child's copy): only close this process's descriptors, as
        shutting the connections down would cut them in the process that really serves them."""
        self._stopped = True
        with self._changed:
            self._changed.notify_all()
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
        for c in conns:
            try:
                if shutdown:
                    c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()


def _wire_timeout(field: bytes) -> float:
    (value,) = DOUBLE.unpack(field)
    if not (math.isfinite(value) and 0 <= value <= MAX_TIMEOUT_S):
        raise ValueError(f"timeout {value!r} is not a finite number of seconds from 0 to {MAX_TIMEOUT_S:g}")
    return value


class TcpStore:
    """A key-value store shared by ``world_size`` processes over TCP.

    host, port: the server's address (MASTER_ADDR, MASTER_PORT). is_server: True on exactly one process
    (rank 0), which serves it at ``port`` (0: a free port, then read ``.port`` and pass it to the others) on the
    address `host` names on this host: loopback when `host` is a loopback address or name; every interface when
    `host` is not an address of this host (a Kubernetes service name: how the others reach rank 0, which need
    not be one of its own). ``listen_host`` chooses the address ("" for every interface). Every process, the
    server's included, then connects as a client, retrying until ``timeout`` seconds (rank 0 may start last);
    after that, CommError says which address was tried and what to check.

    credentials: the job's identity and key (auth.Credentials; default: from this process's environment, the
    key required when `host` is a loopback address). rank: the rank this client claims (None: no claim); host
    and pid go with it, so a second process claiming the same rank is refused, naming both. generation: the
    launcher's restart count (comm/env.py's generation()); the server admits only clients of its own.

    Values are bytes. ``get`` and ``wait`` block until their keys exist (at most their timeout, default the
    store's); ``add`` is an atomic integer counter (its value reads back with ``get`` as ASCII digits).
    Thread-safe: calls from several threads are serialised on the one connection.
    """

    def __init__(self, host: str, port: int, world_size: int, is_server: bool, timeout: float = 300.0,
                 listen_host: str | None = None, credentials: auth.Credentials | None = None,
                 rank: int | None = None, generation: int = 0):
        if not isinstance(host, str) or not host:
            raise ValueError(f"TcpStore: host must be a host name or address (MASTER_ADDR), got {host!r}")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < 65536:
            raise ValueError(f"TcpStore: port must be an int in [0, 65536) (MASTER_PORT), got {port!r}")
        if port == 0 and not is_server:
            raise ValueError("TcpStore: a client needs the server's port; port 0 (a free port) is for the server")
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ValueError(f"TcpStore: world_size must be a positive int, got {world_size!r}")
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size):
            raise ValueError(f"TcpStore: rank must be None or an int in [0, {world_size}), got {rank!r}")
        if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
            raise ValueError(f"TcpStore: generation must be an int >= 0 (the launcher's restart count), got "
                             f"{generation!r}")
        self.generation = generation
        timeout = check_timeout(timeout, "TcpStore")
        if timeout == 0:
            raise ValueError("TcpStore: timeout must be a positive number of seconds, got 0")
        self.host, self.world_size, self.timeout = host, world_size, timeout
        self.is_server = bool(is_server)
        self.credentials = credentials if credentials is not None else auth.credentials(single_host=is_loopback(host))
        self.rank = rank
        self._server = None
        self._sock = None
        self._lock = threading.Lock()
        self._pid = os.getpid()
        if is_server:
            self._server = _Server(self._listen(listen_host, port), world_size, self.credentials, generation)
            self.port = self._server._listener.getsockname()[1]
        else:
            self.port = port
        try:
            self._sock = self._connect()
        except BaseException:
            self.close()
            raise

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def client_address(self) -> tuple[str, int] | None:
        """(local address, socket family) of this client's connection to the server: an address of the
        interface that reaches the store's host (the tcp mesh listens there). None while not connected."""
        sock = self._sock
        return None if sock is None else (sock.getsockname()[0], sock.family)

    def refusals(self) -> list[str]:
        """On the server (rank 0): why the last few peers that spoke the protocol were refused, for the errors
        of a rank that waits for a missing one ("rank 1 never arrived; meanwhile the store refused ...")."""
        return list(self._server.refused) if self._server is not None else []

    @property
    def listen_address(self) -> str | None:
        """Where the server listens (on rank 0), as host:port."""
        if self._server is None:
            return None
        name = self._server._listener.getsockname()
        return f"{name[0]}:{name[1]}"

    def _listen(self, listen_host, port) -> socket.socket:
        for family, address in self._bind_candidates(listen_host, port):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
                sock.listen(256)
                return sock
            except OSError as e:
                sock.close()
                if e.errno == errno.EADDRNOTAVAIL:  # not an address of this host: try the next
                    continue
                raise CommError(f"TcpStore: rank 0 cannot listen on port {port} ({e}): is another job or a "
                                f"previous run still using it? Choose another MASTER_PORT") from None
        raise CommError(f"TcpStore: rank 0 cannot listen for {self.host}:{port}: no address to bind")

    def _bind_candidates(self, listen_host, port) -> list:
        """Where to listen, in order: listen_host when given; else the addresses `host` names that are this
        host's (the first that binds wins); else every interface, for a name that is not ours (a service's)."""
        if listen_host is not None:
            wildcard = listen_host in ("", "0.0.0.0", "::")
            name = listen_host or ("::" if ":" in self.host else "0.0.0.0")
            family = socket.AF_INET6 if ":" in name else socket.AF_INET
            return [(family, (name, port))] if wildcard or ":" in name or name[0].isdigit() else \
                [(i[0], i[4]) for i in _resolve(name, port)] or [(family, (name, port))]
        found = [(i[0], i[4]) for i in _resolve(self.host, port)]
        family = found[0][0] if found else (socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        return found + [(family, ("::" if family == socket.AF_INET6 else "0.0.0.0", port))]

    # ----- connection
    def _connect(self) -> socket.socket:
        start = time.monotonic()
        deadline = start + self.timeout
        pause, last = 0.01, None
        while True:
            left = deadline - time.monotonic()
            try:
                sock = socket.create_connection((self.host, self.port), timeout=max(min(left, 5.0), 0.01))
            except OSError as e:  # refused (nothing listening yet), unreachable, a name not resolving yet
                last = e
                if time.monotonic() + pause >= deadline:
                    raise CommError(
                        f"TcpStore: could not connect to the rendezvous store at {self.address} for "
                        f"{time.monotonic() - start:.1f} s (last error: {last}). Check that rank 0 started, "
                        f"that MASTER_ADDR and MASTER_PORT are the same on every rank and name rank 0's "
                        f"host, and that no firewall blocks the port") from None
                time.sleep(pause)
                pause = min(pause * 2, _RETRY_MAX_S)
                continue
            try:
                limit = min(max(deadline - time.monotonic(), 1.0), 30.0)
                if self.credentials.tls is not None:
                    sock = self.credentials.tls.connect(sock, limit, f"the rendezvous store at {self.address}")
                self._handshake(sock, limit)
            except _Busy:  # the server closed it before a word: it is flooded, or still starting; try again
                sock.close()
                if time.monotonic() + pause >= deadline:
                    raise CommError(f"TcpStore: the rendezvous store at {self.address} kept closing the "
                                    f"connection before the handshake for {time.monotonic() - start:.1f} s (is "
                                    f"it flooded with connections?)") from None
                time.sleep(pause)
                pause = min(pause * 2, _RETRY_MAX_S)
                continue
            except BaseException:
                sock.close()
                raise
            return sock

    def _handshake(self, sock: socket.socket, limit: float) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        claim = {"store": VERSION, "world": self.world_size, "rank": self.rank, "generation": self.generation}
        if self.rank is not None:
            claim.update(host=socket.gethostname(), pid=os.getpid())
        where = f"the rendezvous store at {self.address}"
        try:
            auth.client(sock, self.credentials, "store", claim, timeout=limit, where=where)
        except auth.Refused as e:
            raise CommError(f"TcpStore: {e}") from None
        except auth.Dropped:
            raise _Busy() from None
        except CommError as e:
            raise CommError(f"TcpStore: the peer at {self.address} is not a singa_lite rendezvous store ({e}); is "
                            f"MASTER_PORT the port of another service, or of another job?") from None
        sock.settimeout(None)

    def _call(self, code: int, fields, what: str, wait_s: float = 0.0) -> tuple[int, list[bytes]]:
        """One request and its reply. wait_s: how long the server may block on it (get, wait)."""
        message = pack_message(code, fields)
        if len(message) > MAX_PAYLOAD_BYTES + _HEADER.size:
            raise ValueError(f"TcpStore.{what}: {len(message)} bytes is over the store's limit of "
                             f"{MAX_PAYLOAD_BYTES}; the store is for small rendezvous data")
        with self._lock:
            if self._sock is None:
                raise CommError(f"TcpStore.{what}: the store client was closed")
            limit = wait_s + (REPLY_GRACE_S if wait_s else self.timeout)
            try:
                self._sock.settimeout(limit)
                self._sock.sendall(message)
                _, status, length = read_message_header(self._sock)
                return status, split_fields(recv_exact(self._sock, length))
            except socket.timeout:
                error = f"no reply in {limit:g} s: rank 0, which serves the store, may be stuck or gone"
            except _Closed:
                error = "the server closed the connection: rank 0, which serves the store, ended or crashed"
            except (OSError, ValueError) as e:
                error = f"{e}: rank 0, which serves the store, may have ended or crashed"
            # the connection is out of step with the server now: later calls must not read this reply
            self._sock.close()
            self._sock = None
        raise CommError(f"TcpStore.{what} at {self.address}: {error}")

    @staticmethod
    def _check_reply(status, fields, what: str) -> None:
        if status == STATUS_ERROR:
            raise CommError(f"TcpStore.{what}: the server says: {b''.join(fields).decode(errors='replace')}")

    def _limit(self, timeout) -> float:
        return self.timeout if timeout is None else check_timeout(timeout, "TcpStore")

    # ----- the API
    def set(self, key: str, value: bytes) -> None:
        """Stores value (bytes) under key, waking whoever waits for it."""
        if isinstance(value, str):
            raise TypeError("TcpStore.set: value must be bytes, got str; encode it (value.encode())")
        value = bytes(value)
        if len(value) > MAX_VALUE_BYTES:
            raise ValueError(f"TcpStore.set: a value of {len(value)} bytes is over the limit of {MAX_VALUE_BYTES}")
        status, fields = self._call(OP_SET, [_key(key, "set"), value], "set")
        self._check_reply(status, fields, "set")

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value under key, waiting until some process sets it (at most timeout seconds, default the
        store's); CommError naming the key (and, for a key <prefix>/<rank>, that rank) after that."""
        limit = self._limit(timeout)
        status, fields = self._call(OP_GET, [_key(key, "get"), DOUBLE.pack(limit)], "get", wait_s=limit)
        if status == STATUS_TIMEOUT:
            raise CommError(f"TcpStore.get at {self.address}: key {key!r} was not set within {limit:g} s"
                            f"{_missing_rank_hint([key])}")
        self._check_reply(status, fields, "get")
        return fields[0]

    def add(self, key: str, amount: int) -> int:
        """Adds amount to the integer under key (0 when absent), atomically; returns the new value."""
        if not isinstance(amount, int) or isinstance(amount, bool):
            raise TypeError(f"TcpStore.add: amount must be an int, got {type(amount).__name__}")
        status, fields = self._call(OP_ADD, [_key(key, "add"), _INT.pack(amount)], "add")
        self._check_reply(status, fields, "add")
        return _INT.unpack(fields[0])[0]

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        """Returns once every key exists (at most timeout seconds, default the store's); CommError naming
        the missing keys (and ranks, for keys <prefix>/<rank>) after that."""
        if isinstance(keys, str):
            keys = [keys]
        keys = list(keys)
        if len(keys) > MAX_WAIT_KEYS:
            raise ValueError(f"TcpStore.wait: at most {MAX_WAIT_KEYS} keys, got {len(keys)}")
        limit = self._limit(timeout)
        status, fields = self._call(OP_WAIT, [DOUBLE.pack(limit)] + [_key(k, "wait") for k in keys], "wait",
                                    wait_s=limit)
        if status == STATUS_TIMEOUT:
            missing = [f.decode(errors="replace") for f in fields]
            shown = ", ".join(map(repr, missing[:10])) + (f" and {len(missing) - 10} more" if len(missing) > 10
                                                          else "")
            raise CommError(f"TcpStore.wait at {self.address}: {len(missing)} of {len(keys)} keys not set within "
                            f"{limit:g} s: {shown}{_missing_rank_hint(missing)}")
        self._check_reply(status, fields, "wait")

    def delete_key(self, key: str) -> bool:
        """Removes key; whether it existed."""
        status, fields = self._call(OP_DELETE, [_key(key, "delete_key")], "delete_key")
        self._check_reply(status, fields, "delete_key")
        return fields[0] == b"1"

    def delete_prefix(self, prefix: str) -> int:
        """Removes every key that begins with prefix (not empty); how many there were."""
        status, fields = self._call(OP_DELETE_PREFIX, [_key(prefix, "delete_prefix")], "delete_prefix")
        self._check_reply(status, fields, "delete_prefix")
        return _INT.unpack(fields[0])[0]

    def keys(self, prefix: str = "") -> tuple[int, list[str]]:
        """(how many keys begin with prefix, the first MAX_LISTED_KEYS of their names in sorted order): to see
        what a job left in its store."""
        status, fields = self._call(OP_KEYS, [prefix.encode()], "keys")
        self._check_reply(status, fields, "keys")
        return _INT.unpack(fields[0])[0], [k.decode(errors="replace") for k in fields[1:]]

    def barrier(self, name: str, rank: int, timeout: float | None = None) -> None:
        """See :func:`barrier` (world_size: the store's)."""
        barrier(self, name, rank, self.world_size, timeout)

    def close(self) -> None:
        """Closes this process's connection and, on the server, stops serving (the others' calls then fail)."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
        if self._server is not None:
            self._server.stop(shutdown=os.getpid() == self._pid)
            self._server = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return (f"TcpStore({self.address}, world_size={self.world_size}, is_server={self.is_server}, "
                f"timeout={self.timeout:g})")


class _Busy(Exception):
    """The server closed a connection before answering the handshake."""


def _resolve(host: str, port: int) -> list:
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return []


def barrier(store: TcpStore, name: str, rank: int, world_size: int, timeout: float | None = None) -> None:
    """Returns once all world_size ranks called barrier(store, name, ...). Each rank sets ``<name>/<rank>``
    and waits for every other's: on timeout, CommError names the ranks that never arrived. A name serves
    one barrier: use a new name for each."""
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise ValueError(f"barrier: need 0 <= rank < world_size, got rank={rank!r}, world_size={world_size!r}")
    store.set(f"{name}/{rank}", b"1")
    keys = [f"{name}/{r}" for r in range(world_size)]
    try:
        store.wait(keys, timeout)
    except CommError as e:
        if "not set within" not in str(e):
            raise
        missing = [r for r in range(world_size) if not _has(store, f"{name}/{r}")]
        raise CommError(f"barrier {name!r} (rank {rank} of {world_size}): rank{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(map(str, missing))} never arrived within "
                        f"{store._limit(timeout):g} s; check that every rank started with the same WORLD_SIZE, "
                        f"MASTER_ADDR and MASTER_PORT, and look at those ranks' output") from None


def _has(store: TcpStore, key: str) -> bool:
    try:
        store.wait([key], 0.0)
        return True
    except CommError:
        return False
