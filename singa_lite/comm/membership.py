"""Who is in an elastic job now: the rounds of the in-process elasticity (``dist.elastic``, comm/elastic_run.py).

An env-launched job (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, or Slurm's variables) that trains under
``dist.elastic.run`` survives the loss of ranks without restarting processes: the survivors meet again in a
new *round* through the job's rendezvous store and make a new communicator among themselves. Ranks that come
(a new process, or one whose host was cut off and is back) wait in the store's join queue and are let in at the
next commit of the running ones, up to ``max_np``.

The store. Launch rank 0 serves the job's TcpStore (comm/store.py), with the job's identity and key (comm/auth.py)
and the launcher's generation, as ``dist.init(init_method="env")`` does, and stays its *coordinator*: it decides
every round. Its process must live: a failure of launch rank 0 (or of its host) ends the job, and the
launcher's restart (``--max-restarts``, checkpoint.ElasticState) takes over. Every other process holds a client
connection that it opens again when it breaks (a link that was cut and came back), and a second one from a
small thread that counts a *heartbeat* key every BEAT_S seconds: a rank whose count stops moving for DEAD_S
seconds is gone (killed, or cut off), which is how the coordinator tells the dead from the slow. A process of the
coordinator's own host that has ended is known to be gone at once (/proc).

A round ``r``, keyed ``elastic/r<r>/...`` in the store:

1. each process that takes part counts itself in and posts what the coordinator needs (its place in the
   earlier round, the step of its last commit);
2. the coordinator waits until every expected process (the members of round r - 1, the joiners it admitted)
   has come or is gone (no heartbeat for DEAD_S seconds), and at least ``min_np`` are there; below ``min_np``
   it goes on waiting, up to the timeout, and then every process fails with a message naming what it waited
   for;
3. it publishes the members, renumbered densely (the earlier ones in their earlier order, then the newcomers),
   and which of them holds the latest commit (the *source* the others restore from);
4. the members make a new communicator under the round's keys (the environment rendezvous of comm/env.py:
   shm on one host, tcp across hosts, nccl with GPUs), and the old one is aborted and closed.

A process that comes too late for a round (it is not among the published members) joins the queue instead.
Every wait is bounded (``timeout``), and a process that cannot reach the store for that long gives up.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time

from .communicator import CollectiveMismatch, CommError, Communicator, seconds_from_env

BEAT_S = 0.25  # a heartbeat every so often
DEAD_S = 3.0  # a process whose heartbeat did not move for this long is gone
POLL_S = 0.05  # how often the coordinator looks at the store while a round gathers
MAX_FAILED_ROUNDS = 5  # rounds in a row whose communicator could not be made before a regroup gives up
TIMEOUT_VAR = "SINGA_LITE_ELASTIC_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
KEY = "elastic"  # every key of this module begins so


class MembersChanged(RuntimeError):
    """Raised by a commit on every member when processes wait to join and there is room: ``dist.elastic.run``
    catches it, lets them in and goes on (a script never sees it there)."""


class ElasticTimeout(CommError):
    """A round could not be made within its timeout: fewer than ``min_np`` processes, or the store out of reach."""


def check_counts(min_np, max_np) -> tuple[int, int | None]:
    for what, v in (("min_np", min_np), ("max_np", max_np)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"dist.elastic: {what} must be a number of ranks >= 1, got {v!r}")
    if min_np is None:
        raise ValueError("dist.elastic: min_np must be a number of ranks >= 1, got None")
    if max_np is not None and max_np < min_np:
        raise ValueError(f"dist.elastic: max_np ({max_np}) must be at least min_np ({min_np})")
    return min_np, max_np


def default_timeout() -> float:
    return seconds_from_env(TIMEOUT_VAR, DEFAULT_TIMEOUT_S)


class ReconnectingStore:
    """The job's store as a client that opens its connection again when it breaks (until a deadline): a cut
    link that comes back must not leave a process without its store."""

    def __init__(self, client, timeout: float):
        self.client, self.timeout = client, timeout
        self.serves = client.is_server

    def __getattr__(self, name):  # host, port, credentials, client_address, refusals, address ...
        return getattr(self.client, name)

    def connect(self, timeout: float):
        """A new client of the same store (same job, generation, world size), no rank claimed: a process that
        comes back after a cut has the same claim, a new process must not take a rank's."""
        from .store import TcpStore

        c = self.client
        return TcpStore(c.host, c.port, c.world_size, False, timeout=max(timeout, 0.05), credentials=c.credentials,
                        rank=None, generation=c.generation)

    def call(self, name: str, *args, deadline: float | None = None):
        deadline = time.monotonic() + self.timeout if deadline is None else deadline
        while True:
            client = self.client
            try:
                return getattr(client, name)(*args)
            except CommError as e:
                if self.serves or client.client_address is not None:
                    raise  # the store answered (a key not set in time): the connection is fine
                last = e
            while True:  # the connection is gone: open another until the deadline
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ElasticTimeout(f"dist.elastic: the rendezvous store at {client.address} could not be "
                                         f"reached again within {self.timeout:g} s (last error: {last}); its host, "
                                         f"or this one, is cut off or gone") from None
                try:
                    fresh = self.connect(min(left, 5.0))
                except CommError as e:
                    last = e
                    time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))
                    continue
                old, self.client = self.client, fresh
                try:
                    old.close()
                except Exception:  # noqa: BLE001 -- already broken
                    pass
                break

    def set(self, key, value):
        return self.call("set", key, value)

    def get(self, key, timeout=None):
        return self.call("get", key, timeout)

    def add(self, key, amount):
        return self.call("add", key, amount)

    def wait(self, keys, timeout=None):
        return self.call("wait", keys, timeout)

    def delete_key(self, key):
        return self.call("delete_key", key)

    def has(self, key: str) -> bool:
        try:
            self.call("wait", [key], 0.0)
            return True
        except ElasticTimeout:
            raise
        except CommError:
            return False

    def close(self):
        self.client.close()


