"""Distributed communication: one Communicator interface, its backends, and the bootstraps that start them.

==================================  ======================  ====================================
launched by                         CPU tensors             GPU tensors
==================================  ======================  ====================================
``mpiexec`` (any number of hosts)   ``mpi`` (mpi4py)        ``nccl``, id broadcast over MPI
multiprocessing / singa-run +       ``shm`` (C++ shared     ``nccl``, id carried by the holder
``NcclIdHolder`` (one host)         memory)
torchrun, Kubernetes, Slurm's       ``shm`` (one host) or   ``nccl``, id shared through the TCP
srun, singa-run --hostfile          ``tcp`` (several)       store at MASTER_ADDR:MASTER_PORT
(``init_method="env"``)
==================================  ======================  ====================================

``init()`` with no arguments finds its launcher in this order (comm/env.py has the details): explicit
arguments (``holder=``/``rank=``/``world_size=``, or ``init_method="env"``); a singa-run rank on one host
(``SINGA_LITE_HOLDER``); mpiexec; a complete torchrun environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``); a Slurm step of several tasks; else one process.

The backend: ``backend=`` if given, else ``SINGA_LITE_COMM_BACKEND``, else from the situation: ``nccl`` when
the default device is a GPU (``device.set_default_device``); otherwise CPU tensors: a holder -> shm; started by
mpiexec -> mpi; the environment rendezvous -> shm when every rank is on one host, else tcp; none of these ->
mpi as a one-process job when mpi4py is installed, else shm with one rank. Scripts that create their GPU after
the optimizer (as SINGA's examples do) pass ``backend="nccl"`` or set ``SINGA_LITE_COMM_BACKEND=nccl``
(``singa-run --backend nccl``).

Under ``singa-run`` (singa_lite/comm/launcher.py) a plain ``init()`` (and so ``DistOpt(sgd)``) finds the
launcher's holder in ``SINGA_LITE_HOLDER`` and its rank in ``RANK`` / ``WORLD_SIZE``. Only
``SINGA_LITE_HOLDER`` (or a complete torchrun environment) marks a launched rank: a ``RANK`` left by another
launcher alone changes nothing. A launcher's rendezvous serves once, so the first such call creates the
rank's communicator and later ones return it (``comm = dist.init()`` and ``opt.DistOpt(sgd)`` in one script
share it).

CPU threads: ranks started by mpiexec or multiprocessing would each run the CPU kernels on every core of the
host (OpenMP's default), so N ranks oversubscribe it N times and OpenMP's spinning barriers stall whenever a
thread is descheduled (SINGA's examples/cnn, 2 ranks on 2 busy cores: 25 s instead of 4.6 s). So ``init()``
gives each rank ``cores // ranks on this host`` threads (at least 1), as singa-run does, unless
OMP_NUM_THREADS is set, device.set_num_threads() chose another count, or the launcher bound the rank to a
subset of its own cores (its choice then stands).
"""
from __future__ import annotations

import importlib.util
import os

from .communicator import (DEFAULT_TIMEOUT, DTYPES, REDUCE_OPS, CollectiveMismatch, CommError, Communicator, Work,
                           seconds_from_env)
from .holder import NcclIdHolder
from . import env
from .mpi import broadcast_bytes, launched_by_mpiexec, mpiexec_ranks

BACKENDS = ("mpi", "shm", "nccl", "tcp")
HOLDER_VAR = "SINGA_LITE_HOLDER"  # set by singa-run: the holder's to_string()
_launched = None  # the communicator a rank made from its launcher's environment (see init)
_latest = None  # the communicator the latest init() returned: new_group's default

__all__ = ["init", "Communicator", "CommError", "CollectiveMismatch", "NcclIdHolder", "Work", "broadcast_bytes",
           "BACKENDS", "REDUCE_OPS", "DTYPES", "DEFAULT_TIMEOUT", "default_timeout", "launched_by_singa_run",
           "launched_by_mpiexec", "from_launcher", "new_group"]


def default_timeout() -> float:
    """SINGA_LITE_COMM_TIMEOUT (seconds) when set, else 300."""
    return seconds_from_env("SINGA_LITE_COMM_TIMEOUT", DEFAULT_TIMEOUT)


def launched_by_singa_run() -> bool:
    """Was this process started as a rank by singa-run (SINGA_LITE_HOLDER set)?"""
    return bool(os.environ.get(HOLDER_VAR))


