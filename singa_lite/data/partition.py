"""Splitting a dataset between the ranks of a data-parallel job. No communication is needed: every rank
computes the same split from the same arguments.

- :func:`data_partition` is SINGA's (its distributed-training page): rank r takes the r-th of
  ``world_size`` contiguous, equal slices, the same slice every epoch; the last ``n % world_size`` samples
  go to nobody.
- :class:`DistributedSampler` reshuffles every epoch, from a seed all ranks share, and deals each rank an
  equal share of the permutation; :func:`batches` turns a rank's share into mini-batches.

    sampler = DistributedSampler(len(train_x), rank, world_size, seed=0)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)                 # same permutation on every rank, a new one per epoch
        for xb, yb in batches(train_x, train_y, sampler, batch_size=64, drop_last=True):
            ...
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import timing


def check_integer(name: str, value, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def _length(name: str, data) -> int:
    shape = getattr(data, "shape", None)
    if shape is not None and len(shape) == 0:
        raise ValueError(f"{name} must have a first (sample) axis, got a 0-d array")
    try:
        return int(shape[0]) if shape is not None else len(data)
    except TypeError:
        raise TypeError(f"{name} must be an array or a sequence of samples, got {type(data).__name__}") from None


def data_partition(dataset_x, dataset_y, rank_in_global, world_size):
    """SINGA's contiguous partition, as on its distributed-training page::

        data_per_rank = dataset_x.shape[0] // world_size
        return (dataset_x[rank_in_global * data_per_rank:(rank_in_global + 1) * data_per_rank],
                dataset_y[rank_in_global * data_per_rank:(rank_in_global + 1) * data_per_rank])

    Every rank gets ``n // world_size`` samples (so every rank runs the same number of steps) as views of
    the inputs; the last ``n % world_size`` samples are left out. Unlike SINGA's, the arguments are checked:
    a TypeError or ValueError for a rank outside ``[0, world_size)``, ``world_size < 1``, x and y of
    different lengths, or fewer samples than ranks (every share would be empty)."""
    world_size = check_integer("world_size", world_size, lo=1)
    rank = check_integer("rank_in_global", rank_in_global, lo=0, hi=world_size - 1)
    n, n_y = _length("dataset_x", dataset_x), _length("dataset_y", dataset_y)
    if n != n_y:
        raise ValueError(f"data_partition: dataset_x has {n} samples but dataset_y has {n_y}")
    if n < world_size:
        raise ValueError(f"data_partition: {n} samples cannot be shared by {world_size} ranks "
                         f"(every share would be empty)")
    data_per_rank = n // world_size
    idx_start = rank * data_per_rank
    idx_end = (rank + 1) * data_per_rank
    return dataset_x[idx_start:idx_end], dataset_y[idx_start:idx_end]


def check_sampler(num_samples, rank, world_size, seed) -> tuple:
    """A sampler's (num_samples, rank, world_size, seed), checked: ints in range, the dataset's size (not
    the data itself). Shared by DistributedSampler and elastic_sampler.ElasticSampler."""
    world_size = check_integer("world_size", world_size, lo=1)
    rank = check_integer("rank", rank, lo=0, hi=world_size - 1)
    if hasattr(num_samples, "__len__"):
        raise TypeError(f"num_samples is the dataset's size (e.g. len(train_x)), not the data: "
                        f"got {type(num_samples).__name__}")
    return check_integer("num_samples", num_samples, lo=1), rank, world_size, check_integer("seed", seed, lo=0)


class DistributedSampler:
    """The indices of one rank's share of a dataset of ``num_samples`` samples, for the current epoch.

    Every epoch, all ranks compute the same order of ``range(num_samples)`` -- a permutation drawn from
    ``(seed, epoch)`` when `shuffle`, else the natural order -- and rank r takes the r-th of ``world_size``
    contiguous, equal blocks of it. ``len(sampler)`` is the same on every rank:

    - ``drop_last=False`` (default): ``ceil(num_samples / world_size)``. The order is padded to
      ``len * world_size`` by wrapping around to its start, so every sample is in some rank's share and
      the first ``len * world_size - num_samples`` (fewer than ``world_size``) of the order are in two.
    - ``drop_last=True``: ``num_samples // world_size``. The last ``num_samples % world_size`` of the
      order are left out, so the shares are disjoint; with `shuffle` a different few are left out each
      epoch. ``shuffle=False, drop_last=True`` gives exactly :func:`data_partition`'s slices.

    Call :meth:`set_epoch` at the start of every epoch, with the same value on every rank; without it
    every epoch repeats epoch 0's order. Iterating yields Python ints; :meth:`indices` gives the numpy
    array.

    Resuming mid-epoch: ``position`` counts the indices of this epoch's share handed out so far (by
    iteration or :func:`batches`, a batch counted as it is yielded). :meth:`state_dict` saves ``(epoch,
    position)``; :meth:`load_state_dict` (or ``set_epoch(epoch, position=k)``) makes the next pass start
    at the k-th index of the share, once: the pass after it is whole again. ``set_epoch`` with the epoch
    already set keeps a pending start, so the usual loop ``for epoch in range(sampler.epoch, epochs):
    sampler.set_epoch(epoch)`` resumes where the checkpoint was taken. The permutation is an argsort of raw
    PCG64 output seeded by ``SeedSequence([seed, epoch])``: numpy guarantees PCG64's stream for a fixed seed
    across versions (``Generator.permutation`` carries no such promise), so ranks on hosts with different
    numpy versions still agree.
    """

    def __init__(self, num_samples, rank, world_size, shuffle=True, seed=0, drop_last=False):
        self.num_samples, self.rank, self.world_size, self.seed = check_sampler(num_samples, rank, world_size, seed)
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        if self.drop_last and self.num_samples < self.world_size:
            raise ValueError(f"DistributedSampler: with drop_last=True, {self.num_samples} samples leave every one "
                             f"of {self.world_size} ranks empty; use drop_last=False (shares padded by "
                             f"repeating samples) or fewer ranks")
        self._per_rank = self._share(self.world_size)
        self.epoch = 0
        self.position = 0  # indices of this epoch's share handed out so far
        self._start = 0  # where the next pass starts (set when resuming; consumed by that pass)

    def _share(self, world_size: int) -> int:
        """Indices per rank when this dataset is shared by `world_size` ranks."""
        return self.num_samples // world_size if self.drop_last else math.ceil(self.num_samples / world_size)

    def set_epoch(self, epoch, position=None) -> None:
        """Selects the permutation of epoch `epoch` (an integer >= 0, the same on every rank). `position`:
        the next pass starts at this index of the share (0 <= position <= len); None keeps a pending start
        when `epoch` is the current epoch (after load_state_dict) and means 0 otherwise."""
        epoch = check_integer("epoch", epoch, lo=0)
        if position is None:
            position = self._start if epoch == self.epoch else 0
        position = check_integer("position", position, lo=0, hi=self._per_rank)
        self.epoch, self.position, self._start = epoch, position, position

    def state_dict(self) -> dict:
        """Where this sampler stands (epoch, position) and what it was made with, as plain JSON data."""
        return {"epoch": self.epoch, "position": self.position, "num_samples": self.num_samples,
                "world_size": self.world_size, "seed": self.seed, "shuffle": self.shuffle,
                "drop_last": self.drop_last}

    def load_state_dict(self, state: dict) -> None:
        """Resumes at what :meth:`state_dict` returned; the sampler must be made with the same arguments
        (the rank may differ: every rank's position is the same)."""
        self.check_state(state)
        self.set_epoch(state["epoch"], position=state["position"])

    def resharded_state(self, state: dict) -> dict:
        """A state saved by a sampler made for another ``world_size`` (same dataset, seed, shuffle, drop_last),
        turned into one for this sampler: the same epoch, and the same fraction of it done. Shares are
        contiguous blocks of the epoch's order, so the rest of that epoch is not exactly the samples the saved
        run had left: some are seen twice or not at all; the epochs after it are whole."""
        if not isinstance(state, dict):
            raise ValueError(f"DistributedSampler.resharded_state: expected a dict, got {type(state).__name__}")
        old_world = check_integer("world_size", state.get("world_size"), lo=1)
        old = {**state, "world_size": self.world_size, "position": 0}
        self.check_state(old)  # everything but the world size and the position must match
        old_per_rank = self._share(old_world)
        done = check_integer("position", state.get("position"), lo=0, hi=old_per_rank)
        old["position"] = min(self._per_rank, round(done * self._per_rank / old_per_rank)) if old_per_rank else 0
        return old

    def check_state(self, state: dict) -> None:
        """Raises ValueError, changing nothing, when `state` does not fit this sampler."""
        if not isinstance(state, dict):
            raise ValueError(f"DistributedSampler.load_state_dict: expected a dict, got {type(state).__name__}")
        for key in ("num_samples", "world_size", "seed", "shuffle", "drop_last"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"DistributedSampler.load_state_dict: the state has {key}={state.get(key)!r}, "
                                 f"this sampler {getattr(self, key)!r}; make the sampler as in the saved run")
        check_integer("epoch", state.get("epoch"), lo=0)
        check_integer("position", state.get("position"), lo=0, hi=self._per_rank)

    def order(self) -> np.ndarray:
        """The epoch's order of all samples, before padding or dropping (the same on every rank)."""
        if not self.shuffle:
            return np.arange(self.num_samples, dtype=np.int64)
        bits = np.random.PCG64(np.random.SeedSequence([self.seed, self.epoch]))
        return np.argsort(bits.random_raw(self.num_samples), kind="stable").astype(np.int64)

    def indices(self) -> np.ndarray:
        """This rank's indices for the current epoch that the next pass hands out, an int64 array of
        length ``len(self)`` (the whole share unless a resumed start is pending)."""
        total = self._per_rank * self.world_size
        order = np.resize(self.order(), total)  # drops the tail, or pads by wrapping around to the start
        return order[self.rank * self._per_rank + self._start:(self.rank + 1) * self._per_rank]

    def _begin_pass(self) -> tuple[np.ndarray, int]:
        """(indices of this pass, its first position); the pending start is used up."""
        idx, start = self.indices(), self._start
        self._start, self.position = 0, start
        return idx, start

    def __iter__(self):
        idx, start = self._begin_pass()

        def generate():
            for k, i in enumerate(idx.tolist()):
                self.position = start + k + 1
                yield i

        return generate()

    def __len__(self) -> int:
        return self._per_rank - self._start

    def __repr__(self) -> str:
        return (f"DistributedSampler(num_samples={self.num_samples}, rank={self.rank}, "
                f"world_size={self.world_size}, shuffle={self.shuffle}, seed={self.seed}, "
                f"drop_last={self.drop_last}; epoch={self.epoch}, {len(self)} per rank)")


def batches(x, y, sampler, batch_size, drop_last=False):
    """Yields ``(x[idx], y[idx])`` for consecutive chunks ``idx`` of `batch_size` indices of `sampler` (a
    :class:`DistributedSampler`, or any iterable of indices such as a numpy array). The last, shorter
    chunk is yielded too unless `drop_last` -- keep it off when a model needs a fixed batch shape. With a
    DistributedSampler every rank yields the same number of batches. Arguments are checked at the call,
    before the first batch."""
    batch_size = check_integer("batch_size", batch_size, lo=1)
    n, n_y = _length("x", x), _length("y", y)
    if n != n_y:
        raise ValueError(f"batches: x has {n} samples but y has {n_y}")
    if isinstance(sampler, DistributedSampler):
        if sampler.num_samples != n:
            raise ValueError(f"batches: the sampler was made for {sampler.num_samples} samples but x has {n}")
        idx, first = sampler._begin_pass()
    else:
        first = None
        idx = np.asarray(list(sampler) if not hasattr(sampler, "__array__") else sampler)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise TypeError(f"batches: sampler must give integer indices, got {idx.dtype} of shape {idx.shape}")
        idx = idx.astype(np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"batches: indices must lie in [0, {n}), got {idx.min()}..{idx.max()}")
    stop = len(idx) - len(idx) % batch_size if drop_last else len(idx)

    def generate():
        for start in range(0, stop, batch_size):
            t0 = timing.now()
            chunk = idx[start:start + batch_size]
            if first is not None:  # counted before the yield: a checkpoint taken in the loop body includes it
                sampler.position = first + start + len(chunk)
            batch = x[chunk], y[chunk]
            timing.add(timing.now() - t0)  # the straggler report's data loading (data/loading.py)
            yield batch

    return generate()
