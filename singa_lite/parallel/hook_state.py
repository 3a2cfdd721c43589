"""What the comm hooks share (parallel/hooks.py, parallel/powersgd.py): the plain hooks' state with its byte
counters, the handle a hook returns, and how a hook finds the group it reduces over. Its own module so that
hooks.py (which ships powerSGD_hook) and powersgd.py (which builds on these) do not import each other."""
from __future__ import annotations

from .bucket import GradBucket


class HookState:
    """The state of the plain hooks: the group to all-reduce over and what was sent.

    process_group: a Communicator, or None for each bucket's own (``bucket.communicator``).
    Counters (per rank, in bytes; a measurement compares them, e.g. against the plain all-reduce):
    ``bytes_sent``: the payload this rank handed to collectives (a ring all-reduce moves about
    2 (P-1)/P times that over each rank's link, the same factor for every hook); ``bytes_plain``: what the
    plain all-reduce of the same buckets would have handed over; ``buckets``: the buckets seen."""

    def __init__(self, process_group=None):
        if process_group is not None:
            check_group(process_group, f"{type(self).__name__}(process_group=...)")
        self.process_group = process_group
        self.reset_counters()

    def reset_counters(self) -> None:
        self.bytes_sent = self.bytes_plain = self.buckets = 0

    @property
    def compression_rate(self) -> float:
        """bytes_plain / bytes_sent: how many times fewer bytes than the plain all-reduce (1.0 before any)."""
        return self.bytes_plain / self.bytes_sent if self.bytes_sent else 1.0

    def _group(self, bucket):
        return self.process_group if self.process_group is not None else bucket.communicator

    def count_bucket(self, sent: int, plain: int) -> None:
        """Counts one bucket: `sent` bytes handed to collectives, `plain` what the plain all-reduce would send."""
        self.bytes_sent += int(sent)
        self.bytes_plain += int(plain)
        self.buckets += 1

    def __repr__(self):
        return (f"{type(self).__name__}(bytes_sent={self.bytes_sent}, bytes_plain={self.bytes_plain}, "
                f"buckets={self.buckets})")


class HookFuture:
    """A hook's handle: ``wait()`` runs the rest of the hook's work once (waiting on its collectives, issuing
    the later ones) and returns the averaged flat tensor; later calls return the same tensor, or raise the
    same error."""

    __slots__ = ("_finish", "_result", "_error", "_done")

    def __init__(self, finish):
        self._finish, self._result, self._error, self._done = finish, None, None, False

    @classmethod
    def completed(cls, result) -> HookFuture:
        """A handle whose wait() returns `result` (a hook that finished its work synchronously)."""
        fut = cls(None)
        fut._result, fut._done = result, True
        return fut

    def done(self) -> bool:
        """Whether wait() has run (successfully or not)."""
        return self._done

    def wait(self):
        if not self._done:
            finish, self._finish = self._finish, None
            try:
                self._result = finish()
            except BaseException as e:  # kept: a second wait() must not issue the collectives again
                self._error = e
                raise
            finally:
                self._done = True
        if self._error is not None:
            raise self._error
        return self._result


def check_group(group, who: str) -> None:
    """A TypeError naming `who` unless `group` is a communicator (something with all_reduce and world_size)."""
    if not (callable(getattr(group, "all_reduce", None)) and hasattr(group, "world_size")):
        raise TypeError(f"{who}: expected a Communicator (singa_lite.comm.init(), or DistOpt's "
                        f".communicator) or None for the bucket's own, got {type(group).__name__}")


def resolve_state(state, bucket, who: str):
    """(communicator, HookState or None) for a plain hook's state."""
    if not isinstance(bucket, GradBucket):
        raise TypeError(f"{who}: expected a parallel.bucket.GradBucket, got {type(bucket).__name__}")
    if state is None:
        return bucket.communicator, None
    if isinstance(state, HookState):
        return state._group(bucket), state
    check_group(state, f"{who}: state")
    return state, None
