"""What the two elastic states share: counting steps and committing every `every` of them.

checkpoint.ElasticState commits to a directory (restarts), dist.elastic.State in memory (in-process
elasticity); each defines commit()."""
from __future__ import annotations


def check_every(every, who: str):
    """`every` as given: None (commit only when asked) or a number of steps >= 1; else ValueError."""
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise ValueError(f"{who}: every must be None or a number of steps >= 1, got {every!r}")
    return every


class PeriodicCommit:
    """A state that counts steps (`steps`) and commits every `every` of them (None: only on commit())."""

    every = None
    steps = 0

    def commit(self, extra=None) -> None:
        raise NotImplementedError

    def step(self, extra=None) -> bool:
        """Counts a training step and commits every `every` steps (collective: every rank calls it at the same
        steps). Returns whether it committed."""
        self.steps += 1
        if self.every is not None and self.steps % self.every == 0:
            self.commit(extra)
            return True
        return False
