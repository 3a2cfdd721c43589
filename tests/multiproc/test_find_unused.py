"""DistOpt(find_unused_parameters=True, parameters=...) (issue 30.4): ranks whose forward takes different branches
train as one process that averages their gradients with zeros for the unused branch; a parameter used on no rank
stays as it is; the replicas stay equal; misuse is refused and, without the option, the error names it.
Scenarios: unused_cases.py, on shm ranks started by multiprocessing."""
import pytest

from singa_lite import _core

pytestmark = pytest.mark.skipif(not hasattr(_core, "ShmComm"), reason="this build has no shm backend")

import unused_cases  # noqa: E402
import unused_modes_cases  # noqa: E402
from dist_cases import run_ranks  # noqa: E402


@pytest.mark.parametrize("name,world_size", [
    ("matches_the_reference", 2),
    ("matches_the_reference", 3),
    ("half_two_phases_and_accumulation", 2),
    ("half_two_phases_and_accumulation", 3),
    ("a_model_supplies_its_parameters", 2),
    ("a_model_supplies_its_parameters", 3),
    ("misuse_is_refused", 2),
    ("without_the_option_the_error_names_it", 2),
    ("ddp_takes_the_option", 2),
    ("ddp_takes_the_option", 3),
])
def test_scenario(name, world_size):
    out, _, _ = run_ranks(unused_cases.run, world_size, timeout=240, args=(name,))
    assert out == {r: ("ok", "ok") for r in range(world_size)}, out


@pytest.mark.parametrize("name,world_size", [
    ("join_matches_the_reference", 2),
    ("join_matches_the_reference", 3),
    ("partial_follows_its_rule", 2),
    ("partial_follows_its_rule", 3),
    ("sparse_follows_its_rule", 2),
    ("sparse_follows_its_rule", 3),
    ("without_branches_equals_the_mode", 2),
    ("without_branches_equals_the_mode", 3),
])
def test_mode(name, world_size):
    # join(), the partial and the sparse updates with find_unused_parameters=True
    out, _, _ = run_ranks(unused_modes_cases.run, world_size, timeout=240, args=(name,))
    assert out == {r: ("ok", "ok") for r in range(world_size)}, out
