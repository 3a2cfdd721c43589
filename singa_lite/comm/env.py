"""Launch without MPI: reading how this process was started, and the rendezvous of ``dist.init(init_method="env")``.

Launchers this module reads
---------------------------
torchrun, Kubernetes training operators (Kubeflow's PyTorchJob...), ``singa-run --hostfile``:
    ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (all four needed), and when set ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` / ``NODE_RANK`` (the node's index).
Slurm's ``srun`` (one task per rank):
    ``SLURM_PROCID`` (rank), ``SLURM_STEP_NUM_TASKS`` or ``SLURM_NTASKS`` (world size), ``SLURM_LOCALID``,
    ``SLURM_NODEID``, ``SLURM_STEP_TASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE`` (e.g. ``2(x3),1``) or
    ``SLURM_NTASKS_PER_NODE``, and the node list ``SLURM_STEP_NODELIST`` / ``SLURM_JOB_NODELIST`` /
    ``SLURM_NODELIST`` in Slurm's compressed form (``node[01-03,07],gpu5``). ``MASTER_ADDR`` defaults to the
    step's first node (where srun puts task 0) and ``MASTER_PORT`` to ``20000 + SLURM_JOB_ID % 10000``, so
    two jobs sharing a node use different ports; set either variable to choose yourself.

Order of precedence of ``dist.init()`` with no arguments (the first that applies wins):

1. explicit arguments: ``holder=`` / ``rank=`` / ``world_size=`` (multiprocessing), or ``init_method="env"``;
2. a singa-run rank on one host (``SINGA_LITE_HOLDER`` set): the launcher's holder;
3. mpiexec (``PMI_RANK``, ``OMPI_COMM_WORLD_RANK``, ``PMIX_RANK``...): MPI, or NCCL bootstrapped by MPI;
4. a complete torchrun environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` all set):
   the TCP rendezvous below. A ``RANK`` or ``WORLD_SIZE`` alone, left by some other tool, changes nothing;
5. a Slurm step of more than one task (``SLURM_PROCID`` and ``SLURM_STEP_ID`` set, world size > 1): the
   same rendezvous with Slurm's values. Slurm comes after torchrun: torchrun started by srun (one agent per
   node) gives its own ranks;
6. otherwise one process.

The rendezvous (:func:`rendezvous`)
-----------------------------------
Rank 0 serves a :class:`~singa_lite.comm.store.TcpStore` at ``MASTER_ADDR:MASTER_PORT`` (for as long as its
communicator lives, or the process: the port stays taken meanwhile); every rank connects
and publishes where it runs (host name, boot id, the /dev/shm it sees). Local rank and local size come from
that exchange, not from the launcher's ``LOCAL_RANK``: ranks that share a host are numbered in the order of
their global ranks. Then the backend: ``backend=`` or ``SINGA_LITE_COMM_BACKEND`` when given (every rank must
ask for the same one), else ``nccl`` when the default device is a GPU, ``shm`` when every rank is on one
host, ``tcp`` otherwise. ``shm`` gets a segment name from rank 0 through the store, ``nccl`` rank 0's unique
id (after every rank checked that it can run NCCL, so one that cannot fails them all at once), ``tcp`` the
store itself. ``mpi`` is refused: its ranks come from mpiexec. Every wait is bounded by the timeout
(``SINGA_LITE_COMM_TIMEOUT``, default 300 s) and a missing rank is named.

Under torchrun itself (``TORCHELASTIC_USE_AGENT_STORE=True``) torchrun's agent already serves PyTorch's own
store on ``MASTER_PORT``, so ours listens on ``MASTER_PORT + 1``.

Generations (restarts)
----------------------
A launcher that restarts a failed job (``singa-run --max-restarts``, ``torchrun --max-restarts``, Slurm's
requeue) starts a new generation of ranks of the same job: the same job identity (comm/auth.py), a new store.
Each rank learns its generation from ``SINGA_LITE_RESTART_COUNT`` (singa-run), else
``TORCHELASTIC_RESTART_COUNT`` (torchrun), else ``SLURM_RESTART_COUNT`` (a requeued Slurm job), else 0
(:func:`generation`). Every rank claims its generation when it joins the store, and the store admits only
ranks of its own: a rank of an earlier attempt that is still running (or a late one of a later attempt) is
refused by name and cannot mix with the new ranks.
"""
from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass, field

