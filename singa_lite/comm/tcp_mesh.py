"""The tcp backend's set-up: the full mesh of authenticated connections between the ranks of a communicator.

Every rank listens on a port, publishes ``host:port`` (and its host name, for the errors) in the rendezvous
store under the communicator's key prefix, and connects to every lower rank; the higher ranks connect to it.
A Greeter answers the incoming connections concurrently, so a silent or hostile connection never delays the
real peers; every connection proves the job's key both ways and names its communicator and ranks (auth.py),
over TLS when the job's credentials ask for it (tls.py).
"""
from __future__ import annotations

import errno
import ipaddress
import socket
import threading
import time

from . import auth
from .communicator import CommError
from .tcp_peer import Peer


def listen_address(store, host, single_host, world_size: int) -> tuple[str, str]:
    """(address to bind, host to publish). Default: the local address of this rank's store connection, the
    interface that reaches MASTER_ADDR. When that is a loopback address, MASTER_ADDR names this very host
    (rank 0's, or a rank beside it): on a job of one host the mesh stays on loopback; across hosts this
    rank needs an address the other hosts reach: the host name's first address of this host that is not
    loopback, else (a name only /etc/hosts maps, to 127.0.1.1) every interface, published as MASTER_ADDR."""
    if host is not None:
        return host, host
    connection = getattr(store, "client_address", None)
    if connection is None:
        return "127.0.0.1", "127.0.0.1"
    local, family = connection
    try:
        loopback = ipaddress.ip_address(local.split("%")[0]).is_loopback
    except ValueError:
        loopback = False
    if not loopback or single_host or world_size == 1:
        return local, local
    master = getattr(store, "host", None) or local
    for address in own_addresses(master, family):
        return address, address
    return ("::" if family == socket.AF_INET6 else "0.0.0.0"), master


def own_addresses(name: str, family: int) -> list:
    """This host's addresses that are not loopback, among those `name` and the host name resolve to."""
    found = []
    for n in (name, socket.gethostname()):
        try:
            infos = socket.getaddrinfo(n, None, family, socket.SOCK_STREAM)
        except OSError:
            continue
        for info in infos:
            address = info[4][0]
            try:
                if ipaddress.ip_address(address.split("%")[0]).is_loopback or address in found:
                    continue
            except ValueError:
                continue
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind((address, 0))
                except OSError:  # not an address of this host
                    continue
            found.append(address)
    return found


class Mesh:
    """One rank's part in making a communicator's mesh: rank `rank` of `world_size`, under the store keys
    `prefix`, within `timeout` seconds, proving `credentials`."""

    def __init__(self, store, prefix: str, rank: int, world_size: int, timeout: float, credentials):
        self.store, self.prefix, self.rank, self.world_size = store, prefix, rank, world_size
        self.timeout, self.credentials = timeout, credentials
        self.here = f"tcp communicator (rank {rank} of {world_size})"

    def connect(self, host, single_host) -> dict:
        """{rank: Peer} of every other rank: a listener (its greetings answered concurrently, so silent
        connections never delay the real peers), then a connection to every lower rank. CommError naming the
        rank that did not come or could not be reached; nothing stays open then."""
        deadline = time.monotonic() + self.timeout
        bind, host = listen_address(self.store, host, single_host, self.world_size)
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        peers: dict = {}
        greeter = None
        try:
            try:
                listener.bind((bind, 0))
            except OSError as e:
                raise CommError(f"{self.here}: cannot listen on {bind} ({e}); host= must be an address (or name) "
                                f"of this host that the other ranks can reach") from None
            listener.listen(max(self.world_size, 64))
            me = f"{host}:{listener.getsockname()[1]}"
            greeter = Greeter(self, listener) if self.rank < self.world_size - 1 else None
            # the host's name first: whoever reads the address can read the name (for the errors)
            self.store.set(f"{self.prefix}/hostname/{self.rank}", socket.gethostname().encode())
            self.store.set(f"{self.prefix}/addr/{self.rank}", me.encode())
            for r in range(self.rank):  # connect to the lower ranks; they accept us
                address = self.store.get(f"{self.prefix}/addr/{r}", max(deadline - time.monotonic(), 0.0)).decode()
                sock = self.dial(r, address, deadline)
                peers[r] = Peer(r, address, sock, self.hostname(r))
            if greeter is not None:
                for r, sock in greeter.wait(deadline, me).items():
                    peers[r] = Peer(r, self.store.get(f"{self.prefix}/addr/{r}", 1.0).decode(), sock, self.hostname(r))
        except BaseException:
            for p in peers.values():
                try:
                    p.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                p.sock.close()
            raise
        finally:
            if greeter is not None:
                greeter.stop()
            listener.close()
        return peers

    def hello(self, to: int) -> dict:
        return {"prefix": self.prefix, "world": self.world_size, "rank": self.rank, "to": to}

    def dial(self, r: int, address: str, deadline: float) -> socket.socket:
        """The authenticated connection to rank r at address, retried until the deadline."""
        host, _, port = address.rpartition(":")
        pause = 0.01
        while True:
            try:
                sock = socket.create_connection((host.strip("[]"), int(port)),
                                                timeout=max(min(deadline - time.monotonic(), 5.0), 0.01))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError as e:
                if time.monotonic() + pause > deadline:
                    raise CommError(f"{self.here}: cannot connect to rank {r} at {address} ({e}); check that it is "
                                    f"reachable from this host (a firewall, or a host= address that is not "
                                    f"routable)") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.5)
                continue
            where = f"rank {r} at {address}"
            try:
                if self.credentials.tls is not None:
                    sock = self.credentials.tls.connect(sock, max(deadline - time.monotonic(), 0.5), where)
                # Rank r answers once it is listening, which it is before it publishes its address; a slow start
                # of r is bounded by the communicator's timeout, not by the handshake's few seconds.
                peer = auth.client(sock, self.credentials, "mesh", self.hello(r),
                                   timeout=max(deadline - time.monotonic(), 0.5), where=where)
            except auth.Dropped:  # its greeters were all busy (a flood): try again
                sock.close()
                if time.monotonic() + pause > deadline:
                    raise CommError(f"{self.here}: {where} kept closing the connection before the "
                                    f"handshake") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.5)
                continue
            except CommError as e:
                sock.close()
                raise CommError(f"{self.here}: {e}") from None
            if (peer.hello.get("rank"), peer.hello.get("prefix")) != (r, self.prefix):
                sock.close()
                raise CommError(f"{self.here}: {where} answered as rank {peer.hello.get('rank')!r} of communicator "
                                f"{peer.hello.get('prefix')!r}")
            return sock

    def admit(self, hello: dict, taken: set) -> str | None:
        """Why a greeted connection is refused (None: it is a higher rank of this communicator not yet
        connected, now counted in `taken`)."""
        r = hello.get("rank")
        if hello.get("prefix") != self.prefix or hello.get("world") != self.world_size or \
                hello.get("to") != self.rank:
            return (f"this is rank {self.rank} of communicator {self.prefix!r} of {self.world_size} ranks, not "
                    f"rank {hello.get('to')!r} of {hello.get('prefix')!r} of {hello.get('world')!r}")
        if type(r) is not int or not self.rank < r < self.world_size:
            return f"rank {r!r} does not connect to rank {self.rank} (only ranks above it do)"
        if r in taken:
            return f"rank {r} is already connected to rank {self.rank}: two processes claim to be rank {r}"
        taken.add(r)
        return None

    def hostname(self, r: int) -> str:
        return self.store.get(f"{self.prefix}/hostname/{r}", 1.0).decode(errors="replace")


