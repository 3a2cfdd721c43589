"""DistOpt(zero_stage=1|2) (parallel/zero.py) on 2 and 3 ranks of the shm backend: stages 1 and 2 equal stage 0
within 1e-6 over 20 steps for every optimizer (uneven shards: 4 parameters of 280, 40, 200 and 5 elements),
with the half wire, clipping, accumulation and amp; memory_report() against the arrays held; checkpoints saved
at one stage and world size and loaded at another. Scenarios in helpers/zero_cases.py."""
import numpy as np
import pytest

from singa_lite import _core, autograd, tensor

pytestmark = pytest.mark.skipif(not hasattr(_core, "ShmComm"), reason="this build has no shm backend")

import distopt_cases as dc  # noqa: E402
import zero_cases  # noqa: E402
from dist_cases import run_ranks  # noqa: E402


def ok(out, world_size):
    assert sorted(out) == list(range(world_size)), out
    for r in range(world_size):
        assert out[r][0] == "ok", out
    return [out[r][1] for r in range(world_size)]


@pytest.mark.parametrize("world_size", [2, 3])
def test_stages_1_and_2_equal_stage_0_for_every_optimizer(world_size):
    out, _, _ = run_ranks(zero_cases.scenario_equivalence, world_size, timeout=300)
    for got in ok(out, world_size):
        assert got == [f"{k}{s}" for k in zero_cases.KINDS for s in (1, 2)], got


@pytest.mark.parametrize("world_size", [2, 3])
def test_half_wire_clipping_accumulation_sharded(world_size):
    out, _, _ = run_ranks(zero_cases.scenario_features, world_size, timeout=300)
    for got in ok(out, world_size):
        assert len(got) == 12, got


def test_amp_masters_are_sharded():
    out, _, _ = run_ranks(zero_cases.scenario_amp, 3, timeout=300)
    assert ok(out, 3) == [["amp1", "amp2"]] * 3


@pytest.mark.parametrize("world_size", [2, 3])
def test_memory_report_matches_the_arrays_held(world_size):
    out, _, _ = run_ranks(zero_cases.scenario_memory, world_size, timeout=300)
    assert ok(out, world_size) == [["memory1", "memory2"]] * world_size


def test_unsupported_combinations_raise_value_error():
    out, _, _ = run_ranks(zero_cases.scenario_refusals, 2, timeout=120)
    assert ok(out, 2) == ["refused"] * 2


# (world size, stage) saved -> loaded
@pytest.mark.parametrize("saved,loaded", [((2, 2), (2, 2)), ((3, 2), (2, 1)), ((2, 1), (3, 2)), ((2, 0), (3, 1)),
                                          ((3, 1), (2, 0))])
def test_checkpoint_round_trip_between_stages_and_rank_counts(tmp_path, saved, loaded):
    (world_a, stage_a), (world_b, stage_b) = saved, loaded
    path = str(tmp_path / "ckpt")
    out, _, _ = run_ranks(zero_cases.scenario_save, world_a, timeout=120, args=(path, stage_a))
    shards = ok(out, world_a)
    if stage_a:  # each rank saved its own shard: disjoint, together every parameter
        assert sorted(sum(shards, [])) == sorted(dc.make_params(0)), shards
    out, _, _ = run_ranks(zero_cases.scenario_resume, world_b, timeout=120, args=(path, stage_b))
    want = dc.reference("adam", 10)
    for got in ok(out, world_b):
        for k in want:
            np.testing.assert_allclose(np.asarray(got[k], np.float32), want[k], rtol=1e-5, atol=1e-5, err_msg=k)


