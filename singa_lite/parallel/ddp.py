"""Distributed data parallel with the API of Needle's ddp project (``apps/ddp.py``; Needle is the framework of
CMU's Deep Learning Systems course), over singa_lite's
communicators and DistOpt's fused exchange.

The project's script, and its singa_lite spelling (``mpiexec -n 4 python train.py``, or processes started by
multiprocessing that pass the parent's ``NcclIdHolder`` to ``init``)::

    rank, device = ddp.init()                                   # same
    loader, bsz = ddp.partition_dataset((x, y), 128, device=device, dtype="float32")
    ddp.broadcast_parameters(model)                              # same
    opt = ddp.DistributedOptimizer(opt.Adam(lr=0.001))           # singa_lite optimizers hold no parameters
    for X, y in loader:
        opt.reset_grad()                                         # same
        loss = loss_fn(model(X), y)
        opt.backward(loss)                                       # Needle: loss.backward()
        opt.step()                                               # same
    ddp.check_parameter_closeness(model)                         # the DDP exercises' check

The one change is ``opt.backward(loss)`` for ``loss.backward()``: singa_lite's backward pass is a generator
of ``(param, grad)`` pairs rather than ``.grad`` fields, so the optimizer runs it, and starts each fused
bucket's all-reduce while the rest of the pass is still running (``opt.step(loss)`` does both). Averaging
the gradients of k ranks that each took batch_size // k examples gives the gradient of the whole batch
(the project's section 1), so the ranks stay identical and train as one process with batch_size would.
"""
from __future__ import annotations

import numbers
import os

import numpy as np

from .. import comm as comm_layer, tensor
from ..device import Device, as_device, cuda_is_available, get_default_device
from . import replicas
from .fusion import DEFAULT_FIRST_BUCKET, DEFAULT_THRESHOLD, check_threshold
from .dist_opt import DistOpt

__all__ = ["init", "shutdown", "communicator", "current_communicator", "rank", "world_size", "partition_dataset",
           "ShardLoader", "broadcast_parameters", "check_parameter_closeness", "DistributedOptimizer"]

_state = {"comm": None, "device": None, "owned": False}


# ---------------------------------------------------------------- the process group
def init(holder=None, rank: int | None = None, world_size: int | None = None, *, device=None,
         backend: str | None = None, timeout: float | None = None, communicator=None, **options):
    """Joins the group of training processes; returns ``(rank, device)``, the device this rank trains on.

    Needle's ddp: ``rank, device = ddp.init()`` under ``mpiexec``, one GPU per rank. Here the group comes from
    ``dist.init``: under ``mpiexec`` with no arguments; for processes started by multiprocessing, the
    parent's ``NcclIdHolder`` with this process's ``rank`` and the ``world_size``; or an existing
    ``communicator``. device: None picks ``cuda:<local rank>`` (nccl backend) when this build has CUDA and a
    GPU is visible, else the CPU (mpi or shm backend); ``"cpu"`` or a GPU forces one. backend, timeout,
    options: passed to ``dist.init``. Calling init again returns the same answer; ``shutdown()`` ends the
    group.
    """
    if _state["comm"] is not None:
        if any(v is not None for v in (holder, rank, world_size, device, backend, communicator)) or options:
            raise RuntimeError("ddp.init: already initialized; call ddp.shutdown() before joining another group")
        return _state["comm"].rank, _state["device"]
    if communicator is not None:
        if holder is not None or rank is not None or world_size is not None or backend is not None:
            raise ValueError("ddp.init: pass either communicator= or the arguments that create one (holder, "
                             "rank, world_size, backend), not both")
        if not isinstance(communicator, comm_layer.Communicator):
            raise TypeError(f"ddp.init: communicator must be a dist.Communicator, got {type(communicator).__name__}")
        comm, owned = communicator, False
        chosen = as_device(device) if device is not None else getattr(communicator, "device", None)
    else:
        chosen = _choose_device(device, backend)
        if chosen is None or chosen.is_cuda():
            if backend not in (None, "nccl"):
                raise ValueError(f"ddp.init: device {chosen} needs backend 'nccl', got {backend!r}")
            backend = "nccl"
            if chosen is not None:
                options["device"] = chosen
        elif backend == "nccl":
            raise ValueError("ddp.init: backend 'nccl' moves GPU tensors; with device='cpu' use 'mpi' or 'shm'")
        elif backend is None and get_default_device().is_cuda() and not os.environ.get("SINGA_LITE_COMM_BACKEND"):
            backend = "shm" if holder is not None else "mpi"  # CPU asked for: not the GPU default's nccl
        comm, owned = comm_layer.init(backend=backend, holder=holder, rank=rank, world_size=world_size,
                                      timeout=timeout, **options), True
        if comm.device_kind == "cuda":
            chosen = comm.device  # the GPU the communicator picked (nccl: cuda:<local rank> by default)
    _state.update(comm=comm, device=chosen if chosen is not None else as_device("cpu"), owned=owned)
    return comm.rank, _state["device"]


