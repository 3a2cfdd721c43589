"""Who is in an elastic job now: the rounds of the in-process elasticity (``dist.elastic``, comm/elastic_run.py).

An env-launched job (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, or Slurm's variables) that trains under
``dist.elastic.run`` survives the loss of ranks without restarting processes: the survivors meet again in a
new *round* through the job's rendezvous store and make a new communicator among themselves. Ranks that come
(a new process, or one whose host was cut off and is back) wait in the store's join queue and are let in at the
next commit of the running ones, up to ``max_np``.

The store. The job's TcpStore (comm/store.py), with the job's identity and key (comm/auth.py) and the launcher's
generation, as ``dist.init(init_method="env")`` opens it. Under ``singa-run --elastic`` singa-run serves it
(SINGA_LITE_STORE_SERVER), so any rank may fail; with plain processes launch rank 0 serves it and its failure
(or its host's) ends the job. No rank is the coordinator for good: each round is decided by the first member of
the previous round to claim it (a counter in the store), and when that process dies before deciding, the next
one that notices claims it. Every process that does not serve the store holds a client connection that it
opens again when it breaks (a link that was cut and came back), and a second one from a small thread that
counts a *heartbeat* key every BEAT_S seconds: a process whose count stops moving for DEAD_S seconds is gone
(killed, or cut off), which is how the others tell the dead from the slow. A process of one's own host that has
ended is known to be gone at once (/proc).

A round ``r``, keyed ``elastic/r<r>/...`` in the store:

1. each process that takes part counts itself in and posts what the coordinator needs (its place in the
   earlier round, the step of its last commit); a member of round r - 1 claims the round, the first claim
   makes it the round's coordinator, the others wait for the result while watching its heartbeat;
2. the coordinator waits until every expected process (the members of round r - 1, the joiners it admitted)
   has come or is gone (no heartbeat for DEAD_S seconds), and at least ``min_np`` are there; below ``min_np``
   it goes on waiting, up to the timeout, and then every process fails with a message naming what it waited
   for;
3. it publishes the members, renumbered densely (the earlier ones in their earlier order, then the newcomers),
   and which of them holds the latest commit (the *source* the others restore from);
4. the members make a new communicator under the round's keys (the environment rendezvous of comm/env.py:
   shm on one host, tcp across hosts, nccl with GPUs), and the old one is aborted and closed.

A process that comes too late for a round (it is not among the published members) joins the queue instead.
Once every member of a round has restored the commit, its rank 0 deletes the keys of the earlier rounds
(:meth:`Membership.passed`): the store does not grow with the rounds. Every wait is bounded (``timeout``), and
a process that cannot reach the store for that long gives up.
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
FOLLOW_S = 0.5  # how long the others wait for the result at once, between two looks at the coordinator
MAX_FAILED_ROUNDS = 5  # rounds in a row whose communicator could not be made before a regroup gives up
TIMEOUT_VAR = "SINGA_LITE_ELASTIC_TIMEOUT"
MIN_NP_VAR, MAX_NP_VAR = "SINGA_LITE_ELASTIC_MIN_NP", "SINGA_LITE_ELASTIC_MAX_NP"
DEFAULT_TIMEOUT_S = 600.0
KEY = "elastic"  # every key of this module begins so


class MembersChanged(RuntimeError):
    """Raised by a commit on every member when processes wait to join and there is room: ``dist.elastic.run``
    catches it, lets them in and goes on (a script never sees it there)."""


class JobFinished(SystemExit):
    """Raised in a process still waiting to join when the job's members finished training: it has nothing left
    to do, and exits with status 0 unless the script catches this."""

    def __init__(self, message: str):
        super().__init__(0)
        self.message = message

    def __str__(self) -> str:
        return self.message


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


def counts_from_env(min_np, max_np, environ=None) -> tuple[int, int | None]:
    """min_np and max_np, each from the environment (MIN_NP_VAR, MAX_NP_VAR: singa-run --elastic sets them)
    when not given; 1 and None when neither says."""
    environ = os.environ if environ is None else environ
    found = []
    for given, var, default in ((min_np, MIN_NP_VAR, 1), (max_np, MAX_NP_VAR, None)):
        raw = environ.get(var, "").strip()
        if given is not None or not raw:
            found.append(given if given is not None else default)
            continue
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"{var} must be a number of ranks >= 1, got {raw!r}")
        found.append(int(raw))
    return check_counts(*found)


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

    def delete_prefix(self, prefix):
        return self.call("delete_prefix", prefix)

    def keys(self, prefix=""):
        return self.call("keys", prefix)

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

    def delete_prefix(self, prefix):
        return self.store.delete_prefix(self.prefix + prefix)


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
        self.info: dict = {}  # uid -> where it runs (node, pid), for the members of the last round and arrivals
        self.beats: dict = {}  # uid -> (heartbeat count, when it last moved), as this process last looked
        self.store = ReconnectingStore(self._open(env, launch), self.timeout)
        self.heartbeat = Heartbeat(self.store, self.uid)
        self.round = -1  # the last round this process was a member of
        self.members: list = []  # that round's members (uids), in rank order
        self.source = 0  # the rank that holds the latest commit of that round
        self.communicator: Communicator | None = None
        self.pending = False  # waiting to join: the communicator is a one-rank stand-in
        self.gone: list = []  # the processes the current round left out as gone (their keys go at passed())
        self.closed = False

    def _open(self, env, launch):
        """The job's store; a process that does not serve it tries for as long as a round may wait (its server,
        launch rank 0 or the launcher, may start late), each attempt with the communicator's timeout, which the
        client keeps for its replies."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return env.open_store(launch, self.comm_timeout, claim=False)
            except CommError as e:
                serves = launch.rank == 0 and not env.store_served()
                if serves or "could not connect" not in str(e) or time.monotonic() >= deadline:
                    raise

    @property
    def coordinator(self) -> bool:
        """Whether this process leads the current round: rank 0 of its communicator (it looks at the join queue
        at commits and deletes the keys of the rounds every member has passed)."""
        return not self.pending and bool(self.members) and self.members[0] == self.uid

    # ----- keys
    @staticmethod
    def _r(r: int) -> str:
        return f"{KEY}/r{r}"

    def _closed_rounds(self) -> int:
        """How many rounds have been decided (rounds 0 .. this - 1)."""
        return int(self.store.add(f"{KEY}/latest", 0))

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
        """Takes part in round r and returns its result (members, source...). The first member of the previous
        round to claim the round decides it (round 0: the first launched process); when that process dies
        before the round is decided, the next one that notices takes over. A process that was no member of the
        previous round (a joiner) never decides, it waits. A round already over (its keys may be gone) gives
        a result without this process."""
        R = self._r(r)
        if self._closed_rounds() > r:
            return {"members": [], "late": True}
        eligible = first or (self.round == r - 1 and self.uid in self.members)
        info = {"uid": self.uid, "launch_rank": self.launch.rank, "step": step, "node": self.node,
                "pid": os.getpid(), "was": self.members.index(self.uid) if eligible and not first else None}
        self.store.set(f"{R}/here/{self.uid}", json.dumps(info).encode())
        n = self.store.add(f"{R}/n", 1)
        self.store.set(f"{R}/who/{n}", self.uid.encode())
        k = 0
        while True:
            if eligible and self.store.add(f"{R}/claim/{k}", 1) == 1:
                self.store.set(f"{R}/coord/{k}", self.uid.encode())
                result = self._coordinate(r, first)
            else:
                result = self._follow(r, k)
                if result is None:  # coordinator k is gone before deciding: the next one
                    k += 1
                    continue
            if result.get("late"):
                return result
            self.info.update(result.get("info", {}))
            if result.get("error"):
                try:
                    self.store.set(f"{R}/seen/{self.uid}", b"1")
                except CommError:
                    pass
                raise ElasticTimeout(f"dist.elastic, round {r}: {result['error']}")
            return result

    def _follow(self, r: int, k: int) -> dict | None:
        """Waits for round r's result while its k-th coordinator lives: the result, a 'late' one when the round
        is over and its keys gone, or None when the coordinator is gone (ended, no heartbeat for DEAD_S s)."""
        R = self._r(r)
        start = time.monotonic()
        deadline = start + self.timeout + 5.0  # the coordinator answers within its own timeout
        coord, claimed_at = None, None
        while True:
            try:
                return json.loads(self.store.get(f"{R}/result", FOLLOW_S))
            except ElasticTimeout:
                raise
            except CommError:
                pass
            now = time.monotonic()
            if now >= deadline:
                raise ElasticTimeout(f"dist.elastic: waited {self.timeout + 5.0:g} s for round {r} to be decided "
                                     f"(by {coord or 'a member of the previous round'}); raise {TIMEOUT_VAR} to "
                                     f"wait longer")
            if self._closed_rounds() > r:
                return {"members": [], "late": True}
            if coord is None:
                if self.store.has(f"{R}/coord/{k}"):
                    coord = self.store.get(f"{R}/coord/{k}").decode()
                    self.info.setdefault(coord, self._posted(r, coord))
                elif self.store.has(f"{R}/claim/{k}"):  # claimed, not named yet: it died in between?
                    claimed_at = claimed_at or now
                    if now - claimed_at >= DEAD_S:
                        return None
            elif coord != self.uid and self.is_gone(coord):
                return None

    def _posted(self, r: int, uid: str) -> dict:
        try:
            return json.loads(self.store.get(f"{self._r(r)}/here/{uid}", 5.0))
        except CommError:
            return {}

    def is_gone(self, uid: str) -> bool:
        """Whether process `uid` is gone: ended (on this host: /proc), or its heartbeat has not moved for DEAD_S
        seconds (as this process has been looking)."""
        if self.ended_here(uid):
            return True
        count = int(self.store.add(f"{KEY}/beat/{uid}", 0))
        now = time.monotonic()
        seen = self.beats.get(uid)
        if seen is None or seen[0] != count:
            self.beats[uid] = (count, now)
            return False
        return now - seen[1] >= DEAD_S

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
        """The round that lets this waiting process in (at the members' next commit); JobFinished when they
        finish first; ElasticTimeout after the timeout."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                r = int(self.store.get(f"{KEY}/admit/{self.uid}", FOLLOW_S))
                break
            except ElasticTimeout:
                raise
            except CommError:
                pass
            if self.store.has(f"{KEY}/finished"):
                raise JobFinished("dist.elastic: the job finished before this process could join it; nothing left "
                                  "to do")
            if time.monotonic() >= deadline:
                raise ElasticTimeout(f"dist.elastic: waited {self.timeout:g} s for a place in the job (it lets "
                                     f"joiners in at its commits, up to max_np={self.max_np}; raise {TIMEOUT_VAR} "
                                     f"to wait longer)")
        self.store.delete_key(f"{KEY}/admit/{self.uid}")
        self.store.delete_prefix(f"{KEY}/solo/{self.uid}/")  # its stand-in communicator is closed by now
        return r

    def _coordinate(self, r: int, first: bool) -> dict:
        R = self._r(r)
        expected = set(self.members) - {self.uid} if not first else set()
        start = time.monotonic()
        deadline = start + self.timeout
        arrived: dict = {}
        counted = 0
        gone: set = set()

        def room():
            return self.max_np is None or len(arrived) + len(expected - set(arrived) - gone) < self.max_np
        while True:
            if self.store.has(f"{R}/result"):  # decided meanwhile by another (this one was taken for gone)
                return json.loads(self.store.get(f"{R}/result"))
            total = int(self.store.add(f"{R}/n", 0))
            while counted < total:
                try:
                    uid = self.store.get(f"{R}/who/{counted + 1}", 5.0).decode()
                    arrived[uid] = json.loads(self.store.get(f"{R}/here/{uid}", 5.0))
                except CommError:
                    break  # counted in, not written yet: the next look
                counted += 1
                self.info.setdefault(uid, arrived[uid])
            if not first:  # joiners waiting: let them in while there is room
                queued = int(self.store.add(f"{KEY}/joins", 0))
                handled = int(self.store.add(f"{KEY}/joins_handled", 0))
                while handled < queued and room():
                    try:
                        uid = self.store.get(f"{KEY}/joiner/{handled + 1}", 5.0).decode()
                    except CommError:
                        break
                    self.store.set(f"{KEY}/admit/{uid}", str(r).encode())
                    handled = int(self.store.add(f"{KEY}/joins_handled", 1))
                    self.store.delete_key(f"{KEY}/joiner/{handled}")
                    expected.add(uid)
            for uid in expected - set(arrived) - gone:
                if self.is_gone(uid):
                    gone.add(uid)
            now = time.monotonic()
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
                result = self._publish(r, {"error": error, "members": []})
                if self.store.serves:  # the store ends with this process: the others read why first (bounded)
                    try:
                        self.store.wait([f"{R}/seen/{u}" for u in arrived if u != self.uid], 5.0)
                    except CommError:
                        pass
                return result
            time.sleep(POLL_S)
        # the earlier members keep their order, then the newcomers in the order they came (round 0: launch order)
        order = list(arrived)
        members = sorted(arrived, key=lambda u: (arrived[u]["was"] is None, arrived[u]["was"] or 0,
                                                 arrived[u]["launch_rank"] if first else 0, order.index(u)))
        if self.max_np is not None:
            members = members[:self.max_np]
        steps = [arrived[u]["step"] for u in members]
        source = max(range(len(members)), key=lambda i: (steps[i], -i))
        info = {u: {"node": arrived[u]["node"], "pid": arrived[u]["pid"]} for u in members}
        return self._publish(r, {"members": members, "source": source, "steps": steps, "info": info,
                                 "gone": sorted(gone), "error": None})

    def _publish(self, r: int, result: dict) -> dict:
        """Round r's result, unless another coordinator published one first (then that one)."""
        R = self._r(r)
        if self.store.add(f"{R}/decided", 1) != 1:
            return json.loads(self._wait_for(f"{R}/result", 2 * DEAD_S, f"round {r}'s result"))
        self.store.set(f"{R}/result", json.dumps(result).encode())
        self.store.set(f"{KEY}/latest", str(r + 1).encode())
        return result

    def ended_here(self, uid: str) -> bool:
        """Whether `uid` is a process of this host (as it said when it took part in a round) that has ended: gone
        from the process table, or a zombie its parent has not reaped yet."""
        info = self.info.get(uid)
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
        self.gone = result.get("gone", [])

    # ----- what a training loop calls, through dist.elastic
    def join_due(self) -> bool:
        """At a commit (collective, every member): whether processes wait to join and there is room. The round's
        rank 0 looks at the store and tells the others (one small broadcast)."""
        comm = self.communicator
        due = False
        if comm.rank == 0:
            room = self.max_np is None or comm.world_size < self.max_np
            due = room and self.waiting() > 0
        if comm.world_size > 1:
            due = bool(comm.broadcast_object(due, 0))
        return due

    def waiting(self) -> int:
        """How many processes wait in the join queue now (they come in at the members' next commit, while
        there is room under max_np)."""
        return int(self.store.add(f"{KEY}/joins", 0)) - int(self.store.add(f"{KEY}/joins_handled", 0))

    def passed(self) -> None:
        """Every member of the current round is past the earlier ones (call it after a collective of the round's
        communicator): its rank 0 deletes their keys, and the heartbeat keys of the processes the round left
        out as gone, so the store does not grow with the rounds."""
        if self.pending or self.communicator is None or self.communicator.rank != 0:
            return
        cleaned = int(self.store.add(f"{KEY}/cleaned", 0))
        for k in range(cleaned, self.round):
            self.store.delete_prefix(f"{self._r(k)}/")
        if self.round > cleaned:
            self.store.add(f"{KEY}/cleaned", self.round - cleaned)
        for uid in getattr(self, "gone", []):
            self.store.delete_key(f"{KEY}/beat/{uid}")
        self.gone = []

    def finish(self) -> None:
        """The members finished training (called on each after the training function returned): processes still
        waiting to join are told (JobFinished) instead of waiting out their timeout."""
        if not self.pending and self.communicator is not None and self.communicator.rank == 0:
            self.store.set(f"{KEY}/finished", b"1")

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
        if self.store.serves:
            time.sleep(0.2)  # the others' last reads of the round's keys
        self.store.close()