def from_launcher() -> tuple[NcclIdHolder, int, int] | None:
    """(holder, rank, world_size) of a rank started by singa-run, from its environment; None otherwise."""
    if not launched_by_singa_run():
        return None
    holder = NcclIdHolder.from_string(os.environ[HOLDER_VAR])
    values = {}
    for name in ("RANK", "WORLD_SIZE"):
        raw = os.environ.get(name)
        try:
            values[name] = int(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{HOLDER_VAR} is set (a singa-run rank), so {name} must be an integer, got "
                             f"{raw!r}; start the script with singa-run, or unset {HOLDER_VAR}") from None
    rank, world_size = values["RANK"], values["WORLD_SIZE"]
    if not 0 <= rank < world_size:
        raise ValueError(f"singa-run environment: need 0 <= RANK < WORLD_SIZE, got RANK={rank}, "
                         f"WORLD_SIZE={world_size}")
    return holder, rank, world_size


def init(backend: str | None = None, holder: NcclIdHolder | None = None, rank: int | None = None,
         world_size: int | None = None, timeout: float | None = None, init_method: str | None = None,
         **options) -> Communicator:
    """A communicator for this process.

    backend: "mpi", "shm", "nccl" or "tcp" (default: see the module docstring). holder, rank, world_size: the
    multiprocessing bootstrap (every rank passes the parent's holder, its rank and the world size).
    init_method="env": the ranks find each other through the launcher's variables (torchrun's, Slurm's,
    singa-run --hostfile's) and a TCP rendezvous at MASTER_ADDR:MASTER_PORT (comm/env.py). With none of
    holder, rank, world_size or init_method, the launcher is detected (in comm/env.py's order of precedence:
    singa-run, mpiexec, a complete torchrun environment, a Slurm step, else one process); under a launcher
    the communicator the first such call made is returned by the later ones (one rendezvous per rank).
    timeout: seconds before a stuck operation raises CommError (default SINGA_LITE_COMM_TIMEOUT or 300).
    options: backend-specific (shm: slot_bytes; mpi: comm, an mpi4py communicator to use instead of
    COMM_WORLD; nccl: device, the GPU (default: the default device when it is a GPU, else cuda:<local
    rank>), and comm, an mpi4py communicator to bootstrap from).
    """
    if init_method not in (None, "env"):
        raise ValueError(f"init_method must be 'env' (the launcher's environment variables) or None (detect the "
                         f"launcher), got {init_method!r}")
    # A store= of the caller's (backend "tcp") is explicit too: that rendezvous is theirs.
    explicit = holder is not None or rank is not None or world_size is not None or "store" in options
    if init_method == "env":
        if explicit:
            raise ValueError("init_method='env' reads the rank and the world size from the environment: leave out "
                             "holder=, rank=, world_size= and store=")
        how = "env"
    else:
        how = None if explicit else env.detect()
    global _latest
    if how == "singa-run":
        _latest = _once(backend, "singa-run rank", lambda: _create(backend, *from_launcher(), timeout, options,
                                                                   launched=True))
    elif how in ("env", "torchrun", "slurm"):
        launch = env.read() if how == "env" else env.read_torchrun() if how == "torchrun" else env.read_slurm()
        chosen = default_timeout() if timeout is None else timeout
        _latest = _once(backend, "rank started by " + launch.launcher,
                        lambda: env.rendezvous(launch, backend, chosen, **options))
    else:
        _latest = _share_cores(_create(backend, holder, rank, world_size, timeout, options))
    return _latest


def new_group(ranks, timeout: float | None = None, communicator: Communicator | None = None) -> Communicator:
    """A communicator of some ranks, as torch.distributed.new_group: ``communicator.new_group(ranks, timeout)``
    (see Communicator.new_group), by default on the communicator the latest ``init()`` of this process returned
    (``DistOpt(opt)`` calls init too). Collective: every rank calls it with the same ranks, also those not in the
    group, who get a placeholder whose every use raises ValueError (``group.is_member`` is False).

        world = dist.init()
        group = dist.new_group([0, 2])
        if group.is_member:
            sgd = opt.DistOpt(opt.SGD(lr=0.1), communicator=group)   # trains among ranks 0 and 2
    """
    comm = communicator if communicator is not None else _latest
    if comm is None:
        raise ValueError("dist.new_group: no communicator yet: call dist.init() first (every rank), or pass "
                         "communicator=")
    if not isinstance(comm, Communicator):
        raise TypeError(f"dist.new_group: communicator must be a dist.Communicator, got {type(comm).__name__}")
    return comm.new_group(ranks, timeout)