def _choose_device(device, backend) -> Device | None:
    """The device asked for; None: the GPU the nccl backend will choose (cuda:<local rank>)."""
    if device is not None:
        return as_device(device)
    wanted = backend or os.environ.get("SINGA_LITE_COMM_BACKEND")
    if wanted == "nccl" or (wanted is None and cuda_is_available()):
        return None
    return as_device("cpu")


def shutdown() -> None:
    """Leaves the group: closes the communicator ``init`` created (not one passed in) and forgets it."""
    comm, owned = _state["comm"], _state["owned"]
    _state.update(comm=None, device=None, owned=False)
    if comm is not None and owned:
        comm.close()


def communicator() -> comm_layer.Communicator:
    """The communicator of ``init``; RuntimeError before it."""
    return _group("ddp.communicator")


def current_communicator() -> comm_layer.Communicator | None:
    """The communicator of ``init``, or None before it (for code that falls back on it when given none, as
    ``SyncBatchNorm2d`` does)."""
    return _state["comm"]


def rank() -> int:
    return _group("ddp.rank").rank


def world_size() -> int:
    return _group("ddp.world_size").world_size


def _group(what: str) -> comm_layer.Communicator:
    if _state["comm"] is None:
        raise RuntimeError(f"{what}: call ddp.init() first (it joins the group of training processes)")
    return _state["comm"]


# ---------------------------------------------------------------- data
def partition_dataset(dataset, batch_size: int, device=None, dtype="float32", *, shuffle: bool = True,
                      seed: int = 0):
    """This rank's share of `dataset`: returns ``(loader, per_rank_batch_size)``, as Needle's ddp.

    The per-rank batch is ``batch_size // world_size`` (Needle's ddp rule). dataset: ``(x, y)`` numpy arrays
    (any number of arrays sharing their first axis), one array, or a Needle-style dataset (``len`` and
    ``dataset[i]`` giving an array or a tuple of arrays). The loader yields tuples of tensors on `device`
    (default: the one ``init`` returned); floating arrays are cast to `dtype` (None: kept), integer arrays
    (labels) keep an integer dtype. See :class:`ShardLoader` for which examples each rank gets.
    """
    comm = _group("ddp.partition_dataset")
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"ddp.partition_dataset: batch_size must be a positive int, got {batch_size!r}")
    per_rank = int(batch_size) // comm.world_size
    if per_rank == 0:
        raise ValueError(f"ddp.partition_dataset: batch_size {batch_size} is smaller than the {comm.world_size} "
                         f"ranks; each rank needs at least one example per step")
    dev = _state["device"] if device is None else as_device(device)
    loader = ShardLoader(dataset, per_rank, comm.rank, comm.world_size, device=dev, dtype=dtype,
                         shuffle=shuffle, seed=seed)
    return loader, per_rank


class ShardLoader:
    """Batches of one rank's share of a dataset.

    Each epoch the examples are put in one order, the same on every rank (a permutation drawn from
    ``seed + epoch`` when shuffling), and cut into global batches of ``batch_size * world_size``; rank r
    takes the r-th slice of every global batch. So at every step the ranks together see exactly the batch a
    single process with the whole batch size would see -- and data-parallel training matches it up to
    rounding. (Splitting the dataset into one contiguous partition per rank, as PyTorch's distributed
    tutorial does, is also a valid split, but not step-by-step comparable to one process.) An incomplete
    last global batch is dropped, so every rank runs the same number of steps. The epoch advances at each
    ``iter()``; ``set_epoch`` sets it.
    """

    def __init__(self, dataset, batch_size: int, rank: int, world_size: int, device=None, dtype="float32",
                 shuffle: bool = True, seed: int = 0):
        self.batch_size, self.rank, self.world_size = int(batch_size), int(rank), int(world_size)
        self.device = as_device(device)
        self.dtype = None if dtype is None else np.dtype(tensor.to_dtype(dtype).name)
        self.shuffle, self.seed, self.epoch = bool(shuffle), int(seed), 0
        self._fetch, self._n, self._single = _fetcher(dataset)

    def __len__(self) -> int:
        return self._n // (self.batch_size * self.world_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's example indices for an epoch, batch after batch (shape: (len(self), batch_size))."""
        epoch = self.epoch if epoch is None else epoch
        order = np.random.default_rng(self.seed + epoch).permutation(self._n) if self.shuffle else np.arange(self._n)
        steps, b = len(self), self.batch_size
        return order[:steps * b * self.world_size].reshape(steps, self.world_size, b)[:, self.rank]

    def __iter__(self):
        idx = self.indices()
        self.epoch += 1
        for rows in idx:
            arrays = [self._convert(a) for a in self._fetch(rows)]
            batch = tuple(tensor.Tensor(data=a, device=self.device, requires_grad=False) for a in arrays)
            yield batch[0] if self._single else batch

    def _convert(self, a: np.ndarray) -> np.ndarray:
        if self.dtype is not None and a.dtype.kind == "f" and a.dtype != self.dtype:
            return a.astype(self.dtype)
        return a


