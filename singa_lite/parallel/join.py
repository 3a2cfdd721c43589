"""Uneven inputs: ``with dist_opt.join():`` lets ranks whose data ran out keep answering the collectives of
the ranks that still train, so the job ends cleanly instead of hanging or failing in a collective
(PyTorch DDP's ``join()``, Horovod's ``hvd.join()``)::

    sgd = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9))
    with sgd.join():
        for x, y in my_shard:                 # ranks may have different numbers of batches
            sgd.backward_and_update(loss_fn(model(x), y))
    # every rank gets here once all of them are out of data

Inside the block, every exchanging pass begins with one vote (an all-reduce of one int32: 1 for a rank that
trains). A rank that leaves the block keeps voting 0 and, for each pass the others make, sends zeros in the
buckets of its own last exchanging pass (same sizes, same order: same model, same threshold; with
``find_unused_parameters=True`` it takes part in the used-mask all-reduce with an empty mask and sends zeros
for the parameters the others used in that pass, in the declared order), takes part in
the vote on finiteness and applies the same averaged gradients with its optimizer, so its parameters and
optimizer state stay those of the others. When a vote counts 0, every rank has left and all leave together.

Averaging: the gradients are divided by the number of ranks that contributed to that pass (the mean over the
batches that exist), not by the world size: ``join(divide_by_initial_world_size=True)`` divides by the world
size instead (PyTorch DDP's default there; joined ranks then count as zero gradients).

Limits: every rank must enter the block and make at least one exchanging pass in it before running out (its
buckets are what it repeats), and use one threshold for all passes; backward_and_update, _half and the
two-phase step are followed (gradient accumulation too: only exchanging passes vote); the partial and sparse
updates and the low-level calls (all_reduce...) are refused or not followed inside the block. Other
collectives the training ranks make (SyncBatchNorm2d, sync_buffers, a metric's all-reduce) are not answered:
keep them outside the block or make them on every rank.
"""
from __future__ import annotations

import warnings

import numpy as np

from .. import _core, tensor

CTensor = _core.Tensor
_CPU = _core.Device("cpu")


def zero_gradient(shape, dtype, where) -> tensor.Tensor:
    """A gradient of zeros: what a rank sends for a parameter it gave no gradient (a rank out of data here, a
    parameter its forward did not use in unused.py)."""
    z = tensor.Tensor(data=CTensor(list(shape), dtype, where), requires_grad=False)
    _core.fill_(z.data, 0)
    return z


class Join:
    """The context ``DistOpt.join()`` returns; see the module. reducer: the DistOpt's (reducer.py), whose
    public methods are all this uses."""

    def __init__(self, reducer, divide_by_initial_world_size: bool = False):
        self._reducer = reducer
        self.divide_by_initial_world_size = bool(divide_by_initial_world_size)
        self.layout = None  # (threshold, first_bucket, wire dtype, device, [(shape, dtype)]) of the last exchange
        self.shadowed = 0  # passes this rank answered with zeros after leaving the block
        self._zeros = None  # (name, param, zero gradient) made from layout
        self._key = None  # layout with parameters by identity, to tell when it changed

    def __enter__(self):
        r = self._reducer
        if r.join is not None:
            raise RuntimeError("DistOpt.join: already inside a join() block of this DistOpt; they do not nest")
        r.require_no_open_step("join")
        r.join = self
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self._answer_until_all_left()
        finally:
            self._reducer.join = None
        return False

    # ----- the training ranks' side
    def vote(self, training: bool) -> int:
        """One all-reduce: how many ranks still train (this one counts if `training`)."""
        comm = self._reducer.communicator
        where = getattr(getattr(comm, "device", None), "core", None) or _CPU
        flag = CTensor.from_buffer(np.array([1 if training else 0], np.int32))
        flag = flag if where.is_cpu() else flag.to(where)
        comm.all_reduce(flag, "sum")
        return int(np.asarray(flag if flag.device.is_cpu() else flag.to(_CPU))[0])

    def record(self, threshold: int, first_bucket: int, wire, triples) -> None:
        """Remembers the buckets of an exchanging pass (what a rank out of data repeats with zeros) and the
        parameters they update."""
        members = [(name, p, list(g.data.shape), g.data.dtype) for name, p, g in triples]
        where = triples[0][2].data.device if triples else _CPU
        key = (threshold, first_bucket, wire, where, [(n, id(p), shape, dt) for n, p, shape, dt in members])
        if key != self._key:  # a new layout: the zero gradients are made again at the next answer
            self._key, self._zeros = key, None
            self.layout = (threshold, first_bucket, wire, where, members)

    def factor(self, contributors: int) -> float | None:
        """What the averaged gradients are multiplied by (the fused exchange divides by the world size), or
        None for nothing."""
        world = self._reducer.world_size
        if self.divide_by_initial_world_size or contributors in (0, world):
            return None
        return world / contributors

    # ----- the side of a rank out of data
    def _answer_until_all_left(self) -> None:
        """Each pass the others make: zeros into the same buckets, then the same update with the average
        they get (so this replica and its optimizer state stay the same as theirs), until all have left."""
        r = self._reducer
        acc = r.accumulator
        if not acc.empty:
            warnings.warn(f"DistOpt.join: rank {r.rank} left the join() block with {acc.passes} "
                          f"accumulated backward pass(es) not exchanged; they are dropped (end the block after "
                          f"an updating pass)", RuntimeWarning, stacklevel=3)
            acc.clear()
        while True:
            contributors = self.vote(False)
            if contributors == 0:
                return
            if self.layout is None:
                raise RuntimeError(f"DistOpt.join: rank {r.rank} left the join() block before making any "
                                   f"exchanging pass in it, so it does not know the buckets to answer with; give "
                                   f"every rank at least one batch (the others will time out)")
            threshold, first_bucket, wire, where, members = self.layout
            used = getattr(r, "unused", None)
            if used is not None:
                # find_unused_parameters: the others' buckets hold the parameters some rank used this pass; this
                # rank's used-mask (all zeros) joins their all-reduce and yields zeros for exactly those
                zeros = used.complete([], r.opt.name_of)
            else:
                if self._zeros is None:
                    self._zeros = [(name, p, zero_gradient(shape, dtype, where))
                                   for name, p, shape, dtype in members]
                for _, _, z in self._zeros:
                    _core.fill_(z.data, 0)  # the last answer left the average in them
                zeros = self._zeros
            # the same buckets as the ranks that train, then the averaged gradients, the vote, the update
            r.answer(r.fused(wire), zeros, threshold, first_bucket, self.factor(contributors))
            self.shadowed += 1
