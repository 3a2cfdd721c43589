"""The communication hooks (singa_lite.parallel.hooks, powersgd) on real multi-process communicators, tcp and
shm, against numpy references computed from every rank's buffers (helpers/comm_hook_cases.py), and PowerSGD's
convergence on a least-squares problem next to the plain all-reduce's."""
import pytest

from singa_lite import _core

from comm_hook_cases import run, scenario_all  # noqa: E402

BACKENDS = ["tcp", pytest.param("shm", marks=pytest.mark.skipif(not hasattr(_core, "ShmComm"),
                                                                reason="this build has no shm backend"))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_hooks_match_numpy_and_powersgd_converges(backend, world_size):
    out = run(backend, scenario_all, world_size, timeout=300)
    assert sorted(out) == list(range(world_size)), out
    for r, result in out.items():
        assert result[0] == "ok", (r, result)
    done, conv = out[0][1]
    assert done == ["plain", "powersgd", "rank1"]
    assert all(out[r][1] == out[0][1] for r in out), "the ranks' losses differ"
    print(f"{backend} x{world_size}: least squares after 300 steps: {conv}")