class Prefixed:
    """A view of a store whose keys all begin with `prefix`: each round's communicator meets under keys of its
    own (the environment rendezvous and the tcp mesh use fixed key names)."""

    def __init__(self, store: ReconnectingStore, prefix: str):
        self.store, self.prefix = store, prefix

    def __getattr__(self, name):
        return getattr(self.store, name)

    def set(self, key, value):
        return self.store.set(self.prefix + key, value)

    def get(self, key, timeout=None):
        return self.store.get(self.prefix + key, timeout)

    def add(self, key, amount):
        return self.store.add(self.prefix + key, amount)

    def wait(self, keys, timeout=None):
        return self.store.wait([self.prefix + k for k in ([keys] if isinstance(keys, str) else keys)], timeout)

    def delete_key(self, key):
        return self.store.delete_key(self.prefix + key)


class Heartbeat:
    """A thread that counts this process's heartbeat key, on a connection of its own (the main one may be busy
    in a long wait), opened again when it breaks."""

    def __init__(self, store: ReconnectingStore, uid: str):
        self.key = f"{KEY}/beat/{uid}"
        self.store = store
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, name="singa_lite-elastic-beat", daemon=True)
        self.thread.start()

    def loop(self):
        client = None
        while not self.stop.is_set():
            try:
                if client is None:
                    client = self.store.connect(2.0) if not self.store.serves else self.store.client
                client.add(self.key, 1)
            except (CommError, OSError, ValueError):
                if client is not None and client is not self.store.client:
                    try:
                        client.close()
                    except Exception:  # noqa: BLE001
                        pass
                client = None
            self.stop.wait(BEAT_S)
        if client is not None and client is not self.store.client:
            client.close()

    def close(self):
        self.stop.set()
        self.thread.join(timeout=5.0)


