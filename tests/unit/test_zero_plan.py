"""The ZeRO shard plan and the joining of saved optimizer shards (singa_lite/parallel/zero.py)."""
import numpy as np
import pytest

from singa_lite.parallel.zero import ShardPlan, check_stage, merge_optimizer_states


def test_contiguous_runs_balanced_by_bytes():
    plan = ShardPlan(list("abcdef"), [100, 100, 100, 100, 100, 100], 3)
    assert [plan.owned(r) for r in range(3)] == [["a", "b"], ["c", "d"], ["e", "f"]]
    assert plan.bytes_per_rank == [200, 200, 200]


def test_each_share_is_within_half_the_largest_parameter_of_the_mean():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n, world = int(rng.integers(1, 30)), int(rng.integers(1, 9))
        sizes = [int(s) for s in rng.integers(1, 10_000, n)]
        plan = ShardPlan([f"p{i}" for i in range(n)], sizes, world)
        owners = [plan.owner[f"p{i}"] for i in range(n)]
        assert owners == sorted(owners)  # contiguous runs, in order
        assert sum(plan.bytes_per_rank) == sum(sizes)
        mean = sum(sizes) / world
        for b in plan.bytes_per_rank:
            assert abs(b - mean) <= max(sizes) + 1e-9, (sizes, world, plan.bytes_per_rank)


def test_uneven_tails_leave_ranks_empty():
    plan = ShardPlan(["big", "small"], [1000, 4], 4)
    owned = [plan.owned(r) for r in range(4)]
    assert sum(owned, []) == ["big", "small"] and owned.count([]) == 2, owned
    assert ShardPlan([], [], 3).bytes_per_rank == [0, 0, 0]
    assert ShardPlan(["a", "b"], [0, 0], 2).owned(0) == ["a", "b"]


def test_bad_plans_and_stages_are_refused():
    with pytest.raises(ValueError, match="distinct names"):
        ShardPlan(["a", "a"], [1, 1], 2)
    with pytest.raises(ValueError, match="distinct names"):
        ShardPlan(["a"], [1, 1], 2)
    for bad in (3, -1, True, 1.0, "1"):
        with pytest.raises(ValueError, match="zero_stage must be 0"):
            check_stage(bad, "DistOpt")
    assert [check_stage(s, "x") for s in (0, 1, 2)] == [0, 1, 2]


def test_shards_join_into_the_whole_state():
    a = {"step_counter": 5, "m": {"w": np.ones(2)}, "t": {"w": 5}, "loss_scale": 8.0}
    b = {"step_counter": 5, "m": {"b": np.zeros(1)}, "t": {"b": 5}, "loss_scale": 8.0}
    merged = merge_optimizer_states([a, b])
    assert sorted(merged["m"]) == ["b", "w"] and merged["t"] == {"w": 5, "b": 5}
    assert merged["step_counter"] == 5 and merged["loss_scale"] == 8.0
    with pytest.raises(ValueError, match="not all dicts"):
        merge_optimizer_states([a, None])
    with pytest.raises(ValueError, match="disagree on 'm'"):
        merge_optimizer_states([a, {"step_counter": 5, "m": [1]}])
