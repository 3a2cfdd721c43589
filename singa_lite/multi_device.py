"""Data parallelism over several devices inside one process (MXNet's "multi-GPU from scratch", seed 002).

One process keeps a replica of the parameters on every device (:func:`replicate`), splits each batch
across the devices (:func:`split_and_load`), runs forward and backward per replica, sums the gradients
with :func:`all_reduce` (into the first replica, then copied back, as the seed does) and applies the same
update on every replica, so the replicas stay identical (:func:`max_divergence` checks it).

A device may be listed more than once: K replicas on the CPU device run one after the other and share the
machine's cores (the arithmetic of K devices, none of the speedup), which is how this runs without GPUs.
GPU kernels are queued on each device's stream, so the work of several GPUs can overlap while Python
queues the next device's part. Several processes (one per device) are the other way: see ``dist``.
"""
from __future__ import annotations

import numpy as np

from . import _core
from .device import as_device
from .tensor import Tensor

__all__ = ["split_and_load", "replicate", "all_reduce", "max_divergence"]


def split_and_load(data, devices) -> list:
    """`data` (a numpy array or a Tensor) split along its first axis into len(devices) contiguous parts,
    part i copied to devices[i]. Sizes differ by at most one, the first ``n % k`` parts taking one more
    example (the seed requires ``k`` to divide ``n``); every part must get at least one example."""
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
    each replica's optimizer keys its state alike). The seed's ``get_params``."""
    return [[Tensor(data=p.data.to(as_device(dev).core).clone(), requires_grad=True, stores_grad=True,
                    name=p.name) for p in params] for dev in devices]


def all_reduce(tensors) -> list:
    """Sets every tensor of `tensors` (one per replica, same shape, any devices) to their sum, in place:
    the sum is formed on the first tensor's device, then copied to the others. Returns `tensors`."""
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
