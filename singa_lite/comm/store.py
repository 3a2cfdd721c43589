"""A small TCP key-value store for rendezvous without MPI (``dist.init(init_method="env")``), in the style of
torch's TCPStore, in the standard library only.

Rank 0 serves it at MASTER_ADDR:MASTER_PORT from a daemon thread; every rank (rank 0 too) is a client. The
ranks publish what the others need (their listening address, NCCL's unique id) with ``set`` and read it with
``get``, which blocks until the key exists. Every call has a deadline and every failure is a ``CommError``
saying what to check: nothing listening (wrong MASTER_PORT, rank 0 not started, a firewall), a peer that is
not a store (another service on that port), a rank that never arrived (``get`` of ``<prefix>/<rank>``, and
``barrier``, name it).

Wire format: every message is a 12-byte header (magic ``SLKV``, protocol version, operation or status,
payload length) and a payload of length-prefixed fields. A connection starts with a HELLO exchange: a client
that is not a store's (or a store of another protocol version) is dropped by the server, and a client that
reaches something other than a store says so instead of hanging. Keys and values are bounded
(MAX_KEY_BYTES, MAX_VALUE_BYTES); one connection's failure never stops the server.
"""
from __future__ import annotations

import os
import re
import socket
import struct
import threading
import time

from .communicator import CommError

MAGIC = b"SLKV"
VERSION = 1
_HEADER = struct.Struct("!4sBBHI")  # magic, version, op/status, reserved, payload length
_FIELD = struct.Struct("!I")
_DOUBLE = struct.Struct("!d")
_INT = struct.Struct("!q")
MAX_KEY_BYTES = 4096
MAX_VALUE_BYTES = 64 << 20
MAX_PAYLOAD_BYTES = MAX_VALUE_BYTES + 64 * MAX_KEY_BYTES  # a set's value and key, or a wait's keys
MAX_WAIT_KEYS = 65536
HANDSHAKE_S = 10.0  # at most this long for a peer to answer HELLO (a silent non-store peer)
REPLY_GRACE_S = 10.0  # a blocking get/wait's reply may come this long after its own timeout
_RETRY_MAX_S = 1.0  # longest pause between two connection attempts

# operations (requests)
_HELLO, _SET, _GET, _ADD, _WAIT, _DELETE = 1, 2, 3, 4, 5, 6
# statuses (replies)
_OK, _TIMEOUT, _ERROR = 100, 101, 102
_RANK_KEY = re.compile(r"^(.*)/(\d+)$")


class _Closed(Exception):
    """The peer closed the connection (EOF) in the middle of, or before, a message."""


def _pack(code: int, fields=()) -> bytes:
    body = b"".join(_FIELD.pack(len(f)) + bytes(f) for f in fields)
    return _HEADER.pack(MAGIC, VERSION, code, 0, len(body)) + body


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise _Closed()
        got += k
    return bytes(buf)


def _read_header(sock: socket.socket) -> tuple[int, int, int]:
    """(version, code, payload length); ValueError when the bytes are not a store message."""
    magic, version, code, _, length = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if magic != MAGIC:
        raise ValueError(f"not a singa_lite store message (first bytes {magic!r})")
    if length > MAX_PAYLOAD_BYTES:
        raise ValueError(f"message of {length} bytes is over the limit of {MAX_PAYLOAD_BYTES}")
    return version, code, length


def _fields(payload: bytes) -> list[bytes]:
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