from .communicator import CommError, Communicator
from .mpi import MPI_LAUNCH_VARS

HOLDER_VAR = "SINGA_LITE_HOLDER"
BACKEND_VAR = "SINGA_LITE_COMM_BACKEND"
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
STORE_SERVER_VAR = "SINGA_LITE_STORE_SERVER"  # who serves the store when no rank does (singa-run --elastic)
TORCHRUN_OPTIONAL = ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "TORCHELASTIC_USE_AGENT_STORE")
SLURM_NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
SLURM_PORT_BASE, SLURM_PORT_SPAN = 20000, 10000  # MASTER_PORT under Slurm: base + job id % span
ENV_BACKENDS = ("shm", "tcp", "nccl")  # what the rendezvous can give; mpi needs mpiexec
MAX_WORLD_SIZE = 65536  # ranks of one job: the store waits for one key per rank (store.MAX_WAIT_KEYS)
MAX_LIST_CHARS = 1 << 20  # a Slurm list longer than this is refused before it is read
RESTART_VAR = "SINGA_LITE_RESTART_COUNT"  # singa-run --max-restarts: the generation of the ranks it starts
GENERATION_VARS = (RESTART_VAR, "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")
MAX_GENERATION = 1 << 30


def generation(environ=None) -> int:
    """This rank's generation: how many times its launcher restarted the job before starting it (0 for the
    first start). ValueError naming the variable for a value that is not a count."""
    environ = os.environ if environ is None else environ
    for name in GENERATION_VARS:
        raw = str(environ.get(name, "")).strip()
        if raw:
            if not raw.isdigit() or int(raw) > MAX_GENERATION:
                raise ValueError(f"{name} must be the number of restarts so far (an integer from 0 to "
                                 f"{MAX_GENERATION}), got {raw[:40]!r}")
            return int(raw)
    return 0


# ---------------------------------------------------------------- Slurm's compressed lists
def expand_nodelist(text: str, limit: int = MAX_WORLD_SIZE) -> list[str]:
    """Slurm's compressed host list as names: ``node[01-03,07],gpu5`` -> node01 node02 node03 node07 gpu5.
    Zero padding of a range is kept (``[08-10]`` -> 08 09 10); several bracket groups in one name give every
    combination (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2), as Slurm's hostlist does. A list of more than `limit`
    names is refused before any is made."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"Slurm node list: expected names like 'node[01-03,07],gpu5', got {text!r}")
    if len(text) > MAX_LIST_CHARS:
        raise ValueError(f"Slurm node list of {len(text)} characters is over the limit of {MAX_LIST_CHARS}")
    items = _split_top_level(text.strip(), text)
    total = sum(_count_names(item, text) for item in items)
    if total > limit:
        raise ValueError(f"Slurm node list {_short(text)} names {total} hosts, more than the {limit} a job may have")
    names = []
    for item in items:
        names.extend(_expand_name(item, text))
    return names


def _short(text: str) -> str:
    return repr(text) if len(text) <= 80 else repr(text[:77] + "...")


def _count_names(item: str, whole: str) -> int:
    """How many names _expand_name(item) gives, without making them."""
    open_at = item.find("[")
    if open_at < 0:
        return 1
    close_at = item.find("]", open_at)
    if close_at < 0:
        raise ValueError(f"Slurm node list {_short(whole)}: '[' is never closed")
    count = 0
    for part in item[open_at + 1:close_at].split(","):
        m = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        if not m:
            raise ValueError(f"Slurm node list {_short(whole)}: expected numbers or ranges like 01-03 inside [...], "
                             f"got {part.strip()!r}")
        count += max(int(m.group(2) or m.group(1)) - int(m.group(1)) + 1, 0)
    return count * _count_names(item[close_at + 1:], whole)


def _split_top_level(text: str, whole: str) -> list[str]:
    """Splits at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"Slurm node list {whole!r}: nested '[' at position {i}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"Slurm node list {whole!r}: ']' without '[' at position {i}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"Slurm node list {whole!r}: '[' is never closed")
    items.append(text[start:])
    for item in items:
        if not item.strip():
            raise ValueError(f"Slurm node list {whole!r}: an empty name (two commas in a row, or a comma at an end)")
    return [item.strip() for item in items]


