"""DistOpt's public two-phase step (backward -> PendingStep.synchronize -> finish) and its get_states /
set_states, on 2 and 3 shm ranks started by multiprocessing. Scenarios live in distopt_public_cases.py."""
import pytest

from singa_lite import _core

pytestmark = pytest.mark.skipif(not hasattr(_core, "ShmComm"), reason="this build has no shm backend")

import distopt_public_cases  # noqa: E402
from dist_cases import run_ranks  # noqa: E402


@pytest.mark.parametrize("name,world_size", [
    ("two_phases_equal_backward_and_update", 2),
    ("averaged_gradients_between_the_phases", 3),
    ("misuse_is_refused", 2),
    ("nonfinite_between_the_phases", 2),
    ("states_round_trip", 2),
    ("states_round_trip", 1),
    ("ddp_optimizer_between_the_phases", 2),
])
def test_scenario(name, world_size):
    out, _, _ = run_ranks(distopt_public_cases.run, world_size, timeout=180, args=(name,))
    assert out == {r: ("ok", "ok") for r in range(world_size)}, out