def _once(backend, who: str, make) -> Communicator:
    """The communicator of a rank whose launcher described its job: made by the first call, returned by the
    later ones (the launcher's rendezvous serves once)."""
    global _launched
    if _launched is None:
        _launched = _share_cores(make())
    elif _launched.closed:
        what = "the launcher's holder serves" if who == "singa-run rank" else "its launcher's variables serve"
        raise CommError(f"this {who}'s communicator was closed, and {what} one rendezvous: keep the communicator "
                        f"open while the rank needs one")
    elif backend not in (None, _launched.backend):
        hint = "use singa-run --backend" if who == "singa-run rank" else f"set {env.BACKEND_VAR} for every rank"
        raise ValueError(f"this {who} already has a {_launched.backend!r} communicator (from an earlier init() or "
                         f"DistOpt), so it cannot make a {backend!r} one; {hint}")
    return _launched


def _create(backend, holder, rank, world_size, timeout, options, launched=False) -> Communicator:
    timeout = default_timeout() if timeout is None else timeout
    chosen = backend or os.environ.get("SINGA_LITE_COMM_BACKEND") or _auto_backend(holder)
    if chosen not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {chosen!r}"
                         + ("" if backend else " (from SINGA_LITE_COMM_BACKEND)"))
    if launched and chosen == "mpi":
        raise ValueError("backend 'mpi' takes its ranks from mpiexec, but this process is a singa-run rank "
                         f"({HOLDER_VAR} is set): use backend 'shm' (CPU tensors) or 'nccl' (GPU tensors), "
                         "e.g. singa-run --backend shm")
    if chosen == "tcp":  # ranks meeting through a TCP store (tcp.py), e.g. from init_method="env"
        from .tcp import create as create_tcp
        return create_tcp(holder=holder, rank=rank, world_size=world_size, timeout=timeout, **options)
    if chosen == "nccl":
        from .nccl import create

        return create(holder=holder, rank=rank, world_size=world_size, timeout=timeout, **options)
    if chosen == "mpi":
        if holder is not None:
            raise ValueError("backend 'mpi' takes its ranks from mpiexec; a NcclIdHolder is for processes "
                             "started by multiprocessing (backend 'shm' or 'nccl')")
        from .mpi import MpiCommunicator
        return MpiCommunicator(timeout=timeout, **options)
    from .shm import ShmCommunicator
    if holder is None:
        if world_size not in (None, 1):
            raise ValueError(f"backend 'shm' with world_size={world_size} needs the parent's NcclIdHolder: "
                             f"create one before starting the processes and pass it with holder=")
        ranks = mpiexec_ranks()
        if world_size is None and ranks > 1:  # else each rank would silently train alone, a world of one
            raise ValueError(f"backend 'shm' takes its ranks from a NcclIdHolder (multiprocessing, singa-run), but "
                             f"this process is one of {ranks} ranks started by mpiexec: use backend 'mpi' (CPU "
                             f"tensors) or 'nccl' (GPU tensors), or unset SINGA_LITE_COMM_BACKEND")
        holder, rank, world_size = NcclIdHolder(), 0, 1
    if rank is None or world_size is None:
        raise ValueError("backend 'shm' needs rank= and world_size= with the holder (e.g. the gpu_num and "
                         "gpu_per_node your launcher passes)")
    if not isinstance(holder, NcclIdHolder):
        raise TypeError(f"holder must be a NcclIdHolder, got {type(holder).__name__}")
    # A fresh name per use: a name seen in /dev/shm during an earlier rendezvous may have been re-created.
    return ShmCommunicator(holder.take_shm_name(), rank, world_size, timeout=timeout, **options)


def _share_cores(comm: Communicator) -> Communicator:
    """Gives this rank its share of the host's cores for the CPU kernels (see the module docstring)."""
    if comm.local_size < 2 or "OMP_NUM_THREADS" in os.environ or not hasattr(os, "sched_getaffinity"):
        return comm
    from .. import _core

    mine = len(os.sched_getaffinity(0))
    try:  # the launcher's own cores (mpiexec's proxy, the script of multiprocessing ranks; a container's set)
        launcher = len(os.sched_getaffinity(os.getppid()))
    except OSError:
        launcher = os.cpu_count() or mine
    if mine < launcher or _core.get_num_threads() != mine:
        return comm  # bound to some cores by the launcher, or a count chosen by the user: theirs stands
    _core.set_num_threads(max(1, mine // comm.local_size))
    return comm


def _auto_backend(holder) -> str:
    from ..device import get_default_device

    if get_default_device().is_cuda():
        return "nccl"  # the user chose a GPU: its tensors need the GPU backend
    if holder is not None:
        return "shm"
    if launched_by_mpiexec():
        return "mpi"
    return "mpi" if importlib.util.find_spec("mpi4py") is not None else "shm"
