"""Restart and resume in a few lines of a training loop: the state of a job that its launcher restarts after a
failure (``singa-run --max-restarts``, ``torchrun --max-restarts``, Slurm ``--requeue``, a Kubernetes elastic
PyTorchJob), on the same or another number of ranks.

    sampler = ElasticSampler(len(x), dist_opt.global_rank, dist_opt.world_size, batch_size=32, seed=0)
    state = ElasticState("ckpt", model=model, optimizer=dist_opt, sampler=sampler, every=50)
    start = state.resume()                       # where to start: a fresh job, or the last commit
    for epoch in range(start.epoch, epochs):
        sampler.set_epoch(epoch)                 # keeps the resumed cursor in the resumed epoch
        for idx in sampler:
            train_step(x[idx], y[idx])
            state.step()                         # commits every `every` steps (collective)
        state.commit()                           # and at the end of the epoch

:meth:`ElasticState.resume` restores, when the directory holds a commit: the parameters and buffers, the
optimizer's state, DistOpt's (partial-update counter, skipped steps, the residuals of sparse updates), a
loss scaler's, the sampler's epoch and cursor, the random generators (devices' and a numpy Generator) and
the caller's ``extra``; and it reshards when the number of ranks changed (singa_lite.checkpoint.load with
``reshard=True``: every rank from rank 0's model and optimizer, residuals averaged; the random generators are
then left as the script seeded them, since N streams cannot become M). With an
:class:`~singa_lite.data.ElasticSampler` the samples are exact across any change: the commit holds the
job's cursor into the epoch's permutation, so the resumed job consumes exactly the indices the interrupted
one had not committed.

What a failure loses: the steps after the last commit (they are trained again, on the same samples), and
whatever the script keeps outside these objects.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..checkpoint_io import CheckpointError, read_json_file
from ..comm.env import generation as launcher_generation
from .periodic import PeriodicCommit, check_every

KEY = "elastic"  # the key of this module's record in the checkpoint's extra


@dataclass
class Resume:
    """Where a (re)started job begins: ``epoch`` (the sampler's epoch, else 0) and ``step`` (steps committed
    so far, all epochs); ``resumed``: whether a commit was loaded; ``saved_world_size``: the number of ranks
    that committed it; ``generation``: the launcher's restart count of this process; ``extra``: what the
    caller passed to commit()."""

    epoch: int = 0
    step: int = 0
    resumed: bool = False
    saved_world_size: int | None = None
    generation: int = 0
    extra: dict = field(default_factory=dict)


class ElasticState(PeriodicCommit):
    """The training state of a restartable job, committed to the directory `path` (see the module).

    model: a Layer/Model, or a dict of named tensors; optimizer: an Optimizer or a DistOpt (then resume and
    commit are collective); sampler: an ElasticSampler (exact resume) or a DistributedSampler (its position
    is rescaled when the number of ranks changes); rng: a numpy Generator; scaler: a loss scaler (anything
    with get_states / set_states, such as opt.LossScaler); every: commit every `every` calls of step()
    (None: only when commit() is called); communicator: for a collective commit without a DistOpt; log: where
    rank 0 says what it resumed (a function of one string; None for silence)."""

    def __init__(self, path, model=None, optimizer=None, sampler=None, rng=None, scaler=None, every=None,
                 communicator=None, log=print):
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise TypeError(f"ElasticState: path must name a directory for the commits, got {path!r}")
        check_every(every, "ElasticState")
        if scaler is not None and not (hasattr(scaler, "get_states") and hasattr(scaler, "set_states")):
            raise TypeError(f"ElasticState: scaler must have get_states() and set_states() (opt.LossScaler), got "
                            f"{type(scaler).__name__}")
        if log is not None and not callable(log):
            raise TypeError(f"ElasticState: log must be a function of one string or None, got {log!r}")
        self.path = os.fspath(path)
        self.model, self.optimizer, self.sampler, self.rng, self.scaler = model, optimizer, sampler, rng, scaler
        self.every, self.communicator, self.log = every, communicator, log
        self.steps = 0  # steps taken so far, all epochs (committed with the state)
        self.generation = launcher_generation()
        self.committed_step = None  # the step of the last commit this process made or loaded

    @property
    def rank(self) -> int:
        comm = self.communicator if self.communicator is not None else getattr(self.optimizer, "communicator", None)
        return comm.rank if comm is not None else 0

    @property
    def world_size(self) -> int:
        comm = self.communicator if self.communicator is not None else getattr(self.optimizer, "communicator", None)
        return comm.world_size if comm is not None else 1

    def has_commit(self) -> bool:
        from . import MANIFEST  # at call time, as save and load: the package imports this module

        return os.path.isfile(os.path.join(self.path, MANIFEST))

    def resume(self) -> Resume:
        """Loads the last commit when `path` holds one (collective; after Model.compile and the first
        broadcast of parameters), else changes nothing; returns where to start."""
        if not self.has_commit():
            if self.rank == 0 and self.log is not None:
                self.log(f"elastic: no commit in {self.path}: starting from the beginning (generation "
                         f"{self.generation}, {self.world_size} rank(s))")
            return Resume(epoch=getattr(self.sampler, "epoch", 0), generation=self.generation)
        from . import load  # at call time: the package imports this module at its end

        saved_world = self._saved_world_size()
        scaler_before = self.scaler.get_states() if self.scaler is not None else None
        extra = load(self.path, self.model, self.optimizer, self.sampler, self.rng, communicator=self.communicator,
                     reshard=True) or {}
        record = extra.get(KEY)
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise CheckpointError(f"{self.path}: the checkpoint was not written by ElasticState.commit (its extra "
                                  f"has no {KEY!r} record); load it with checkpoint.load")
        if self.scaler is not None:
            if record.get("scaler") is None:
                raise CheckpointError(f"{self.path}: holds no loss scaler state, but a scaler was given")
            try:
                self.scaler.set_states(record["scaler"])
            except (TypeError, ValueError) as e:
                self.scaler.set_states(scaler_before)
                raise CheckpointError(f"{self.path}: the loss scaler refused the saved state: {e}") from None
        self.steps = self.committed_step = record["step"]
        epoch = getattr(self.sampler, "epoch", record.get("epoch", 0))
        where = f"epoch {epoch}" + (f", cursor {self.sampler.cursor} of {self.sampler.num_samples}"
                                    if hasattr(self.sampler, "cursor") else "")
        if self.rank == 0 and self.log is not None:
            change = "" if saved_world == self.world_size else f", resharded from {saved_world} rank(s)"
            self.log(f"elastic: resumed from the commit at step {self.steps} ({where}) in {self.path}: generation "
                     f"{self.generation}, {self.world_size} rank(s){change}")
        return Resume(epoch=epoch, step=self.steps, resumed=True, saved_world_size=saved_world,
                      generation=self.generation, extra=record.get("user") or {})

    def _saved_world_size(self):
        from . import MANIFEST

        try:
            manifest = read_json_file(os.path.join(self.path, MANIFEST), limit=16 << 20)
        except (CheckpointError, OSError):
            return None  # load() reports what is wrong with it
        return manifest.get("world_size") if isinstance(manifest, dict) else None

    def commit(self, extra=None) -> None:
        """Saves the whole state now (collective), atomically: a failure at any moment leaves the previous
        commit loadable. extra: the caller's JSON data and numpy arrays, returned by resume() as
        ``Resume.extra``."""
        from . import save  # at call time: the package imports this module at its end

        record = {"step": self.steps, "generation": self.generation, "world_size": self.world_size,
                  "epoch": getattr(self.sampler, "epoch", 0),
                  "scaler": self.scaler.get_states() if self.scaler is not None else None,
                  "user": extra if extra is not None else {}}
        save(self.path, self.model, self.optimizer, self.sampler, self.rng, extra={KEY: record},
             communicator=self.communicator)
        self.committed_step = self.steps

    def __repr__(self) -> str:
        return (f"ElasticState({self.path!r}, step={self.steps}, every={self.every}, generation={self.generation}, "
                f"last commit at step {self.committed_step})")

