"""Issue 30.5, process groups: dist.new_group(ranks) on the shm, tcp and mpi backends. The check the issue names:
a group of ranks 0 and 2 of 3 all-reduces among themselves; here it uses every collective, numbered in the order
of `ranks` ([0, 2] and [2, 0]), while rank 1 stays out, gets a clear error when it touches the group, and the
world goes on. DistOpt(opt, communicator=group) trains within the group (its members end equal, and equal to
one process training on their whole batch; rank 1, training alone, differs). A member that dies makes the other
fail fast naming it; closing the world closes its groups. Bad ranks raise ValueError; ranks that differ across
callers raise CollectiveMismatch on every rank. (nccl: tests/gpu/test_nccl_groups.py.)"""
import numpy as np
import pytest

from dist_cases import run_ranks
from group_cases import group_distopt, group_member_dies, group_of_0_and_2
from test_collective_mismatch import run_mpi


def expected(world_ranks: list, me: int) -> dict:
    """What group_cases._collectives gives on world rank `me` of the group of world_ranks."""
    P, r = len(world_ranks), world_ranks.index(me)
    other = world_ranks[(r - 1) % P]
    reduced = [3, 3, 3] if r == 0 else [me + 1] * 3  # prod of (me + 1) over {0, 2} = 3, on the root only
    return {
        "all_reduce": [4.0] * 4, "avg": [2.0] * 4, "broadcast": [world_ranks[P - 1]] * 3, "reduce": reduced,
        "all_gather": world_ranks, "reduce_scatter": [2.0, 4.0] if r == 0 else [6.0, 8.0],
        "gather": [10 * w for w in world_ranks] if r == 0 else None, "scatter": [100 * world_ranks[P - 1] + r],
        "barrier": None, "recv": [other, other], "broadcast_object": {"from": world_ranks[0]},
        "all_gather_object": world_ranks, "async": [2.0, 2.0],
    }


def check_group_of_0_and_2(results: dict, backend: str) -> None:
    assert sorted(results) == [0, 1, 2], results
    for me, res in results.items():
        assert res["errors"] == [], f"rank {me}: {res['errors']}"
        assert res["ranks"] == [[0, 2], [2, 0]], res
        assert res["world"] == [6, 6, 6], res
        if me == 1:
            assert res["is_member"] == [False, False], res
            assert res["repr"] == f"NonMember(backend={backend!r}, rank=1, group=[0, 2])", res
            continue
        assert res["is_member"] == [True, True], res
        assert res["rank"] == [[0, 2].index(me), [2, 0].index(me)] and res["size"] == [2, 2], res
        assert res["backend"] == backend and res["timeout"] == [True, True], res
        for key, ranks in (("group", [0, 2]), ("back", [2, 0])):
            want = expected(ranks, me)
            got = res[key]
            for name, value in want.items():
                if name != "barrier":
                    assert got[name] == value, f"rank {me}, group {ranks}, {name}: got {got[name]}, want {value}"
        assert res["after_mismatch"] == [2.0, 2.0], res
        assert res["closed_with_world"] == [True, True], res


def test_shm_group_of_ranks_0_and_2():
    out, _, _ = run_ranks(group_of_0_and_2, 3, timeout=180)
    assert all(v[0] == "ok" for v in out.values()), out
    check_group_of_0_and_2({r: v[1] for r, v in out.items()}, "shm")


def test_tcp_group_of_ranks_0_and_2():
    from test_tcp_backend import run_tcp

    out, _ = run_tcp(group_of_0_and_2, 3, timeout=180)
    assert all(v[0] == "ok" for v in out.values()), out
    check_group_of_0_and_2({r: v[1] for r, v in out.items()}, "tcp")


def test_mpi_group_of_ranks_0_and_2():
    proc, found, text = run_mpi(3, "group_of_0_and_2")
    assert sorted(found) == [0, 1, 2], text
    check_group_of_0_and_2(found, "mpi")
    assert proc.returncode == 0, text


def check_distopt(results: dict) -> None:
    assert sorted(results) == [0, 1, 2], results
    p0, p1, p2 = (results[r]["params"] for r in range(3))
    for k in p0:
        assert p0[k] == p2[k], f"{k}: the group's members differ"
        assert not np.allclose(p0[k], p1[k]), f"{k}: rank 1 trained alone, yet has the members' values"
        # the group averaged its two halves' gradients: one process on the whole batch, up to rounding
        np.testing.assert_allclose(p0[k], results[0]["reference"][k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_shm_distopt_trains_within_the_group():
    out, _, _ = run_ranks(group_distopt, 3, timeout=180)
    assert all(v[0] == "ok" for v in out.values()), out
    check_distopt({r: v[1] for r, v in out.items()})


def test_tcp_distopt_trains_within_the_group():
    from test_tcp_backend import run_tcp

    out, _ = run_tcp(group_distopt, 3, timeout=180)
    assert all(v[0] == "ok" for v in out.values()), out
    check_distopt({r: v[1] for r, v in out.items()})


def test_mpi_distopt_trains_within_the_group():
    proc, found, text = run_mpi(3, "group_distopt")
    check_distopt(found)
    assert proc.returncode == 0, text


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_a_dead_member_fails_the_other_fast_naming_it(backend):
    if backend == "shm":
        out, _, _ = run_ranks(group_member_dies, 3, timeout=120, comm_timeout=60)
    else:
        from test_tcp_backend import run_tcp
        out, _ = run_tcp(group_member_dies, 3, timeout=120, comm_timeout=60)
    assert out[1] == ("ok", "not a member"), out
    kind, seconds, message = out[0][1]
    assert kind == "CommError", out[0]
    assert seconds < 20, f"rank 0 waited {seconds:.1f} s (timeout 60 s): {message}"
    assert "rank 1" in message and "1 = 2" in message, message  # group rank 1, which is world rank 2


def test_a_group_of_a_hierarchical_communicator():
    from group_cases import hierarchical_group
    from test_tcp_backend import run_tcp

    out, _ = run_tcp(hierarchical_group, 4, timeout=180, comm_timeout=60)
    assert out[1] == ("ok", ["not a member", None, None]), out
    mean = float(np.float32(8 / 3))  # (1 + 3 + 4) / 3 in float32
    for me in (0, 2, 3):
        assert out[me] == ("ok", ["tcp", [3, 0, 2].index(me), [3, 0, 2], [mean] * 4, [3, 0, 2], True]), out


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_aborting_the_world_aborts_its_groups(backend):
    from group_cases import group_abort

    if backend == "shm":
        out, _, _ = run_ranks(group_abort, 3, timeout=120, comm_timeout=60)
    else:
        from test_tcp_backend import run_tcp
        out, _ = run_tcp(group_abort, 3, timeout=120, comm_timeout=60)
    assert out[0] == ("ok", "aborted") and out[1] == ("ok", "not a member"), out
    seconds, message = out[2][1]
    assert seconds < 20 and "rank 0 stops the job here" in message, out[2]
