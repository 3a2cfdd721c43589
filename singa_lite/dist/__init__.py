"""Distributed communication: one Communicator interface, three backends, two bootstraps.

==================================  ======================  ====================================
launched by                         CPU tensors             GPU tensors
==================================  ======================  ====================================
``mpiexec`` (any number of hosts)   ``mpi`` (mpi4py)        ``nccl``, id broadcast over MPI
multiprocessing / singa-run +       ``shm`` (C++ shared     ``nccl``, id carried by the holder
``NcclIdHolder`` (one host)         memory)
==================================  ======================  ====================================

``init()`` picks the backend: ``backend=`` if given, else ``SINGA_LITE_COMM_BACKEND``, else from the
situation: ``nccl`` when the default device is a GPU (``device.set_default_device``); otherwise CPU
tensors: a holder -> shm; started by mpiexec -> mpi; neither -> mpi as a one-process job when mpi4py is
installed, else shm with one rank. Scripts that create their GPU after the optimizer (as SINGA's examples
do) pass ``backend="nccl"`` or set ``SINGA_LITE_COMM_BACKEND=nccl``.
"""
from __future__ import annotations

import importlib.util
import os

from .communicator import DEFAULT_TIMEOUT, DTYPES, REDUCE_OPS, CommError, Communicator, Work
from .holder import NcclIdHolder
from .mpi import broadcast_bytes, launched_by_mpiexec

BACKENDS = ("mpi", "shm", "nccl")

__all__ = ["init", "Communicator", "CommError", "NcclIdHolder", "Work", "broadcast_bytes", "BACKENDS",
           "REDUCE_OPS", "DTYPES", "DEFAULT_TIMEOUT", "default_timeout"]


def default_timeout() -> float:
    """SINGA_LITE_COMM_TIMEOUT (seconds) when set, else 300."""
    raw = os.environ.get("SINGA_LITE_COMM_TIMEOUT")
    if raw is None:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"SINGA_LITE_COMM_TIMEOUT must be a positive number of seconds, got {raw!r}")
    return value


def init(backend: str | None = None, holder: NcclIdHolder | None = None, rank: int | None = None,
         world_size: int | None = None, timeout: float | None = None, **options) -> Communicator:
    """A communicator for this process.

    backend: "mpi", "shm" or "nccl" (default: see the module docstring). holder, rank, world_size: the
    multiprocessing bootstrap (every rank passes the parent's holder, its rank and the world size).
    timeout: seconds before a stuck operation raises CommError (default SINGA_LITE_COMM_TIMEOUT or 300).
    options: backend-specific (shm: slot_bytes; mpi: comm, an mpi4py communicator to use instead of
    COMM_WORLD; nccl: device, the GPU (default: the default device when it is a GPU, else cuda:<local
    rank>), and comm, an mpi4py communicator to bootstrap from).
    """
    timeout = default_timeout() if timeout is None else timeout
    chosen = backend or os.environ.get("SINGA_LITE_COMM_BACKEND") or _auto_backend(holder)
    if chosen not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {chosen!r}"
                         + ("" if backend else " (from SINGA_LITE_COMM_BACKEND)"))
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
        holder, rank, world_size = NcclIdHolder(), 0, 1
    if rank is None or world_size is None:
        raise ValueError("backend 'shm' needs rank= and world_size= with the holder (e.g. the gpu_num and "
                         "gpu_per_node your launcher passes)")
    if not isinstance(holder, NcclIdHolder):
        raise TypeError(f"holder must be a NcclIdHolder, got {type(holder).__name__}")
    return ShmCommunicator(holder.shm_name, rank, world_size, timeout=timeout, **options)


def _auto_backend(holder) -> str:
    from ..device import get_default_device

    if get_default_device().is_cuda():
        return "nccl"  # the user chose a GPU: its tensors need the GPU backend
    if holder is not None:
        return "shm"
    if launched_by_mpiexec():
        return "mpi"
    return "mpi" if importlib.util.find_spec("mpi4py") is not None else "shm"