def _expand_name(item: str, whole: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    head, body, tail = item[:open_at], item[open_at + 1:close_at], item[close_at + 1:]
    numbers = []
    for part in body.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"Slurm node list {whole!r}: expected numbers or ranges like 01-03 inside [...], "
                             f"got {part!r}")
        low, high = m.group(1), m.group(2) or m.group(1)
        if int(high) < int(low):
            raise ValueError(f"Slurm node list {whole!r}: range {part!r} goes down")
        numbers.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return [head + n + rest for n in numbers for rest in _expand_name(tail, whole)]


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's tasks per node (``SLURM_STEP_TASKS_PER_NODE``): ``2(x3),1`` -> [2, 2, 2, 1]."""
    text = str(text)
    if len(text) > MAX_LIST_CHARS:
        raise ValueError(f"Slurm tasks per node: a list of {len(text)} characters is over the limit of "
                         f"{MAX_LIST_CHARS}")
    parts = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ValueError(f"Slurm tasks per node: expected a list like '2(x3),1', got {_short(text)}")
        parts.append((int(m.group(1)), int(m.group(2) or 1)))
    nodes = sum(n for _, n in parts)
    if nodes > MAX_WORLD_SIZE:
        raise ValueError(f"Slurm tasks per node: {_short(text)} lists {nodes} nodes, more than the {MAX_WORLD_SIZE} "
                         f"a job may have")
    return [count for count, n in parts for _ in range(n)]


# ---------------------------------------------------------------- the launch environment
@dataclass
class LaunchEnv:
    """Where this rank sits in its job, as its launcher described it."""

    launcher: str  # "torchrun" (also Kubernetes operators, singa-run --hostfile) or "slurm"
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    local_rank: int | None = None  # the launcher's word; the rendezvous computes the real one
    local_size: int | None = None
    node_rank: int | None = None
    nodes: list = field(default_factory=list)  # Slurm: the step's node names
    variables: dict = field(default_factory=dict)  # the variables it was read from

    def describe(self) -> str:
        return f"{self.launcher} environment (rank {self.rank} of {self.world_size}, store at " \
               f"{self.master_addr}:{self.master_port})"


def _seen(environ) -> dict:
    """The launch-related variables present, by launcher: for error messages."""
    groups = {
        "torchrun": [v for v in TORCHRUN_VARS + TORCHRUN_OPTIONAL if v in environ],
        "slurm": sorted(v for v in environ if v.startswith("SLURM_") and v in _SLURM_READ),
        "mpiexec": [v for v in MPI_LAUNCH_VARS if v in environ],
        "singa-run": [v for v in (HOLDER_VAR,) if v in environ],
    }
    return {k: v for k, v in groups.items() if v}


_SLURM_READ = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NODEID",
               "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_ID",
               "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_NODES", "SLURM_NNODES"} | set(SLURM_NODELIST_VARS)


def _describe_seen(environ) -> str:
    seen = _seen(environ)
    if not seen:
        return "no launcher's variables are set"
    return "variables seen: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in seen.items())


def _int(environ, name: str, launcher: str, minimum: int = 0, maximum: int = MAX_WORLD_SIZE) -> int:
    raw = environ.get(name)
    text = str(raw).strip()
    try:
        value = int(text) if len(text) <= 20 else None
    except (TypeError, ValueError):
        value = None
    if value is None or not minimum <= value <= maximum:
        shown = raw if raw is None or len(str(raw)) <= 40 else str(raw)[:37] + "..."
        raise ValueError(f"{launcher} environment: {name} must be an integer from {minimum} to {maximum}, got "
                         f"{shown!r}" + (f" (a job has at most {MAX_WORLD_SIZE} ranks)" if value is not None
                                         and value > maximum == MAX_WORLD_SIZE else ""))
    return value


