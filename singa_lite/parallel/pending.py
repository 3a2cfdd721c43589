"""The fused step between its two phases (``DistOpt.backward(loss)`` -> :class:`PendingStep`): waiting for the
exchange, the averaged gradients, then the update or the discard. The reducer (reducer.py) makes it; it moves
the step forward through the reducer's public methods (complete, apply, drop, release) and nothing else."""
from __future__ import annotations

import time

from .. import timeline
from ..optim.clip import clip_grad_norm
from .step_stats import BACKWARD, WAIT

__all__ = ["PendingStep"]


class PendingStep:
    """A fused step between its two phases: what ``DistOpt.backward(loss)`` returns.

    The backward pass is over and its gradients' all-reduce is under way. ``synchronize()`` waits for it and
    returns the averaged gradients; ``finish()`` applies them (synchronizing first when that was not done);
    ``discard()`` completes the exchange and drops them. Every rank must make the same calls in the same
    order: synchronize() ends with a collective vote on whether the averaged gradients are finite.

    A pass of gradient accumulation that exchanges nothing (``accumulating``; no exchange) gives no pairs:
    finish() adds its gradients to this rank's sums, discard() drops them.

    Made by the reducer (reducer.py: ``reducer``, which imports this module, so it is not annotated here), with
    the ``fusion.Fuser`` of the exchange under way (``exchange``; None for a pass that only accumulates).
    """

    def __init__(self, reducer, exchange, triples: list, scale: float | None = None,
                 joined: bool = False):
        self._reducer, self._exchange, self._triples = reducer, exchange, triples
        self._scale = scale  # join(): world size / ranks that contributed (None: the plain average)
        self._joined = joined  # made inside join(): a rank out of data takes part in the finiteness vote
        self._state = "exchanging"  # -> "synchronized" -> "finished"; or -> "discarded"
        self._finite = None

    def __repr__(self):
        what = ", accumulating" if self.accumulating else ""
        return f"PendingStep({len(self._triples)} gradients, {self._state}{what})"

    @property
    def accumulating(self) -> bool:
        """Whether this pass only accumulates its gradients on this rank (no exchange, no update)."""
        return self._exchange is None

    @property
    def state(self) -> str:
        """"exchanging", "synchronized", "finished" or "discarded"."""
        return self._state

    @property
    def skipped(self) -> bool | None:
        """After synchronize(): whether the step is skipped because an averaged gradient is not finite
        (on_nonfinite="skip"; the same answer on every rank). None before."""
        return None if self._finite is None else not self._finite

    def synchronize(self) -> list:
        """Waits for the exchange; returns the averaged gradients as ``(param, grad)`` pairs in backward
        order (the same values on every rank). The grads are the tensors finish() applies: change them in
        place (``grad.data``, or tensor methods that write into it) to change the update. Whether the step
        is skipped for a non-finite average is decided here, from the gradients as exchanged (with
        on_nonfinite="raise": FloatingPointError here, and the step is over). Calling it again returns the
        same pairs."""
        if self._state == "synchronized":
            return self.gradients
        self._require("exchanging", "synchronize")
        if self.accumulating:
            self._finite, self._state = True, "synchronized"
            return []
        self._reducer.charge(BACKWARD)  # whatever ran since backward() (usually nothing)
        try:
            self._finite = self._reducer.complete(self._exchange, self._triples, self._scale)
        except BaseException:
            self._close("finished")  # the step cannot be applied; the DistOpt takes a new backward
            self._reducer.step_over(completed=False)
            raise
        self._reducer.charge(WAIT)
        self._triples = self._reducer.kept(self._triples)  # ZeRO stage 2: this rank's shard only
        self._state = "synchronized"
        return self.gradients

    def clip_grad_norm(self, max_norm, norm_type=2.0) -> float:
        """Scales the averaged gradients so that their global norm is at most max_norm (synchronizing first
        when needed); returns the norm before clipping (the same on every rank: the averaged gradients are).
        A pass that only accumulates has no gradients to clip: 0."""
        pairs = self.synchronize()
        if not self.accumulating:
            sharded = self._reducer.clip_grad_norm(pairs, max_norm, norm_type)  # ZeRO stage 2: across shards
            if sharded is not None:
                return sharded
        return clip_grad_norm(pairs, max_norm, norm_type)

    @property
    def gradients(self) -> list:
        """The averaged ``(param, grad)`` pairs (after synchronize())."""
        if self._state != "synchronized":
            raise RuntimeError(f"PendingStep.gradients: not available while the step is {self._state}; the "
                               f"averaged gradients exist between synchronize() and finish()")
        return [] if self.accumulating else [(p, g) for _, p, g in self._triples]

    def finish(self) -> None:
        """Applies the averaged gradients with one update of the wrapped optimizer (synchronizing first when
        synchronize() was not called), unless the step is skipped. The step is then over."""
        if self._state == "exchanging":
            self.synchronize()
        self._require("synchronized", "finish")
        completed = False
        try:
            if self.accumulating:
                self._reducer.accumulator.add(self._triples)
            elif self._finite:
                t0 = time.perf_counter()
                self._reducer.apply(self._triples)
                timeline.record("update", "update", t0, {"params": len(self._triples)})
            completed = True
        finally:
            self._close("finished")
            timeline.step_end()
            self._reducer.step_over(completed)  # the rest of the step is the update's; a report every N

    def discard(self) -> None:
        """Drops the gradients; their exchange is completed first (the other ranks made it too), so the
        ranks stay in step. Nothing is updated; nothing happens when the step is already over."""
        if self._state not in ("exchanging", "synchronized"):
            return
        completed = False
        try:
            if self._state == "exchanging" and not self.accumulating:
                self._reducer.drop(self._exchange, self._joined)  # ranks out of data vote too: ours
                self._reducer.charge(WAIT)
            completed = True
        finally:
            self._close("discarded")
            timeline.step_end()
            self._reducer.step_over(completed)

    def _require(self, state: str, what: str) -> None:
        if self._state != state:
            raise RuntimeError(f"PendingStep.{what}: the step is already {self._state}; each backward(loss) is "
                               f"finished (or discarded) once, then the next backward starts a new step")

    def _close(self, state: str) -> None:
        self._state = state
        self._reducer.release(self)
