"""Data parallelism over a communicator (singa_lite.comm): one wrapper per way users write a training loop.

- ``DistOpt`` (dist_opt.py): SINGA's distributed optimizer, also ``opt.DistOpt``; its two-phase step
  (``backward`` -> ``PendingStep``) is public.
- ``ddp`` (ddp.py): the module API of Needle's ddp project (``ddp.init``, ``ddp.DistributedOptimizer``, ...).
- ``DataParallel`` (data_parallel.py): a model wrapper driven by gradient hooks (the DDP exercises' ``MyDP``).
- ``multi_device`` (multi_device.py): several devices driven by one process.
- ``SyncBatchNorm2d`` (sync_batchnorm.py): batch normalisation with the statistics of every rank's batch.

What they share, one home each: fusion.py (the buckets and their all-reduces), replicas.py (comparing and
broadcasting the ranks' parameters), accumulate.py (gradient accumulation), join.py (uneven inputs) and
buffers.py (batch-norm statistics).
"""
from __future__ import annotations

from . import ddp, multi_device
from .data_parallel import DataParallel, MyDP
from .dist_opt import DistOpt, PendingStep
from .sync_batchnorm import SyncBatchNorm2d

__all__ = ["DistOpt", "PendingStep", "DataParallel", "MyDP", "SyncBatchNorm2d", "ddp", "multi_device"]
