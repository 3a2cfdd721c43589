"""A sampler whose position survives a restart exactly, on the same or another number of ranks.

:class:`ElasticSampler` deals each epoch's permutation of ``range(num_samples)`` out step by step: the
step at global cursor ``c`` takes the next ``batch_size * world_size`` indices of the permutation
(``order[c:c + batch_size * world_size]``) and rank r gets the r-th of ``world_size`` consecutive slices
of them. Its state is ``(epoch, cursor)``: how many indices of the epoch's permutation the job as a whole
has consumed. That number does not depend on the number of ranks, so a job resumed on any number of ranks
(or with another batch size) continues with exactly the indices the interrupted one had not consumed:
across a failure, every sample of the epoch is used once, none skipped, none twice.

    sampler = ElasticSampler(len(x), rank, world_size, batch_size=32, seed=0)
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)               # keeps a resumed cursor when `epoch` is the resumed one
        for idx in sampler:                    # this rank's indices of one step
            step(x[idx], y[idx])

The last step of an epoch has fewer than ``batch_size * world_size`` indices left; they are split as evenly
as possible (``numpy.array_split``), so the ranks' batches differ by at most one sample, and a rank gets an
empty batch only when fewer indices than ranks are left (pick ``num_samples`` so that this cannot happen,
or skip the forward pass but still take part in the collectives).

Every rank must consume the same number of steps before a commit: the cursor is the job's, not a rank's
(:class:`singa_lite.checkpoint.ElasticState` commits it with the model at a step every rank has reached).
"""
from __future__ import annotations

import numpy as np

from .partition import DistributedSampler, check_integer, check_sampler

STATE_KEYS = ("epoch", "cursor", "num_samples", "seed", "shuffle", "world_size", "batch_size")


class ElasticSampler:
    """This rank's indices of each step of an epoch, from a cursor the whole job shares (see the module)."""

    def __init__(self, num_samples, rank, world_size, batch_size, shuffle=True, seed=0):
        self.num_samples, self.rank, self.world_size, self.seed = check_sampler(num_samples, rank, world_size, seed)
        self.batch_size = check_integer("batch_size", batch_size, lo=1)
        if not isinstance(shuffle, (bool, np.bool_)):
            raise TypeError(f"shuffle must be True or False, got {shuffle!r}")
        self.shuffle = bool(shuffle)
        self.epoch = 0
        self.cursor = 0  # indices of this epoch's permutation consumed by the job (all ranks together)
        self._order_cache = None  # (epoch, order)

    @property
    def step_size(self) -> int:
        """Indices one step of the whole job consumes (the last step of an epoch may take fewer)."""
        return self.batch_size * self.world_size

    def set_epoch(self, epoch, cursor=None) -> None:
        """Selects epoch `epoch`'s permutation (the same on every rank). `cursor`: where in it to go on;
        None keeps the current cursor when `epoch` is the current epoch (a resumed one) and means 0 for
        another epoch."""
        epoch = check_integer("epoch", epoch, lo=0)
        if cursor is None:
            cursor = self.cursor if epoch == self.epoch else 0
        self.cursor = check_integer("cursor", cursor, lo=0, hi=self.num_samples)
        self.epoch = epoch

    def order(self) -> np.ndarray:
        """The epoch's permutation of all samples: DistributedSampler's, from (seed, epoch), so it is the same
        on every rank whatever its numpy version."""
        if self._order_cache is None or self._order_cache[0] != (self.epoch, self.seed, self.shuffle):
            helper = DistributedSampler(self.num_samples, 0, 1, shuffle=self.shuffle, seed=self.seed)
            helper.set_epoch(self.epoch)
            self._order_cache = ((self.epoch, self.seed, self.shuffle), helper.order())
        return self._order_cache[1]

    def step_indices(self, cursor: int | None = None, rank: int | None = None) -> np.ndarray:
        """The indices rank `rank` (default this one) takes at the step that starts at `cursor` (default the
        current one): its slice of ``order[cursor:cursor + step_size]``."""
        cursor = self.cursor if cursor is None else cursor
        rank = self.rank if rank is None else rank
        chunk = self.order()[cursor:cursor + self.step_size]
        if len(chunk) == self.step_size:
            return chunk[rank * self.batch_size:(rank + 1) * self.batch_size]
        return np.array_split(chunk, self.world_size)[rank]

    def __len__(self) -> int:
        """Steps left in this epoch (the same on every rank)."""
        return -(-(self.num_samples - self.cursor) // self.step_size)

    def __iter__(self):
        def generate():
            while self.cursor < self.num_samples:
                idx = self.step_indices()
                # counted before the yield: a commit taken in the loop body includes this step
                self.cursor = min(self.cursor + self.step_size, self.num_samples)
                yield idx

        return generate()

    def batches(self, x, y):
        """``(x[idx], y[idx])`` for each step's indices of this rank."""
        n = len(x)
        if n != self.num_samples or len(y) != n:
            raise ValueError(f"ElasticSampler.batches: the sampler was made for {self.num_samples} samples, got "
                             f"x of {n} and y of {len(y)}")
        return ((x[idx], y[idx]) for idx in self)

    # ----- checkpoints (the interface singa_lite.checkpoint uses)
    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "num_samples": self.num_samples, "seed": self.seed,
                "shuffle": self.shuffle, "world_size": self.world_size, "batch_size": self.batch_size}

    def check_state(self, state) -> None:
        """ValueError, changing nothing, when `state` cannot continue in this sampler: another dataset size,
        seed or shuffle. The number of ranks and the batch size may differ: the cursor is the job's."""
        if not isinstance(state, dict):
            raise ValueError(f"ElasticSampler: expected a state dict (from state_dict()), got {type(state).__name__}")
        if "cursor" not in state:
            raise ValueError(f"ElasticSampler: the state has no 'cursor' (keys: {sorted(state)}); was it saved by a "
                             f"DistributedSampler? Resume with the kind of sampler that saved it")
        for key in ("num_samples", "seed", "shuffle"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"ElasticSampler: the state has {key}={state.get(key)!r}, this sampler "
                                 f"{getattr(self, key)!r}; make the sampler as in the saved run")
        check_integer("epoch", state.get("epoch"), lo=0)
        check_integer("cursor", state.get("cursor"), lo=0, hi=self.num_samples)

    def load_state_dict(self, state) -> None:
        self.check_state(state)
        self.set_epoch(state["epoch"], cursor=state["cursor"])

    def resharded_state(self, state) -> dict:
        """A state saved on another number of ranks, for this one: the same epoch and cursor (exact, since the
        cursor counts the job's indices, not a rank's)."""
        self.check_state(state)
        return {**state, "world_size": self.world_size, "batch_size": self.batch_size}

    def __repr__(self) -> str:
        return (f"ElasticSampler(num_samples={self.num_samples}, rank={self.rank}, world_size={self.world_size}, "
                f"batch_size={self.batch_size}, shuffle={self.shuffle}, seed={self.seed}; epoch={self.epoch}, "
                f"cursor={self.cursor})")