def _port(raw, name: str, launcher: str) -> int:
    try:
        port = int(str(raw).strip())
    except (TypeError, ValueError):
        port = -1
    if not 1 <= port <= 65535:
        raise ValueError(f"{launcher} environment: {name} must be a TCP port (1 to 65535), got {raw!r}; every "
                         f"rank needs the same port, where rank 0 will listen")
    return port


def torchrun_complete(environ=None) -> bool:
    environ = os.environ if environ is None else environ
    return all(environ.get(v) for v in TORCHRUN_VARS)


def slurm_step(environ=None) -> bool:
    """Is this process a task of an srun step (not just a shell inside an allocation)?"""
    environ = os.environ if environ is None else environ
    return "SLURM_PROCID" in environ and ("SLURM_STEP_ID" in environ or "SLURM_STEPID" in environ)


def read_torchrun(environ=None) -> LaunchEnv:
    environ = os.environ if environ is None else environ
    missing = [v for v in TORCHRUN_VARS if not environ.get(v)]
    if missing:
        raise ValueError(f"init_method='env': {', '.join(missing)} not set (a torchrun-style launch needs "
                         f"{', '.join(TORCHRUN_VARS)}; {_describe_seen(environ)}). Set them on every rank "
                         f"(MASTER_ADDR:MASTER_PORT is where rank 0 listens), or start the job with torchrun, "
                         f"srun or singa-run --hostfile")
    who = "torchrun"
    world = _int(environ, "WORLD_SIZE", who, 1)
    rank = _int(environ, "RANK", who)
    if rank >= world:
        raise ValueError(f"{who} environment: need 0 <= RANK < WORLD_SIZE, got RANK={rank}, WORLD_SIZE={world}")
    port = _port(environ["MASTER_PORT"], "MASTER_PORT", who)
    if str(environ.get("TORCHELASTIC_USE_AGENT_STORE", "")).lower() == "true":
        port = port + 1 if port < 65535 else port - 1  # torchrun's agent serves its own store on MASTER_PORT
    env = LaunchEnv(who, rank, world, environ["MASTER_ADDR"].strip(), port,
                    variables={v: environ[v] for v in TORCHRUN_VARS + TORCHRUN_OPTIONAL if v in environ})
    if "LOCAL_RANK" in environ or "LOCAL_WORLD_SIZE" in environ:
        env.local_rank = _int(environ, "LOCAL_RANK", who)
        env.local_size = _int(environ, "LOCAL_WORLD_SIZE", who, 1)
        if env.local_rank >= env.local_size or env.local_size > world:
            raise ValueError(f"{who} environment: need 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE, got "
                             f"LOCAL_RANK={env.local_rank}, LOCAL_WORLD_SIZE={env.local_size}, WORLD_SIZE={world}")
    for name in ("GROUP_RANK", "NODE_RANK"):
        if name in environ:
            env.node_rank = _int(environ, name, who, 0, world - 1)
            break
    return env