class _Server:
    """The store's data and the threads serving it (one per connection: a job has few ranks)."""

    def __init__(self, listener: socket.socket):
        self._listener = listener
        self._data: dict[bytes, bytes] = {}
        self._changed = threading.Condition()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()  # guards _conns
        self._stopped = False
        self._thread = threading.Thread(target=self._accept_loop, name="singa_lite-store", daemon=True)
        self._thread.start()

    def _accept_loop(self):
        while not self._stopped:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed by stop()
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._stopped:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="singa_lite-store-conn", daemon=True).start()

    def _serve(self, conn: socket.socket):
        try:
            conn.settimeout(HANDSHAKE_S)  # a stray client must say HELLO in time
            version, code, length = _read_header(conn)
            _recv_exact(conn, length)
            if code != _HELLO:
                return
            if version != VERSION:
                conn.sendall(_pack(_ERROR, [f"store protocol version {VERSION}, client speaks {version}: "
                                            f"every rank must run the same singa_lite version".encode()]))
                return
            conn.sendall(_pack(_OK, [str(VERSION).encode()]))
            conn.settimeout(None)  # a client may stay quiet for long between calls
            while not self._stopped:
                version, code, length = _read_header(conn)
                reply = self._handle(code, _fields(_recv_exact(conn, length)))
                conn.sendall(reply)
        except (_Closed, OSError, ValueError, struct.error):
            pass  # that client is gone or not a store client: drop it, serve the others
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _handle(self, code: int, f: list[bytes]) -> bytes:
        try:
            if code == _SET and len(f) == 2:
                with self._changed:
                    self._data[f[0]] = f[1]
                    self._changed.notify_all()
                return _pack(_OK)
            if code == _GET and len(f) == 2:
                (timeout,) = _DOUBLE.unpack(f[1])
                with self._changed:
                    if not self._changed.wait_for(lambda: f[0] in self._data or self._stopped, timeout):
                        return _pack(_TIMEOUT)
                    if f[0] not in self._data:
                        return _pack(_ERROR, [b"the store is closing"])
                    return _pack(_OK, [self._data[f[0]]])
            if code == _ADD and len(f) == 2:
                (amount,) = _INT.unpack(f[1])
                with self._changed:
                    old = self._data.get(f[0], b"0")
                    try:
                        value = int(old) + amount
                    except ValueError:
                        return _pack(_ERROR, [b"add on a key whose value is not an integer"])
                    self._data[f[0]] = str(value).encode()
                    self._changed.notify_all()
                return _pack(_OK, [_INT.pack(value)])
            if code == _WAIT and f:
                (timeout,) = _DOUBLE.unpack(f[0])
                keys = f[1:]
                with self._changed:
                    done = self._changed.wait_for(lambda: all(k in self._data for k in keys) or self._stopped,
                                                  timeout)
                    missing = [k for k in keys if k not in self._data]
                return _pack(_OK if done and not missing else _TIMEOUT, missing)
            if code == _DELETE and len(f) == 1:
                with self._changed:
                    existed = self._data.pop(f[0], None) is not None
                return _pack(_OK, [b"1" if existed else b"0"])
        except struct.error:
            pass
        return _pack(_ERROR, [f"malformed request (operation {code}, {len(f)} fields)".encode()])

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