class Greeter:
    """Accepts the higher ranks' connections on a rank's listener, from a thread, and greets each in a thread of
    its own (auth.serve: each costs at most a few KiB and auth.HANDSHAKE_S seconds until it proves the key), so
    silent or hostile connections never delay the real peers. At most MAX_AT_ONCE greetings run at once; more
    connections are closed at once (a real peer that meets that retries)."""

    MAX_AT_ONCE = 64

    def __init__(self, mesh: Mesh, listener: socket.socket):
        self._mesh, self._listener = mesh, listener
        self._expect = mesh.world_size - 1 - mesh.rank
        self._admitted: dict = {}  # rank -> socket
        self._taken: set = set()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._slots = threading.BoundedSemaphore(self.MAX_AT_ONCE)
        self._stopped = False
        listener.settimeout(0.2)  # the accept loop looks at _stopped this often
        self._thread = threading.Thread(target=self._accept, name="singa_lite-tcp-accept", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        pause = 0.05
        while not self._stopped:
            try:
                sock, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError as e:
                if self._stopped or e.errno in (errno.EBADF, errno.EINVAL):
                    return
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(pause)  # the connection waits in the backlog
                    pause = min(pause * 2, 1.0)
                continue
            pause = 0.05
            if not self._slots.acquire(blocking=False):
                sock.close()
                continue
            threading.Thread(target=self._greet, args=(sock,), name="singa_lite-tcp-greet", daemon=True).start()

    def _greet(self, sock: socket.socket) -> None:
        mesh = self._mesh

        def admit(hello):
            with self._lock:
                return mesh.admit(hello, self._taken)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if mesh.credentials.tls is not None:
                wrapped = auth.accept_tls(sock, mesh.credentials)
                if wrapped is None:
                    sock.close()
                sock = wrapped
            peer = None if sock is None else auth.serve(sock, mesh.credentials, "mesh", admit=admit,
                                                        extra={"prefix": mesh.prefix, "rank": mesh.rank})
        except OSError:  # ssl.SSLError too: not a TLS peer of this job
            peer = None
        finally:
            self._slots.release()
        with self._lock:
            if peer is None or self._stopped:
                if sock is not None:
                    sock.close()
                return
            sock.settimeout(None)
            self._admitted[peer.hello["rank"]] = sock
            if len(self._admitted) == self._expect:
                self._done.set()

    def wait(self, deadline: float, me: str) -> dict:
        """{rank: socket} of every higher rank, or CommError naming those that did not connect in time."""
        self._done.wait(max(deadline - time.monotonic(), 0.0))
        mesh = self._mesh
        with self._lock:
            if len(self._admitted) == self._expect:
                got, self._admitted = self._admitted, {}
                return got
            missing = [r for r in range(mesh.rank + 1, mesh.world_size) if r not in self._admitted]
        raise CommError(f"tcp communicator (rank {mesh.rank} of {mesh.world_size}, listening at {me}): "
                        f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not connect "
                        f"within {mesh.timeout:g} s; check that they started and that no firewall blocks {me} "
                        f"(host= sets the address peers reach this rank at)")

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            left, self._admitted = self._admitted, {}
        for sock in left.values():
            sock.close()
