"""register_comm_hook (issue 30): a user's hook(state, bucket) replaces the plain all-reduce of each bucket, in
DistOpt, ddp.DistributedOptimizer and DataParallel. A hook that all-reduces by itself must give plain DistOpt's
parameters bit for bit; misuse is refused with errors that say what to do. Scenarios: register_hook_cases.py, on shm
ranks started by multiprocessing."""
import pytest

from singa_lite import _core

pytestmark = pytest.mark.skipif(not hasattr(_core, "ShmComm"), reason="this build has no shm backend")

import register_hook_cases  # noqa: E402
from dist_cases import run_ranks  # noqa: E402


@pytest.mark.parametrize("name,world_size", [
    ("a_hook_that_all_reduces_gives_plain_distopts_parameters", 1),
    ("a_hook_that_all_reduces_gives_plain_distopts_parameters", 2),
    ("a_hook_that_all_reduces_gives_plain_distopts_parameters", 3),
    ("the_hook_is_what_reduces", 2),
    ("ddp_and_data_parallel_take_a_hook", 2),
    ("join_with_a_hook", 3),
    ("misuse_is_refused", 2),
    ("shipped_hooks_through_distopt", 2),
    ("shipped_hooks_through_distopt", 3),
    ("replica_check_through_distopt", 2),
    ("replica_check_through_distopt", 3),
])
def test_scenario(name, world_size):
    out, _, _ = run_ranks(register_hook_cases.run, world_size, timeout=240, args=(name,))
    assert out == {r: ("ok", "ok") for r in range(world_size)}, out