def read_slurm(environ=None) -> LaunchEnv:
    environ = os.environ if environ is None else environ
    who = "Slurm"
    if "SLURM_PROCID" not in environ:
        raise ValueError(f"init_method='env': neither a torchrun environment nor a Slurm task "
                         f"({_describe_seen(environ)})")
    world_var = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ else "SLURM_NTASKS"
    if world_var not in environ:
        raise ValueError(f"{who} environment: SLURM_PROCID is set but not SLURM_NTASKS / SLURM_STEP_NUM_TASKS "
                         f"({_describe_seen(environ)}); start the ranks with srun -n N (or --ntasks)")
    world = _int(environ, world_var, who, 1)
    rank = _int(environ, "SLURM_PROCID", who)
    if rank >= world:
        raise ValueError(f"{who} environment: need SLURM_PROCID < {world_var}, got {rank} and {world}")
    list_var = next((v for v in SLURM_NODELIST_VARS if environ.get(v)), None)
    try:
        nodes = expand_nodelist(environ[list_var]) if list_var else []
    except ValueError as e:
        raise ValueError(f"{who} environment: {list_var}: {e}") from None
    master = environ.get("MASTER_ADDR", "").strip()
    if not master:
        if not nodes:
            raise ValueError(f"{who} environment: no node list ({', '.join(SLURM_NODELIST_VARS)}) to take "
                             f"MASTER_ADDR from, and MASTER_ADDR is not set: export MASTER_ADDR=<the host of task 0>")
        master = nodes[0]  # srun puts task 0 on the step's first node
    if environ.get("MASTER_PORT"):
        port = _port(environ["MASTER_PORT"], "MASTER_PORT", who)
    elif environ.get("SLURM_JOB_ID", "").strip().isdigit():
        port = SLURM_PORT_BASE + int(environ["SLURM_JOB_ID"]) % SLURM_PORT_SPAN
    else:
        raise ValueError(f"{who} environment: neither MASTER_PORT nor SLURM_JOB_ID (to derive the port from) is "
                         f"set: export MASTER_PORT=<a free port on {master}>")
    env = LaunchEnv("slurm", rank, world, master, port, nodes=nodes,
                    variables={v: environ[v] for v in sorted(_SLURM_READ) if v in environ})
    if "SLURM_NODEID" in environ:
        env.node_rank = _int(environ, "SLURM_NODEID", who)
        if nodes and env.node_rank >= len(nodes):
            raise ValueError(f"{who} environment: SLURM_NODEID={env.node_rank}, but {list_var} names "
                             f"{len(nodes)} node(s): {environ[list_var]!r}")
    if "SLURM_LOCALID" in environ:
        env.local_rank = _int(environ, "SLURM_LOCALID", who)
        per_node = None
        for var in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
            if environ.get(var) and env.node_rank is not None:
                try:
                    counts = expand_tasks_per_node(environ[var])
                except ValueError as e:
                    raise ValueError(f"{who} environment: {var}: {e}") from None
                if env.node_rank >= len(counts):
                    raise ValueError(f"{who} environment: SLURM_NODEID={env.node_rank}, but {var}={environ[var]!r} "
                                     f"lists {len(counts)} node(s)")
                if var == "SLURM_STEP_TASKS_PER_NODE" and sum(counts) != world:
                    raise ValueError(f"{who} environment: {var}={environ[var]!r} adds up to {sum(counts)} tasks, "
                                     f"but {world_var}={world}")
                per_node = counts[env.node_rank]
                break
        if per_node is None and environ.get("SLURM_NTASKS_PER_NODE"):
            per_node = _int(environ, "SLURM_NTASKS_PER_NODE", who, 1)
        env.local_size = per_node
        if per_node is not None and env.local_rank >= per_node:
            raise ValueError(f"{who} environment: SLURM_LOCALID={env.local_rank}, but this node runs {per_node} "
                             f"task(s) of the step")
    return env


def detect(environ=None) -> str | None:
    """Which launcher started this process, in the order of precedence of the module docstring:
    'singa-run', 'mpiexec', 'torchrun', 'slurm', or None (one process)."""
    environ = os.environ if environ is None else environ
    if environ.get(HOLDER_VAR):
        return "singa-run"
    if any(v in environ for v in MPI_LAUNCH_VARS):
        return "mpiexec"
    if torchrun_complete(environ):
        return "torchrun"
    if slurm_step(environ):
        world = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or "1"
        if not world.strip().isdigit() or int(world) > 1:  # a bad value is reported by read_slurm
            return "slurm"
    return None


def read(environ=None) -> LaunchEnv:
    """The launch environment for init_method='env': torchrun's variables when complete, else Slurm's;
    a ValueError naming what is missing and what was seen otherwise."""
    environ = os.environ if environ is None else environ
    if torchrun_complete(environ) or "SLURM_PROCID" not in environ:
        return read_torchrun(environ)
    return read_slurm(environ)


# ---------------------------------------------------------------- the rendezvous
def node_identity() -> dict:
    """What tells this host apart: its name, the kernel's boot id, the device of the /dev/shm it sees and its
    network namespace. Two ranks may use shared memory together only when all four match: containers with
    their own host name or /dev/shm count as hosts of their own, and so do ranks in another network namespace,
    which the shm backend's rendezvous (an abstract Unix socket, per network namespace) cannot reach."""
    host = socket.gethostname()
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    try:
        shm = os.stat("/dev/shm").st_dev
    except OSError:
        shm = -1
    try:
        net = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        net = -1
    return {"host": host, "node": f"{host}|{boot}|{shm}|{net}"}