class TcpStore:
    """A key-value store shared by ``world_size`` processes over TCP.

    host, port: the server's address (MASTER_ADDR, MASTER_PORT). is_server: True on exactly one process
    (rank 0), which listens on every interface at ``port`` (0: a free port, then read ``.port`` and pass it to
    the others), as torch's TCPStore does: MASTER_ADDR is how the others reach rank 0, which need not be an
    address of its own (a Kubernetes service); ``listen_host`` restricts it. Every process, the server's
    included, then connects as a client, retrying until ``timeout`` seconds (rank 0 may start last); after
    that, CommError says which address was tried and what to check.

    Values are bytes. ``get`` and ``wait`` block until their keys exist (at most their timeout, default the
    store's); ``add`` is an atomic integer counter (its value reads back with ``get`` as ASCII digits).
    Thread-safe: calls from several threads are serialised on the one connection.
    """

    def __init__(self, host: str, port: int, world_size: int, is_server: bool, timeout: float = 300.0,
                 listen_host: str | None = None):
        if not isinstance(host, str) or not host:
            raise ValueError(f"TcpStore: host must be a host name or address (MASTER_ADDR), got {host!r}")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < 65536:
            raise ValueError(f"TcpStore: port must be an int in [0, 65536) (MASTER_PORT), got {port!r}")
        if port == 0 and not is_server:
            raise ValueError("TcpStore: a client needs the server's port; port 0 (a free port) is for the server")
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ValueError(f"TcpStore: world_size must be a positive int, got {world_size!r}")
        if not timeout > 0:
            raise ValueError(f"TcpStore: timeout must be a positive number of seconds, got {timeout!r}")
        self.host, self.world_size, self.timeout = host, world_size, float(timeout)
        self.is_server = bool(is_server)
        self._server = None
        self._sock = None
        self._lock = threading.Lock()
        self._pid = os.getpid()
        if is_server:
            self._server = _Server(self._listen(listen_host, port))
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

    def _listen(self, listen_host, port) -> socket.socket:
        family = socket.AF_INET6 if ":" in (listen_host or self.host) else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((listen_host or ("::" if family == socket.AF_INET6 else "0.0.0.0"), port))
            sock.listen(256)
        except OSError as e:
            sock.close()
            raise CommError(f"TcpStore: rank 0 cannot listen on port {port} ({e}): is another job or a "
                            f"previous run still using it? Choose another MASTER_PORT") from None
        return sock

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
                self._handshake(sock, min(max(deadline - time.monotonic(), 0.5), HANDSHAKE_S))
            except BaseException:
                sock.close()
                raise
            return sock

    def _handshake(self, sock: socket.socket, limit: float) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(limit)
        not_store = (f"TcpStore: the peer at {self.address} is not a singa_lite rendezvous store")
        hint = "is MASTER_PORT the port of another service, or of another job?"
        try:
            sock.sendall(_pack(_HELLO))
            version, code, length = _read_header(sock)
            fields = _fields(_recv_exact(sock, length))
        except socket.timeout:
            raise CommError(f"{not_store}: it accepted the connection but did not answer the handshake in "
                            f"{limit:g} s; {hint}") from None
        except _Closed:
            raise CommError(f"{not_store}: it closed the connection without answering the handshake; "
                            f"{hint}") from None
        except ValueError as e:
            raise CommError(f"{not_store}: it answered {e}; {hint}") from None
        except OSError as e:
            raise CommError(f"{not_store}: the handshake failed ({e}); {hint}") from None
        if code != _OK:
            raise CommError(f"TcpStore at {self.address}: {b''.join(fields).decode(errors='replace')}")
        if version != VERSION:
            raise CommError(f"TcpStore at {self.address} speaks protocol version {version}, this process "
                            f"{VERSION}: every rank must run the same singa_lite version")

    def _call(self, code: int, fields, what: str, wait_s: float = 0.0) -> tuple[int, list[bytes]]:
        """One request and its reply. wait_s: how long the server may block on it (get, wait)."""
        message = _pack(code, fields)
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
                _, status, length = _read_header(self._sock)
                return status, _fields(_recv_exact(self._sock, length))
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
        if status == _ERROR:
            raise CommError(f"TcpStore.{what}: the server says: {b''.join(fields).decode(errors='replace')}")

    def _limit(self, timeout) -> float:
        value = self.timeout if timeout is None else float(timeout)
        if not value >= 0:
            raise ValueError(f"TcpStore: timeout must be a number of seconds >= 0, got {timeout!r}")
        return value

    # ----- the API
    def set(self, key: str, value: bytes) -> None:
        """Stores value (bytes) under key, waking whoever waits for it."""
        if isinstance(value, str):
            raise TypeError("TcpStore.set: value must be bytes, got str; encode it (value.encode())")
        value = bytes(value)
        if len(value) > MAX_VALUE_BYTES:
            raise ValueError(f"TcpStore.set: a value of {len(value)} bytes is over the limit of {MAX_VALUE_BYTES}")
        status, fields = self._call(_SET, [_key(key, "set"), value], "set")
        self._check_reply(status, fields, "set")

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value under key, waiting until some process sets it (at most timeout seconds, default the
        store's); CommError naming the key (and, for a key <prefix>/<rank>, that rank) after that."""
        limit = self._limit(timeout)
        status, fields = self._call(_GET, [_key(key, "get"), _DOUBLE.pack(limit)], "get", wait_s=limit)
        if status == _TIMEOUT:
            raise CommError(f"TcpStore.get at {self.address}: key {key!r} was not set within {limit:g} s"
                            f"{_missing_rank_hint([key])}")
        self._check_reply(status, fields, "get")
        return fields[0]

    def add(self, key: str, amount: int) -> int:
        """Adds amount to the integer under key (0 when absent), atomically; returns the new value."""
        if not isinstance(amount, int) or isinstance(amount, bool):
            raise TypeError(f"TcpStore.add: amount must be an int, got {type(amount).__name__}")
        status, fields = self._call(_ADD, [_key(key, "add"), _INT.pack(amount)], "add")
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
        status, fields = self._call(_WAIT, [_DOUBLE.pack(limit)] + [_key(k, "wait") for k in keys], "wait",
                                    wait_s=limit)
        if status == _TIMEOUT:
            missing = [f.decode(errors="replace") for f in fields]
            shown = ", ".join(map(repr, missing[:10])) + (f" and {len(missing) - 10} more" if len(missing) > 10
                                                          else "")
            raise CommError(f"TcpStore.wait at {self.address}: {len(missing)} of {len(keys)} keys not set within "
                            f"{limit:g} s: {shown}{_missing_rank_hint(missing)}")
        self._check_reply(status, fields, "wait")

    def delete_key(self, key: str) -> bool:
        """Removes key; whether it existed."""
        status, fields = self._call(_DELETE, [_key(key, "delete_key")], "delete_key")
        self._check_reply(status, fields, "delete_key")
        return fields[0] == b"1"

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