def test_a_sharded_checkpoint_loads_into_a_plain_optimizer(tmp_path):
    from singa_lite import checkpoint

    path = str(tmp_path / "ckpt")
    out, _, _ = run_ranks(zero_cases.scenario_save, 3, timeout=120, args=(path, 2))
    ok(out, 3)
    params, adam = dc.make_params(7), dc.make_opt("adam")
    checkpoint.load(path, params, adam, reshard=True)
    assert sorted(adam.m) == sorted(params) and adam.step_counter == 5, (sorted(adam.m), adam.step_counter)
    autograd.training = True
    for step in range(5, 10):
        adam(dc.loss_of(params, *dc.data(step)))
    want = dc.reference("adam", 10)
    for k in want:
        np.testing.assert_allclose(tensor.to_numpy(params[k]), want[k], rtol=1e-5, atol=1e-5, err_msg=k)


# ---------------------------------------------------------------- the other communicators
@pytest.mark.parametrize("world_size", [2, 3])
def test_over_the_tcp_backend(world_size):
    from test_tcp_backend import run_tcp

    out, _ = run_tcp(zero_cases.scenario_equivalence, world_size, timeout=240, args=(("sgd", "adam"),))
    assert ok(out, world_size) == [["sgd1", "sgd2", "adam1", "adam2"]] * world_size


def test_over_the_mpi_backend():
    from test_dist_mpi import run_job_under_mpiexec

    out = run_job_under_mpiexec("zero_job.py", 3, timeout=300)
    assert out.count("zero scenarios: sgd1, sgd2, adam1, adam2, half1") == 3, out


def _hierarchical(world):
    import importlib.util

    import paths

    spec = importlib.util.spec_from_file_location("hierarchical_job", paths.job("hierarchical_job.py"))
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return [zero_cases.scenario_equivalence(job.two_hosts(world, sharded), ("adam",)) for sharded in (True, False)]


def test_over_the_hierarchical_communicator():
    # 4 tcp ranks playing 2 hosts of 2, both forms: the gradients' exchange is hierarchical, the rest flat
    from test_tcp_backend import run_tcp

    out, _ = run_tcp(_hierarchical, 4, timeout=240, comm_timeout=60)
    assert ok(out, 4) == [[["adam1", "adam2"]] * 2] * 4


@pytest.mark.parametrize("stage", [1, 2])
def test_the_nccl_code_path_on_a_stand_in(monkeypatch, stage):
    # tests/multiproc/test_nccl_cpu.py's stand-in for _core.NcclComm: two replicas holding the same data, this
    # process rank 0. After one step the parameters rank 0 owns equal one plain step (its broadcast from rank 1
    # brings nothing, so rank 1's are not checked): the sharded update and the owners' broadcast went through
    # the nccl communicator's reduce (stage 2) and broadcast.
    import test_nccl_cpu as n
    from singa_lite import opt
    from singa_lite.comm import nccl

    monkeypatch.setattr(nccl._core, "NcclComm", n.FakeComm, raising=False)
    monkeypatch.setattr(nccl, "_require_ready", lambda: None)
    monkeypatch.setattr(nccl, "choose_device", lambda device, local_rank, local_size: n.FakeGpu())
    c = nccl.NcclCommunicator(b"\x00" * 128, 0, 2, timeout=30)
    d = opt.DistOpt(dc.make_opt("sgd"), communicator=c, zero_stage=stage)
    got = dc.train(dc.make_params(0), d, 1, threshold=100)
    want = dc.reference("sgd", 1)
    owned = d.reducer.zero.plan.owned(0)
    assert sorted(owned) == ["W2", "b1", "b2"], owned
    for k in owned:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6, err_msg=k)
    kinds = {w.what for w in c._comm.log}
    assert "broadcast" in kinds and ("reduce" in kinds) == (stage == 2), kinds
    c.close()


def test_a_rank_that_owns_nothing():
    out, _, _ = run_ranks(zero_cases.scenario_empty_shard, 3, timeout=120)
    assert ok(out, 3) == [["empty1", "empty2"]] * 3


def test_a_comm_hook_at_stage_1():
    out, _, _ = run_ranks(zero_cases.scenario_comm_hook, 3, timeout=120)
    assert ok(out, 3) == ["hook1"] * 3