def local_ranks(nodes: list) -> list[tuple[int, int]]:
    """(local rank, local size) of every rank, from the node each rank runs on: the ranks of a node are
    numbered in the order of their global ranks."""
    sizes = {n: nodes.count(n) for n in nodes}
    seen: dict = {}
    out = []
    for n in nodes:
        out.append((seen.get(n, 0), sizes[n]))
        seen[n] = seen.get(n, 0) + 1
    return out


def wanted_backend(backend) -> str | None:
    """The backend this rank asks the environment rendezvous for (backend=, else SINGA_LITE_COMM_BACKEND), None
    for automatic; ValueError for one the rendezvous cannot give."""
    chosen = backend or os.environ.get(BACKEND_VAR) or None
    if chosen is None or chosen in ENV_BACKENDS:
        return chosen
    source = "" if backend else f" (from {BACKEND_VAR})"
    if chosen == "mpi":
        raise ValueError(f"backend 'mpi'{source} takes its ranks from mpiexec, but this process was started by "
                         f"another launcher (init_method='env'): use {', '.join(map(repr, ENV_BACKENDS))}, or "
                         f"start the job with mpiexec")
    raise ValueError(f"backend must be one of {', '.join(ENV_BACKENDS)} under init_method='env', got {chosen!r}"
                     + source)


def decide(records: list) -> dict:
    """Rank 0's decision from every rank's record: the backend and the node of each rank, or an error that
    every rank raises alike."""
    world = len(records)
    nodes = [r["node"] for r in records]
    order = list(dict.fromkeys(nodes))
    table = {"nodes": [order.index(n) for n in nodes], "hosts": [r["host"] for r in records], "error": None}
    wanted = {}
    for rank, r in enumerate(records):
        wanted.setdefault(r["wanted"], []).append(rank)
    if len(wanted) > 1:
        table["error"] = "the ranks ask for different backends: " + "; ".join(
            f"rank(s) {_ranks(ranks)}: {name or 'automatic'}" for name, ranks in wanted.items()) + \
            f" (give every rank the same backend= or {BACKEND_VAR})"
        return table
    backend = next(iter(wanted))
    if backend is None:
        gpus = [rank for rank, r in enumerate(records) if r["gpu"]]
        if gpus and len(gpus) != world:
            table["error"] = (f"rank(s) {_ranks(gpus)} made a GPU their default device and the others did not, "
                              f"so they would pick different backends; pass backend= (or {BACKEND_VAR})")
            return table
        backend = "nccl" if gpus else ("shm" if len(order) == 1 else "tcp")
    if backend == "shm" and len(order) > 1:
        table["error"] = (f"backend 'shm' needs every rank on one host, but the ranks run on {len(order)} hosts ("
                          + "; ".join(f"{records[nodes.index(n)]['host']}: rank(s) "
                                      f"{_ranks([k for k in range(world) if nodes[k] == n])}" for n in order)
                          + "): use backend 'tcp' (CPU tensors across hosts) or 'nccl' (GPU tensors)")
        return table
    table["backend"] = backend
    if backend == "shm":
        from .holder import new_shm_name, sweep_stale_segments

        sweep_stale_segments()  # leftovers of killed jobs on this host, as a NcclIdHolder does
        # The holder's naming pattern: a later sweep recognises the name if this job dies before every rank
        # joined (and so before the ranks unlink it).
        table["shm_name"] = new_shm_name()
    return table


def _ranks(ranks) -> str:
    return ", ".join(map(str, ranks))


def single_host(launch: LaunchEnv) -> bool:
    """Whether the launcher says every rank runs on this host: MASTER_ADDR is loopback, torchrun's local world
    is the whole world, or Slurm's step has one node. (The rendezvous learns the truth later; this is what is
    known before any connection, for whom to let in and where to listen.)"""
    from .store import is_loopback

    if is_loopback(launch.master_addr, by_name=False):  # 127.0.0.1, ::1, localhost: nobody else reaches it
        return True
    if launch.local_size is not None:
        return launch.local_size == launch.world_size
    if launch.launcher == "slurm" and launch.nodes:
        return len(set(launch.nodes)) == 1
    return is_loopback(launch.master_addr)


