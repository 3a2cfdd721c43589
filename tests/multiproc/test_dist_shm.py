"""The shm backend through the Communicator interface, with processes started by multiprocessing exactly as
SINGA scripts do (one NcclIdHolder from the parent): every collective for 1-4 ranks under spawn and fork,
and the failure paths. Helpers and scenarios live in dist_cases.py (spawned children import them)."""
import os
import time

import pytest

from singa_lite import _core

pytestmark = pytest.mark.skipif(not hasattr(_core, "ShmComm"), reason="this build has no shm backend")

from dist_cases import (run_ranks, scenario_abort, scenario_collectives, scenario_distopt,  # noqa: E402
                        scenario_killed, scenario_mismatch, scenario_timeout, scenario_user_error)


def no_segment_left(holder):
    name = holder.shm_name.lstrip("/")
    for _ in range(50):  # the last process may still be exiting
        if not os.path.exists(os.path.join("/dev/shm", name)):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("method,world_size", [("spawn", 1), ("spawn", 2), ("spawn", 3), ("spawn", 4),
                                               ("fork", 2), ("fork", 3)])
def test_every_collective(method, world_size):
    out, holder, _ = run_ranks(scenario_collectives, world_size, method, timeout=180)
    assert out == {r: ("ok", r) for r in range(world_size)}, out
    assert no_segment_left(holder)


def test_timeout_names_the_rank_that_did_not_arrive():
    out, holder, elapsed = run_ranks(scenario_timeout, 3, comm_timeout=1.0, args=(1,))
    for r in (0, 2):
        assert out[r][:2] == ("error", "CommError"), out
        assert "timed out" in out[r][2] and "waiting for rank 1 " in out[r][2], out[r]
    assert elapsed < 30
    assert no_segment_left(holder)


@pytest.mark.parametrize("scenario,expect", [(scenario_killed, "died"), (scenario_user_error, "left")])
def test_a_dead_rank_makes_the_others_fail_fast_naming_it(scenario, expect):
    start = time.monotonic()
    out, holder, _ = run_ranks(scenario, 3, comm_timeout=60.0, args=(1,))
    for r in (0, 2):
        assert out[r][:2] == ("error", "CommError"), out
        assert "rank 1" in out[r][2] and expect in out[r][2], out[r]
    assert time.monotonic() - start < 20  # detection itself within 10 s; process start-up on top
    assert no_segment_left(holder)


def test_abort_reaches_every_rank():
    out, holder, _ = run_ranks(scenario_abort, 3)
    assert out[1] == ("ok", "aborted")
    for r in (0, 2):
        assert out[r][:2] == ("error", "CommError") and "boom from rank 1" in out[r][2], out
    assert no_segment_left(holder)


def test_mismatched_sizes_are_reported_on_every_rank():
    out, holder, _ = run_ranks(scenario_mismatch, 3)
    for r in range(3):
        assert out[r][0] == "ok" and "11" in out[r][1] and "10" in out[r][1], out
    assert no_segment_left(holder)


@pytest.mark.parametrize("world_size", [2, 3])
def test_distopt_on_shm(world_size):
    # the same DistOpt checks as under mpiexec (tests/multiproc/helpers/distopt_cases.py), on the shm backend
    out, holder, _ = run_ranks(scenario_distopt, world_size, timeout=240)
    for r in range(world_size):
        assert out[r][0] == "ok", out
        assert "equivalence_sgd" in out[r][1] and "buckets_leave_during_backward" in out[r][1], out
    assert no_segment_left(holder)


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_collective_with_the_in_call_spin(world_size, monkeypatch):
    # SINGA_LITE_SHM_SPIN_US: the syncs inside a collective poll before they sleep (3 ranks on 2 cores: yielding)
    monkeypatch.setenv("SINGA_LITE_SHM_SPIN_US", "200")
    out, holder, _ = run_ranks(scenario_collectives, world_size, "spawn", timeout=180)
    assert out == {r: ("ok", r) for r in range(world_size)}, out
    assert no_segment_left(holder)
