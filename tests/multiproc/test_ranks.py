"""The process-group harness itself (ranks.run_group): results and exceptions come back per rank, a rank that
dies without reporting or outlives the deadline fails the test by name and exit code (or, not strict, is just
missing), silent ranks are not waited for, and nothing is left running."""
import os
import signal
import time

import pytest

from ranks import run_group


def _rank_work(rank, mode):
    if mode == "raise" and rank == 1:
        raise ValueError(f"bad rank {rank}")
    if mode == "die" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang" and rank == 1:
        time.sleep(300)
    return rank * 10, os.getpid()


def _values(group):
    return {r: v[0] if kind == "ok" else v for r, (kind, v) in group.results.items()}


def test_every_rank_reports_its_value_or_exception():
    group = run_group(_rank_work, range(3), ("raise",), timeout=60)
    assert _values(group) == {0: 0, 1: ("ValueError", "bad rank 1"), 2: 20}
    assert group.exitcodes == {0: 0, 1: 0, 2: 0}


def test_a_rank_dying_without_a_report_is_named_with_its_exit_code():
    with pytest.raises(AssertionError, match=r"ranks \[1\] exited without reporting \(rank 1: exit code -9\)"):
        run_group(_rank_work, range(3), ("die",), timeout=60)
    # not strict: the others' results, the dead rank missing
    group = run_group(_rank_work, range(3), ("die",), timeout=60, strict=False)
    assert _values(group) == {0: 0, 2: 20} and group.exitcodes[1] == -signal.SIGKILL
    # silent: expected to die, not waited for
    group = run_group(_rank_work, range(3), ("die",), timeout=60, silent=(1,))
    assert _values(group) == {0: 0, 2: 20} and group.exitcodes[1] == -signal.SIGKILL


def test_a_straggler_fails_the_test_at_the_deadline_and_is_killed():
    start = time.monotonic()
    with pytest.raises(AssertionError, match=r"ranks \[1\] did not report within 5 s \(rank 1: still running\)"):
        run_group(_rank_work, range(2), ("hang",), timeout=5, exit_grace=0.5)
    assert time.monotonic() - start < 30
    group = run_group(_rank_work, range(2), ("hang",), timeout=5, strict=False, exit_grace=0.5)
    assert _values(group) == {0: 0} and group.exitcodes[1] == -signal.SIGKILL
    assert 5 <= group.seconds < 30
