"""Data parallelism over several devices inside one process (MXNet's "multi-GPU training from scratch" tutorial).

One process keeps a replica of the parameters on every device (:func:`replicate`), splits each batch
across the devices (:func:`split_and_load`), runs forward and backward per replica, sums the gradients
with :func:`all_reduce` (into the first replica, then copied back, as the tutorial does) and applies the same
update on every replica, so the replicas stay identical (:func:`max_divergence` checks it).

A device may be listed more than once: K replicas on the CPU device run one after the other and share the
machine's cores (the arithmetic of K devices, none of the speedup), which is how this runs without GPUs.
GPU kernels are queued on each device's stream, so the work of several GPUs can overlap while Python
queues the next device's part. Several processes (one per device) are the other way: see ``dist``.

How :func:`all_reduce` sums (``backend=``):

* ``"nccl"``: NCCL's single-process multi-device communicator (``_core.NcclClique``, one NCCL rank per GPU,
  all driven by this process): one grouped ``ncclAllReduce`` per device, on each device's compute stream, so
  the GPUs exchange directly (NVLink / PCIe peer to peer) and later work on the tensors is ordered after it
  without the host waiting. Needs every tensor on a distinct CUDA device (NCCL cannot put two ranks on one
  GPU), contiguous, float16/32/64, bfloat16 or int32/64, and NCCL loadable (``pip install 'singa_lite[cuda13]'``).
  One clique is created per tuple of device ordinals on first use, kept, and closed at exit; one that failed
  is replaced on the next call. Its timeout is ``SINGA_LITE_COMM_TIMEOUT`` (default 300 s).
* ``"host"``: the tutorial's way: the sum is formed on the first tensor's device (``Tensor.to`` copies, GPU to GPU
  through the host) and copied back. Works for any devices and dtypes, the same device listed several times
  included.
* ``"auto"`` (default): ``"nccl"`` when all of its conditions hold, else ``"host"``; so CPU replicas, or
  replicas sharing a GPU, take the host route. :func:`choose_backend` says which one a call would take.

Both leave every tensor equal to the sum, in place. Floating sums may differ in the last bits between the two
(NCCL adds in its own order).
"""
from __future__ import annotations

import atexit
import threading

import numpy as np

from .. import _core
from ..device import as_device
from ..tensor import Tensor

__all__ = ["split_and_load", "replicate", "all_reduce", "choose_backend", "max_divergence"]

BACKENDS = ("auto", "nccl", "host")
# What NCCL moves (csrc/comm/nccl_common.h); "auto" sends other dtypes the host route.
_NCCL_DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64")
_nccl_ready = False  # nccl.readiness() said "" once: not asked again on every all_reduce