def store_served(environ=None) -> str | None:
    """Who serves the job's store when no rank does (SINGA_LITE_STORE_SERVER, set by ``singa-run --elastic``,
    whose own process serves it so that any rank may fail), or None: rank 0 serves it."""
    environ = os.environ if environ is None else environ
    return environ.get(STORE_SERVER_VAR) or None


def open_store(launch: LaunchEnv, timeout: float, environ=None, claim: bool = True):
    """The job's TcpStore: rank 0 serves it at MASTER_PORT (unless another process does: store_served), every
    rank connects to MASTER_ADDR:MASTER_PORT, each proving the job's key (comm/auth.py) and, with `claim`,
    claiming its rank (dist.elastic's ranks do not: a process that joins later may carry a RANK that a live one
    holds)."""
    from . import auth
    from .store import TcpStore, is_loopback

    one_host = single_host(launch)
    credentials = auth.credentials(environ, single_host=one_host)
    # MASTER_ADDR may name this host by a name that resolves to loopback here but not on the other hosts
    # (Debian maps the host name to 127.0.1.1): then the others need rank 0 on every interface.
    listen = "" if not one_host and is_loopback(launch.master_addr) else None
    serves = launch.rank == 0 and store_served(environ) is None
    try:
        return TcpStore(launch.master_addr, launch.master_port, launch.world_size, serves,
                        timeout=timeout, listen_host=listen, credentials=credentials,
                        rank=launch.rank if claim or serves else None,
                        generation=generation(environ))
    except CommError as e:
        raise CommError(f"dist.init, {launch.describe()}: {e}") from None


def rendezvous(launch: LaunchEnv, backend: str | None = None, timeout: float = 300.0, **options) -> Communicator:
    """This rank's communicator for the job `launch` describes (see the module docstring)."""
    wanted = wanted_backend(backend)
    from ..device import get_default_device

    store = open_store(launch, timeout)
    try:
        comm = _join(store, launch, wanted, get_default_device().is_cuda(), timeout, options)
    except BaseException:
        store.close()
        raise
    if comm.keeps_store:
        return comm  # tcp keeps the store (its peers' addresses, failure reports)
    if launch.rank == 0:
        # Rank 0 serves for as long as its communicator lives, as torch's store does: stopping at once could
        # cut off a rank whose last reply is still on its way.
        comm.rendezvous_store = store
    else:
        store.close()
    return comm


def meet(store, rank: int, world_size: int, backend: str | None = None, timeout: float = 300.0,
         **options) -> Communicator:
    """A communicator of `world_size` ranks that meet through `store` (this process is `rank`): the second half
    of :func:`rendezvous`, on a store that is already open. dist.elastic makes each round's communicator so,
    under the round's own keys (a prefixed view of the job's store)."""
    from ..device import get_default_device

    launch = LaunchEnv("elastic round", rank, world_size, str(getattr(store, "host", "?")),
                       int(getattr(store, "port", 0) or 0))
    return _join(store, launch, wanted_backend(backend), get_default_device().is_cuda(), timeout, options)