class Membership:
    """This process's side of the rounds (see the module). After :meth:`start`, ``communicator`` is the current
    round's communicator, or a one-rank stand-in while ``pending`` (a process waiting to join)."""

    def __init__(self, launch, backend=None, min_np: int = 1, max_np: int | None = None, timeout: float | None = None,
                 comm_timeout: float | None = None, **options):
        from . import default_timeout as comm_default, env

        self.min_np, self.max_np = check_counts(min_np, max_np)
        self.timeout = default_timeout() if timeout is None else float(timeout)
        self.comm_timeout = comm_default() if comm_timeout is None else float(comm_timeout)
        self.launch, self.backend, self.options = launch, backend, options
        env.wanted_backend(backend)  # a backend the rendezvous cannot give is refused before anything starts
        self.uid = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        self.node = env.node_identity()["node"]  # who shares this host (and its process table)
        self.known: dict = {}  # coordinator: what each process said when it last took part in a round
        self.store = ReconnectingStore(self._open(env, launch), self.timeout)
        self.coordinator = self.store.serves
        self.heartbeat = Heartbeat(self.store, self.uid)
        self.round = -1  # the last round this process was a member of
        self.members: list = []  # that round's members (uids), in rank order
        self.source = 0  # the rank that holds the latest commit of that round
        self.communicator: Communicator | None = None
        self.pending = False  # waiting to join: the communicator is a one-rank stand-in
        self.joins_handled = 0  # coordinator: entries of the join queue it has dealt with
        self.closed = False

    def _open(self, env, launch):
        """The job's store; the other ranks try for as long as a round may wait (launch rank 0 may start late),
        each attempt with the communicator's timeout, which the client keeps for its replies."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return env.open_store(launch, self.comm_timeout, claim=False)
            except CommError as e:
                if launch.rank == 0 or "could not connect" not in str(e) or time.monotonic() >= deadline:
                    raise

    # ----- keys
    @staticmethod
    def _r(r: int) -> str:
        return f"{KEY}/r{r}"

    def start(self) -> Communicator:
        """Round 0 (every launched rank, waiting for all of them up to the timeout; at least min_np), or, when
        round 0 is over, the join queue with a one-rank stand-in communicator."""
        result = self._take_part(0, step=-1, first=True)
        if self.uid in result["members"]:
            self._enter(0, result)
        else:
            self._queue_for_join()
            self.communicator = self._solo()
        return self.communicator

    def _solo(self) -> Communicator:
        from . import env

        return env.meet(Prefixed(self.store, f"{KEY}/solo/{self.uid}/"), 0, 1, self.backend, self.comm_timeout,
                        **self.options)

    def _queue_for_join(self) -> None:
        n = self.store.add(f"{KEY}/joins", 1)
        self.store.set(f"{KEY}/joiner/{n}", self.uid.encode())
        self.pending = True

    # ----- a round
    def _take_part(self, r: int, step: int, first: bool = False) -> dict:
        info = {"uid": self.uid, "launch_rank": self.launch.rank, "step": step, "node": self.node,
                "pid": os.getpid(), "was": self.members.index(self.uid) if self.uid in self.members else None}
        self.store.set(f"{self._r(r)}/here/{self.uid}", json.dumps(info).encode())
        n = self.store.add(f"{self._r(r)}/n", 1)
        self.store.set(f"{self._r(r)}/who/{n}", self.uid.encode())
        if self.coordinator:
            return self._coordinate(r, first)
        # the coordinator answers within its own timeout
        raw = self._wait_for(f"{self._r(r)}/result", self.timeout + 5.0,
                             f"launch rank 0 (the coordinator) to close round {r}")
        result = json.loads(raw)
        if result.get("error"):
            try:
                self.store.set(f"{self._r(r)}/seen/{self.uid}", b"1")
            except CommError:
                pass
            raise ElasticTimeout(f"dist.elastic, round {r}: {result['error']}")
        return result

    def _wait_for(self, key: str, seconds: float, what: str) -> bytes:
        """The value of `key` once set; ElasticTimeout saying what it waited for after `seconds` (not a CommError,
        which dist.elastic.run would take for a failure and regroup again)."""
        try:
            return self.store.call("get", key, seconds, deadline=time.monotonic() + seconds + 10.0)
        except ElasticTimeout:
            raise
        except CommError as e:
            raise ElasticTimeout(f"dist.elastic: waited {seconds:g} s for {what}: {e}") from None

    def _admission(self) -> int:
        return int(self._wait_for(f"{KEY}/admit/{self.uid}", self.timeout,
                                  f"a place in the job (it lets joiners in at its commits, up to max_np="
                                  f"{self.max_np}; raise {TIMEOUT_VAR} to wait longer)"))

    def _coordinate(self, r: int, first: bool) -> dict:
        R = self._r(r)
        expected = set(self.members) - {self.uid} if not first else set()
        start = time.monotonic()
        deadline = start + self.timeout
        arrived: dict = {}
        counted = 0
        beats: dict = {}  # uid -> (count, when it last moved)
        gone: set = set()

        def room():
            return self.max_np is None or len(arrived) + len(expected - set(arrived) - gone) < self.max_np
        while True:
            total = int(self.store.add(f"{R}/n", 0))
            while counted < total:
                try:
                    uid = self.store.get(f"{R}/who/{counted + 1}", 5.0).decode()
                    arrived[uid] = json.loads(self.store.get(f"{R}/here/{uid}", 5.0))
                except CommError:
                    break  # counted in, not written yet: the next look
                counted += 1
            if not first:  # joiners waiting: let them in while there is room
                queued = int(self.store.add(f"{KEY}/joins", 0))
                while self.joins_handled < queued and room():
                    try:
                        uid = self.store.get(f"{KEY}/joiner/{self.joins_handled + 1}", 5.0).decode()
                    except CommError:
                        break
                    self.joins_handled += 1
                    self.store.set(f"{KEY}/admit/{uid}", str(r).encode())
                    expected.add(uid)
            now = time.monotonic()
            for uid in expected - set(arrived) - gone:
                if self.ended_here(uid):  # a process of this host that ended: no need to wait for its heartbeat
                    gone.add(uid)
                    continue
                count = int(self.store.add(f"{KEY}/beat/{uid}", 0))
                seen = beats.get(uid)
                if seen is None or seen[0] != count:
                    beats[uid] = (count, now)
                elif now - seen[1] >= DEAD_S:
                    gone.add(uid)
            launched = {a["launch_rank"] for a in arrived.values()}
            if first:
                ready = len(launched) >= self.launch.world_size
                waiting_for = [k for k in range(self.launch.world_size) if k not in launched]
            else:
                waiting_for = sorted(expected - set(arrived) - gone)
                ready = not waiting_for
            if ready and len(arrived) >= self.min_np:
                break
            if now >= deadline:
                if first and len(arrived) >= self.min_np:
                    break  # the ones missing join later, when they come
                what = (f"launched rank(s) {', '.join(map(str, waiting_for))} never arrived" if first and waiting_for
                        else f"{len(arrived)} process(es) are here ({', '.join(sorted(arrived))})"
                        + (f", {len(gone)} gone (ended, or no heartbeat for {DEAD_S:g} s: "
                           f"{', '.join(sorted(gone))})" if gone else "")
                        + (f", still waiting for {', '.join(waiting_for)}" if waiting_for else ""))
                error = (f"waited {self.timeout:g} s for at least min_np={self.min_np} rank(s): {what}. Start more "
                         f"ranks (they join through the store at {self.store.address}), lower min_np, or raise the "
                         f"timeout ({TIMEOUT_VAR})")
                self.store.set(f"{R}/result", json.dumps({"error": error}).encode())
                try:  # the store ends with this process: the others read why first (bounded: some may be gone)
                    self.store.wait([f"{R}/seen/{u}" for u in arrived if u != self.uid], 5.0)
                except CommError:
                    pass
                raise ElasticTimeout(f"dist.elastic, round {r}: {error}")
            time.sleep(POLL_S)
        self.known.update(arrived)
        others = [u for u in arrived if u != self.uid]
        # the earlier members keep their order, then the newcomers in the order they came
        others.sort(key=lambda u: (arrived[u]["was"] is None, arrived[u]["was"] if arrived[u]["was"] is not None
                                   else 0, arrived[u]["launch_rank"] if first else 0))
        members = [self.uid] + others
        if self.max_np is not None:
            members = members[:self.max_np]
        steps = [arrived[u]["step"] for u in members]
        source = max(range(len(members)), key=lambda i: (steps[i], -i))
        result = {"members": members, "source": source, "steps": steps, "error": None}
        self.store.set(f"{R}/result", json.dumps(result).encode())
        return result

    def ended_here(self, uid: str) -> bool:
        """Whether `uid` is a process of this host (as it said in an earlier round) that has ended: gone from the
        process table, or a zombie its parent has not reaped yet."""
        info = self.known.get(uid)
        if not info or info.get("node") != self.node or not isinstance(info.get("pid"), int):
            return False
        try:
            with open(f"/proc/{info['pid']}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except (OSError, IndexError):
            return True

    def _enter(self, r: int, result: dict) -> None:
        """Makes this member's communicator for round r (the environment rendezvous under the round's keys)."""
        from . import env

        members = result["members"]
        rank = members.index(self.uid)
        self.communicator = env.meet(Prefixed(self.store, f"{self._r(r)}/comm/"), rank, len(members), self.backend,
                                     self.comm_timeout, **self.options)
        self.round, self.members, self.source, self.pending = r, members, result["source"], False

    # ----- what a training loop calls, through dist.elastic
    def join_due(self) -> bool:
        """At a commit (collective, every member): whether processes wait to join and there is room. The
        coordinator looks at the store and tells the others (one small broadcast)."""
        comm = self.communicator
        due = False
        if self.coordinator:
            room = self.max_np is None or comm.world_size < self.max_np
            due = room and int(self.store.add(f"{KEY}/joins", 0)) > self.joins_handled
        if comm.world_size > 1:
            due = bool(comm.broadcast_object(due, 0))
        return due

    def regroup(self, step: int, failure: BaseException | None = None) -> Communicator:
        """After a failure (or to let joiners in): aborts and closes the current communicator, takes part in the
        next rounds until one makes a communicator, and returns it. step: the step of this process's last
        commit (-1: none), by which the round picks the source of the state."""
        self.release(failure)
        if self.pending:
            r = self._admission()
        else:
            r = self.round + 1
        failed = []  # rounds whose communicator could not be made (a member failed meanwhile)
        while True:
            result = self._take_part(r, step)
            if self.uid not in result["members"]:  # too late for it: the queue, then the round that admits us
                self._queue_for_join()
                r = self._admission()
                continue
            try:
                self._enter(r, result)
                return self.communicator
            except CollectiveMismatch:
                raise
            except CommError as e:  # a member failed while the communicator was being made: the next round
                if isinstance(e, ElasticTimeout):
                    raise
                failed.append(f"round {r}: {e}")
                if len(failed) >= MAX_FAILED_ROUNDS:
                    raise ElasticTimeout(f"dist.elastic: {len(failed)} rounds in a row could not make a communicator; "
                                         f"the last: {failed[-1]}") from None
                self.round, self.members = r, result["members"]
                r += 1

    def release(self, failure: BaseException | None = None) -> None:
        comm, self.communicator = self.communicator, None
        if comm is None:
            return
        if failure is not None:  # the others waiting on this one fail now, not at their timeout (NCCL: abort)
            try:
                comm.abort(f"dist.elastic: regrouping after {type(failure).__name__}: {failure}")
            except Exception:  # noqa: BLE001 -- already broken
                pass
        try:
            comm.close()
        except Exception:  # noqa: BLE001 -- a failed communicator may refuse; its resources go with it
            pass

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.release()
        self.heartbeat.close()
        if self.coordinator:
            time.sleep(0.2)  # the others' last reads of the round's keys
        self.store.close()