def split_and_load(data, devices) -> list:
    """`data` (a numpy array or a Tensor) split along its first axis into len(devices) contiguous parts,
    part i copied to devices[i]. Sizes differ by at most one, the first ``n % k`` parts taking one more
    example (the tutorial requires ``k`` to divide ``n``); every part must get at least one example."""
    devices = [as_device(d) for d in devices]
    n, k = len(data), len(devices)
    if k == 0:
        raise ValueError("split_and_load: no devices given")
    if n < k:
        raise ValueError(f"split_and_load: {n} examples cannot be split over {k} devices; use a batch of at "
                         f"least {k}")
    bounds = np.cumsum([0] + [n // k + (i < n % k) for i in range(k)])
    parts = []
    for dev, start, stop in zip(devices, bounds[:-1], bounds[1:]):
        if isinstance(data, Tensor):
            parts.append(Tensor(data=data.data.slice(0, int(start), int(stop)).to(dev.core), requires_grad=False))
        else:
            parts.append(Tensor(device=dev, data=np.asarray(data[start:stop]), requires_grad=False))
    return parts


def replicate(params, devices) -> list:
    """One list of parameters per device: copies of `params` (trainable leaves, same names, so that
    each replica's optimizer keys its state alike). The tutorial's ``get_params``."""
    return [[Tensor(data=p.data.to(as_device(dev).core).clone(), requires_grad=True, stores_grad=True,
                    name=p.name) for p in params] for dev in devices]


def _nccl_obstacle(tensors) -> str:
    """Why the NCCL clique cannot sum `tensors` ('' when it can): the first condition that fails."""
    if not tensors:
        return "there are no tensors (it needs at least one)"
    seen = {}
    for i, t in enumerate(tensors):
        dev = t.data.device
        if not dev.is_cuda():
            return f"every tensor must be on a CUDA device, tensor {i} is on {dev}"
        if dev.index in seen:
            return (f"every tensor must be on a distinct CUDA device (NCCL cannot put two ranks on one GPU), "
                    f"tensors {seen[dev.index]} and {i} are both on cuda:{dev.index}")
        seen[dev.index] = i
        if not t.data.is_contiguous():
            return f"every tensor must be contiguous, tensor {i} is not (call contiguous() first)"
        if t.data.dtype.name not in _NCCL_DTYPES:
            return f"NCCL moves {', '.join(_NCCL_DTYPES)} tensors, tensor {i} is {t.data.dtype.name}"
    global _nccl_ready
    if _nccl_ready:
        return ""
    from ..comm import nccl  # imported here: the communication layer is not needed on the host route

    problem = nccl.readiness()
    _nccl_ready = not problem  # once NCCL loaded and a GPU was seen, that stays so for the process
    return f"NCCL is not usable here: {problem}" if problem else ""


def choose_backend(tensors, backend: str = "auto") -> str:
    """The route :func:`all_reduce` takes for these tensors: "nccl" or "host". ``backend="auto"`` picks
    "nccl" when every condition of the NCCL clique holds (module docstring), else "host". ``"nccl"`` raises
    ValueError (a condition on the tensors) or CommError (NCCL cannot be used here) naming the condition
    that failed; ``"host"`` is returned as is."""
    if backend not in BACKENDS:
        raise ValueError(f"all_reduce: backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if backend == "host":
        return "host"
    problem = _nccl_obstacle(tensors)
    if not problem:
        return "nccl"
    if backend == "auto":
        return "host"
    kind = _core.CommError if problem.startswith("NCCL is not usable") else ValueError
    raise kind(f"all_reduce(backend='nccl'): {problem}; backend='host' sums through the host instead")


_cliques: dict = {}  # tuple of CUDA device ordinals -> _core.NcclClique
_cliques_lock = threading.Lock()


def _clique(devices: tuple):
    """The cached clique of these devices, created on first use (or after the last one failed)."""
    with _cliques_lock:
        clique = _cliques.get(devices)
        if clique is None or clique.closed or clique.error:
            from ..comm import default_timeout

            clique = _core.NcclClique(list(devices), default_timeout())
            _cliques[devices] = clique
        return clique


@atexit.register
def close_cliques() -> None:
    """Closes every cached clique (at exit, before CUDA is torn down; also callable to free the GPUs'
    NCCL resources). A later all_reduce creates a new one."""
    with _cliques_lock:
        cliques = list(_cliques.values())
        _cliques.clear()
    for clique in cliques:
        try:
            clique.close()
        except Exception:  # noqa: BLE001 - exiting: a clique that cannot close cleanly is aborted by NCCL's exit
            pass


def all_reduce(tensors, backend: str = "auto") -> list:
    """Sets every tensor of `tensors` (one per replica, same shape and dtype) to their sum, in place, and
    returns `tensors`. ``backend``: "auto" (NCCL when possible), "nccl" or "host" (module docstring).
    On the NCCL route the sum is queued on every device's stream and ordered before any later use of the
    tensors; the host route sums on the first tensor's device, then copies the sum to the others."""
    if choose_backend(tensors, backend) == "nccl":
        _clique(tuple(t.data.device.index for t in tensors)).all_reduce([t.data for t in tensors], "sum")
        return tensors
    if not tensors:
        return tensors
    first = tensors[0].data
    for t in tensors[1:]:
        _core.add(first, t.data.to(first.device), out=first)
    for t in tensors[1:]:
        _core.copy_(t.data, first)
    return tensors


def max_divergence(replicas) -> float:
    """The largest absolute difference between a parameter of replica 0 and the same parameter of another
    replica (0.0 when all replicas are identical)."""
    worst = 0.0
    for params in replicas[1:]:
        for p0, p in zip(replicas[0], params):
            diff = np.abs(np.asarray(p0, np.float64) - np.asarray(p, np.float64))
            worst = max(worst, float(diff.max()) if diff.size else 0.0)
    return worst