def _fetcher(dataset):
    """(fetch(indices) -> list of arrays, number of examples, whether one array is yielded alone)."""
    if isinstance(dataset, np.ndarray):
        dataset = (dataset,)
        single = True
    else:
        single = False
    if isinstance(dataset, (tuple, list)) and dataset and all(isinstance(a, np.ndarray) for a in dataset):
        n = len(dataset[0])
        for i, a in enumerate(dataset):
            if a.ndim == 0 or len(a) != n:
                raise ValueError(f"ddp.partition_dataset: the arrays must share their first axis (examples); "
                                 f"array 0 has {n}, array {i} has shape {a.shape}")
        return (lambda rows: [a[rows] for a in dataset]), n, single
    if hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"):
        n = len(dataset)
        first = dataset[0] if n else None
        single = not isinstance(first, (tuple, list))

        def fetch(rows):
            items = [dataset[int(i)] for i in rows]
            fields = [items] if single else list(zip(*items))
            return [np.stack([np.asarray(v) for v in field]) for field in fields]
        return fetch, n, single
    raise TypeError(f"ddp.partition_dataset: dataset must be numpy arrays (x, y), one array, or a dataset with "
                    f"len() and dataset[i]; got {type(dataset).__name__}")


# ---------------------------------------------------------------- parameters
def broadcast_parameters(model, root: int = 0) -> None:
    """Gives every rank rank `root`'s parameter values (Needle's ddp: before training, so the replicas start
    equal). The ranks' models are compared first (names, shapes, dtypes): a difference raises ValueError on
    every rank. model: a Layer / Model, a dict or list of parameter tensors, an object with ``parameters()``
    or a plain class with layer attributes."""
    comm = _group("ddp.broadcast_parameters")
    comm.check_rank(root, "ddp.broadcast_parameters", "root")
    replicas.broadcast_parameters(comm, replicas.named_parameters(model, "ddp.broadcast_parameters"), root,
                                  who="ddp.broadcast_parameters")


def check_parameter_closeness(model, rtol: float = 1e-5, atol: float = 1e-8) -> bool:
    """True when every rank's parameters equal rank 0's within ``atol + rtol * |rank 0's|``; otherwise a
    RuntimeWarning names the parameter that differs most, and False. The same answer on every rank (the
    DDP exercises' debugging check, ``torch.allclose`` against rank 0)."""
    comm = _group("ddp.check_parameter_closeness")
    named = replicas.named_parameters(model, "ddp.check_parameter_closeness")
    return replicas.check_parameter_closeness(comm, named, rtol, atol, who="ddp.check_parameter_closeness")