def _join(store, launch: LaunchEnv, wanted, gpu: bool, timeout: float, options) -> Communicator:
    rank, world = launch.rank, launch.world_size
    where = f"dist.init, {launch.describe()}"
    store.set(f"host/{rank}", json.dumps({**node_identity(), "wanted": wanted, "gpu": gpu}).encode())
    if rank == 0:
        keys = [f"host/{r}" for r in range(world)]
        try:
            store.wait(keys, timeout)
            table = decide([json.loads(store.get(k)) for k in keys])
        except CommError as e:
            if "not set within" not in str(e):
                raise
            missing = [r for r in range(world) if not _has(store, f"host/{r}")]
            refused = store.refusals()
            table = {"error": f"rank{'s' if len(missing) > 1 else ''} {_ranks(missing)} never arrived within "
                              f"{timeout:g} s: check that they started and have the same MASTER_ADDR, MASTER_PORT "
                              f"and WORLD_SIZE, and look at their output" + (
                                  f"; meanwhile the store refused {'; '.join(refused)}" if refused else "")}
        store.set("table", json.dumps(table).encode())
        if table["error"]:
            _wait_for_readers(store, "seen", [r for r in range(1, world) if _has(store, f"host/{r}")], timeout)
    else:
        try:
            # rank 0 answers within its own timeout, also when a rank is missing: a little longer here
            table = json.loads(store.get("table", timeout + min(timeout, 5.0)))
        except CommError as e:
            raise CommError(f"{where}: rank 0 did not answer: {e}") from None
        if table["error"]:
            _tell_rank0(store, f"seen/{rank}")
    if table["error"]:
        raise CommError(f"{where}: {table['error']}")
    backend = table["backend"]
    local_rank, local_size = local_ranks(table["nodes"])[rank]
    if backend == "tcp":
        from .tcp import TcpCommunicator

        options.setdefault("single_host", len(set(table["nodes"])) == 1)
        return TcpCommunicator(store, rank, world, local_rank, local_size, timeout, **options)
    if backend == "nccl":
        unique_id = _nccl_id(store, rank, world, local_rank, local_size, options.get("device"), where, timeout)
    if backend == "shm":
        from .shm import ShmCommunicator

        name = table["shm_name"]
        try:
            return ShmCommunicator(name, rank, world, timeout=timeout, **options)
        except BaseException:
            _unlink(name)  # a rank that never joined: nobody else removes the name
            raise
    from .nccl import NcclCommunicator

    return NcclCommunicator(unique_id, rank, world, local_rank, local_size, options.get("device"), timeout)


def _nccl_id(store, rank, world, local_rank, local_size, device, where, timeout) -> bytes:
    """Rank 0's NCCL unique id, once every rank checked that it can run NCCL on its GPU (one that cannot
    makes every rank fail at once, naming it, instead of the others waiting in NCCL's rendezvous)."""
    from . import nccl

    try:
        problem = nccl.readiness()
        if not problem:
            nccl.choose_device(device, local_rank, local_size)
    except (ValueError, TypeError, CommError) as e:
        problem = str(e)
    except Exception as e:  # noqa: BLE001 -- CudaError and the like: reported to every rank below
        problem = f"{type(e).__name__}: {e}"
    store.set(f"nccl_ready/{rank}", problem.encode())
    if rank == 0:
        keys = [f"nccl_ready/{r}" for r in range(world)]
        store.wait(keys, timeout)
        problems = {r: store.get(k).decode() for r, k in enumerate(keys)}
        bad = {r: p for r, p in problems.items() if p}
        if bad:
            payload = b"\x01" + (f"rank(s) {_ranks(bad)} cannot use NCCL: " + "; ".join(
                f"rank {r}: {p}" for r, p in bad.items())).encode()
        else:
            try:
                payload = b"\x00" + nccl.unique_id()
            except Exception as e:  # noqa: BLE001 -- CommError / CudaError: every rank must hear of it
                payload = b"\x01" + f"rank 0 could not create the NCCL unique id: {e}".encode()
        store.set("nccl_id", payload)
        if payload[:1] != b"\x00":
            _wait_for_readers(store, "nccl_seen", range(1, world), timeout)
    else:
        payload = store.get("nccl_id", timeout)
        if payload[:1] != b"\x00":
            _tell_rank0(store, f"nccl_seen/{rank}")
    if payload[:1] != b"\x00":
        raise CommError(f"{where}: {payload[1:].decode()}")
    return payload[1:]


def _tell_rank0(store, key: str) -> None:
    """Acknowledges rank 0's error message; rank 0 may stop serving the moment it sees the key, before the
    reply comes back: that is fine here."""
    try:
        store.set(key, b"1")
    except CommError:
        pass


def _wait_for_readers(store, name: str, ranks, timeout: float) -> None:
    """Before rank 0 fails (and stops serving the store), the others read why: each sets <name>/<rank> once it
    has; bounded, since some may never come."""
    try:
        store.wait([f"{name}/{r}" for r in ranks], min(timeout, 5.0))
    except CommError:
        pass


def _has(store, key: str) -> bool:
    try:
        store.wait([key], 0.001)
        return True
    except CommError:
        return False


def _unlink(name: str) -> None:
    from .. import _core

    try:
        _core.shm_unlink(name)
    except Exception:  # noqa: BLE001 -- already gone
        pass
