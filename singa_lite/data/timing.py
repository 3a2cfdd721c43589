"""How long the training thread waited for its data: the "data" part of a step in the straggler report
(parallel/straggler.py). singa_lite's own readers count themselves (``batches``, ``ImageBatchIter``); a loader
of one's own is counted by wrapping it::

    for x, y in data.timed(my_loader):      # each next() counts as data loading
        ...
    with data.loading():                    # or any block
        x, y = fetch()

The count is one number per process, read by the report at the ends of the steps (``seconds()``): a few clock
reads per batch, whatever else runs.
"""
from __future__ import annotations

import contextlib
import time

__all__ = ["loading", "timed", "seconds"]

now = time.perf_counter  # the clock every count uses
total = 0.0  # seconds spent loading data in this process so far (read it; add() counts)


def seconds() -> float:
    """Seconds spent loading data in this process so far (a running total: take differences)."""
    return total


def add(seconds_spent: float) -> None:
    """Counts `seconds_spent` as data loading (for readers that time themselves)."""
    global total
    total += seconds_spent


@contextlib.contextmanager
def loading():
    """The block counts as data loading."""
    t0 = now()
    try:
        yield
    finally:
        add(now() - t0)


def timed(iterable):
    """Yields what `iterable` yields; the time each item took to come counts as data loading."""
    it = iter(iterable)
    while True:
        t0 = now()
        try:
            item = next(it)
        except StopIteration:
            add(now() - t0)
            return
        add(now() - t0)
        yield item
