"""Parameters a rank's forward did not use: ``DistOpt(..., find_unused_parameters=True, parameters=...)``
(PyTorch DDP's option of that name).

A model with rank-dependent branches (rank 0 takes branch A, rank 1 branch B, both a shared trunk) gives each
rank's backward gradients for different parameters, so the ranks' fused buckets would differ. With the option
on, after each exchanging backward pass (accumulated passes merged in) every rank builds a used-mask over the
declared parameters (1: got a gradient in this pass) and the ranks add their masks up: one all-reduce of
``len(parameters) + 1`` int32 per step, as DDP's. Then, in the declared order (the same on every rank, whatever
order backward took):

- a parameter used on some rank goes into the buckets on every rank, as zeros where unused, so the average is
  (sum of the gradients that exist) / world_size, and every rank updates it identically; its optimizer state
  (momentum, Adam's moments) is updated as with that averaged gradient (the zeros count as a gradient of 0);
- a parameter used on no rank gets no gradient: no update and no change of its optimizer state (as DDP).

The pushing waits for the end of backward (the order must be the declared one, and the mask is known only
then): the exchange no longer overlaps backward in this mode (DDP loses part of its overlap too). Every mode
supports it:

- the fused ones (backward_and_update, _half, a comm hook, the two-phase step, gradient accumulation), as above;
- ``join()``: a rank out of data joins each pass's used-mask all-reduce with an empty mask and sends zeros for
  the parameters the others used (the average is then over the ranks that trained, as join() divides);
- ``backward_and_partial_update``: each rank updates the parameters some rank used with its own gradient
  (zeros where its forward did not use one; momentum moves it as with a zero gradient), then one partition
  of the whole declared set's values is averaged (partitions of the declared set, fixed across steps);
- ``backward_and_sparse_update``: the groups are formed over the step's completed gradients (the same on
  every rank) and the residuals are kept per parameter, so error feedback survives a change of branches (a
  parameter used on no rank keeps its residual untouched).

``parallel.DataParallel`` (hook-based) cannot: its hooks see only this rank's graph, so a parameter this
rank did not use gets no gradient to update with; it refuses the option and names DistOpt.

DistOpt learns its parameters from the backward graph, so it must be told the whole set: ``parameters=``
takes a dict name -> tensor (``Model.get_params()``) or a list of tensors; a Model whose optimizer is the
DistOpt supplies its own get_params() (read at the first step, once its lazily shaped parameters exist).
At the first step the ranks compare the declared set (names, shapes, dtypes, order) instead of the backward
order, and get rank 0's values of every declared parameter.
"""
from __future__ import annotations

import numpy as np

from .. import _core
from ..raw import from_host, to_host
from ..tensor import Tensor
from .join import zero_gradient

__all__ = ["UnusedParameters", "configure", "declared_parameters"]


def configure(find_unused_parameters, parameters, communicator, who: str):
    """The UnusedParameters of a DistOpt constructed with these arguments, or None (the option off)."""
    if not isinstance(find_unused_parameters, bool):
        raise TypeError(f"{who}: find_unused_parameters must be True or False, got {find_unused_parameters!r}")
    if not find_unused_parameters:
        if parameters is not None:
            raise ValueError(f"{who}: parameters= declares the set find_unused_parameters=True works on; pass "
                             f"find_unused_parameters=True with it (or drop parameters=)")
        return None
    return UnusedParameters(communicator, parameters, who)


def declared_parameters(parameters, who: str) -> list:
    """[(name, tensor)] of what parameters= may be: a dict name -> Tensor (Model.get_params()) or a list or
    tuple of Tensors (named by their names, else param<i>)."""
    if isinstance(parameters, dict):
        named = list(parameters.items())
    elif isinstance(parameters, (list, tuple)):
        named = [(p.name if isinstance(p, Tensor) and p.name else f"param{i}", p) for i, p in enumerate(parameters)]
    else:
        raise TypeError(f"{who}: parameters= must be a dict name -> tensor (model.get_params()) or a list of "
                        f"tensors, got {type(parameters).__name__}")
    seen = {}
    for name, p in named:
        if not isinstance(p, Tensor):
            raise TypeError(f"{who}: parameters= must hold tensor.Tensor, got {type(p).__name__} for {name!r}")
        if id(p) in seen:
            raise ValueError(f"{who}: parameters= holds one tensor twice ({seen[id(p)]!r} and {name!r})")
        seen[id(p)] = name
    if not named:
        raise ValueError(f"{who}: parameters= is empty; find_unused_parameters=True needs every parameter of "
                         f"the model (model.get_params())")
    return named


class UnusedParameters:
    """One rank's used-mask over the declared parameters (see the module)."""

    def __init__(self, communicator, parameters, who: str):
        self.comm, self.who = communicator, who
        self.declared = None if parameters is None else declared_parameters(parameters, who)
        self.source = None  # a Model's get_params when parameters= was not given (Model.set_optimizer)
        self.counts = None  # after a step: how many ranks used each declared parameter (numpy int32)
        self._index = None  # id(param) -> position in declared
        self._zeros = {}  # id(param) -> its zero gradient, refilled each step

    def adopt(self, get_params) -> None:
        """A Model's get_params, used when parameters= was not given."""
        if self.declared is None:
            self.source = get_params

    def resolve(self) -> list:
        """[(name, param)] declared: parameters=, or the Model's get_params() read once."""
        if self.declared is None:
            if self.source is None:
                raise ValueError(f"{self.who}: find_unused_parameters=True needs the model's whole set of "
                                 f"parameters: pass parameters=model.get_params() (or a list of the tensors), or "
                                 f"use this DistOpt as a Model's optimizer (model.set_optimizer), which supplies it")
            self.declared = declared_parameters(self.source(), self.who)
        if self._index is None:
            self._index = {id(p): i for i, (_, p) in enumerate(self.declared)}
        return self.declared

    def complete(self, triples, name_of) -> list:
        """The pass's (name, param, grad), in the declared order, for the parameters some rank used: this
        rank's gradient, or zeros where its forward did not use the parameter. One all-reduce (every rank).
        name_of: the optimizer's name for a parameter (what opt.apply keys its state by)."""
        declared = self.resolve()
        mine, stray = {}, []
        for name, p, g in triples:
            i = self._index.get(id(p))
            if i is None:
                stray.append(name)
            else:
                mine[i] = (name, p, g)
        mask = np.zeros(len(declared) + 1, np.int32)  # the last entry: ranks with undeclared gradients
        mask[list(mine)] = 1
        mask[-1] = 1 if stray else 0
        t = from_host(mask, declared[0][1].data.device)
        self.comm.all_reduce(t, "sum")
        counts = to_host(t)
        if counts[-1]:
            said = (f"{', '.join(stray)} got a gradient on this rank (rank {self.comm.rank})" if stray else
                    f"{int(counts[-1])} other rank(s) had gradients for parameters it lacks (their errors name them)")
            raise ValueError(f"{self.who}: parameters= (find_unused_parameters=True) must declare every parameter "
                             f"the model has: {said}; pass model.get_params()")
        self.counts = counts[:-1]
        out = []
        for i, (_, p) in enumerate(declared):
            if not self.counts[i]:
                continue  # used on no rank: no gradient, no update
            if i in mine:
                out.append(mine[i])
                continue
            z = self._zeros.get(id(p))
            if z is None:
                z = self._zeros[id(p)] = zero_gradient(p.data.shape, p.data.dtype, p.data.device)
            else:
                _core.fill_(z.data, 0)  # the last step left an average in it
            out.append((name_of(p), p, z))
        return out