# ---------------------------------------------------------------- the optimizer
class DistributedOptimizer:
    """Wraps any optimizer of the ``opt.Optimizer`` contract; its updates use gradients averaged over the
    ranks (Needle's ``ddp.DistributedOptimizer(opt)``, after Horovod's).

    ``backward(loss)`` (Needle's ``loss.backward()``) runs the backward pass; each gradient goes into
    DistOpt's fusion buffer as it comes, and a bucket's all-reduce starts as soon as it is full, overlapping
    the rest of the pass. ``step()`` waits for the exchange and updates every parameter once with the
    averaged gradients (a non-finite average skips the step on every rank, as DistOpt). ``reset_grad()``
    drops the gradients of a backward that was not stepped. ``step(loss)`` is backward then step.

    This is DistOpt's two-phase step (``DistOpt.backward`` then ``PendingStep.finish``; ``dist_opt`` is the
    DistOpt it drives); buffSize, threshold, first_bucket, on_nonfinite, backward_passes_per_step and
    average_accumulated, find_unused_parameters / parameters and check_replicas_every mean what they mean there
    (``no_sync()`` too; ``clip_grad_norm(max_norm)`` between backward and step clips the averaged gradients).
    communicator: default the one of ``ddp.init``.
    """

    def __init__(self, opt, communicator=None, *, buffSize: int = 4194304, threshold: int = DEFAULT_THRESHOLD,
                 first_bucket: int = DEFAULT_FIRST_BUCKET, on_nonfinite: str = "skip",
                 backward_passes_per_step: int = 1, average_accumulated: bool = True,
                 find_unused_parameters: bool = False, parameters=None, check_replicas_every: int | None = None):
        if isinstance(opt, (DistOpt, DistributedOptimizer)):
            raise TypeError("ddp.DistributedOptimizer: the optimizer is already distributed; wrap the plain "
                            "optimizer (e.g. opt.SGD(...)) once")
        comm = communicator if communicator is not None else _group("ddp.DistributedOptimizer")
        self.opt = opt
        self._dist = DistOpt(opt, communicator=comm, buffSize=buffSize, first_bucket=first_bucket,
                             on_nonfinite=on_nonfinite, backward_passes_per_step=backward_passes_per_step,
                             average_accumulated=average_accumulated,
                             find_unused_parameters=find_unused_parameters, parameters=parameters,
                             check_replicas_every=check_replicas_every)
        self.threshold = check_threshold(threshold, self._dist.buffSize, "ddp.DistributedOptimizer")
        self._pending = None  # the parallel.dist_opt.PendingStep of a backward not yet stepped

    def __repr__(self):
        return f"ddp.DistributedOptimizer({self.opt!r}, rank {self.rank} of {self.world_size})"

    @property
    def dist_opt(self) -> DistOpt:
        """The DistOpt that exchanges the gradients and updates (its get_states is this optimizer's)."""
        return self._dist

    @property
    def communicator(self):
        return self._dist.communicator

    @property
    def rank(self) -> int:
        return self._dist.global_rank

    @property
    def world_size(self) -> int:
        return self._dist.world_size

    @property
    def skipped_steps(self) -> int:
        return self._dist.skipped_steps

    def backward(self, loss) -> None:
        """The backward pass from `loss`, its gradients' exchange started (Needle: ``loss.backward()``)."""
        if self._pending is not None:
            raise RuntimeError("ddp.DistributedOptimizer.backward: the gradients of the previous backward were "
                               "not used; call step() to apply them, or reset_grad() to drop them, first")
        self._pending = self._dist.backward(loss, self.threshold)

    def synchronize(self) -> list:
        """Waits for the exchange of the last ``backward``; returns the averaged ``(param, grad)`` pairs that
        ``step()`` then applies (change them in place to change the update; every rank calls it)."""
        if self._pending is None:
            raise RuntimeError("ddp.DistributedOptimizer.synchronize: no gradients; call opt.backward(loss) first")
        return self._pending.synchronize()

    def clip_grad_norm(self, max_norm, norm_type=2.0) -> float:
        """Clips the averaged gradients of the last ``backward`` by their global norm before ``step()``;
        returns the norm before clipping, the same on every rank (see opt.clip_grad_norm)."""
        if self._pending is None:
            raise RuntimeError("ddp.DistributedOptimizer.clip_grad_norm: no gradients; call opt.backward(loss) "
                               "first")
        return self._pending.clip_grad_norm(max_norm, norm_type)

    def step(self, loss=None) -> None:
        """Applies the averaged gradients of the last ``backward`` (of `loss` first, when given)."""
        if loss is not None:
            self.backward(loss)
        if self._pending is None:
            raise RuntimeError("ddp.DistributedOptimizer.step: no gradients; call opt.backward(loss) first (the "
                               "Needle's loss.backward()), or opt.step(loss)")
        pending, self._pending = self._pending, None
        pending.finish()

    __call__ = step

    def reset_grad(self) -> None:
        """Drops the gradients of a backward that was not stepped (their exchange is completed first, so the
        ranks stay in step). Needle's ``reset_grad``; singa_lite gradients never accumulate across passes."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.discard()

    zero_grad = reset_grad

    def register_comm_hook(self, state, hook) -> None:
        """``hook(state, bucket)`` reduces each bucket of the exchange instead of the plain all-reduce (once,
        before the first backward); see DistOpt.register_comm_hook."""
        self._dist.register_comm_hook(state, hook)

    def no_sync(self):
        """Backward passes inside only accumulate gradients on this rank (see DistOpt.no_sync)."""
        return self._dist.no_sync()

    def join(self, divide_by_initial_world_size: bool = False):
        """A context for uneven inputs: ranks out of data answer the others' exchanges (see DistOpt.join)."""
        if self._pending is not None:
            raise RuntimeError("ddp.DistributedOptimizer.join: the gradients of a backward were not used; call "
                               "step() or reset_grad() first")
        return self._dist.join(divide_by_initial_world_size)

    def get_states(self) -> dict:
        return self._dist.get_states()

    def set_states(self, states: dict) -> None:
        self._dist.set_states(states)
