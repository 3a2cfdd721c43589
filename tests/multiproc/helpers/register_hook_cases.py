"""Scenarios for register_comm_hook (DistOpt, ddp.DistributedOptimizer, DataParallel), run by test_comm_hook.py
on shm ranks started by multiprocessing. Each takes a Communicator and raises AssertionError when an expectation
fails."""
from __future__ import annotations

import re

import numpy as np
import pytest

from singa_lite import opt, parallel, tensor
from singa_lite.parallel import bucket as bucket_module

from distopt_cases import make_opt, make_params
from distopt_public_cases import same, shard_loss, values

STEPS = 4


def all_reduce_hook(state, bucket):
    """A user's hook that does what the plain exchange does: average the bucket over the ranks, asynchronously."""
    if state is not None:
        state.append((bucket.index(), bucket.is_last(), [p.name for p in bucket.parameters()], bucket.buffer().size(),
                      bucket.offsets()))
        assert isinstance(bucket, bucket_module.GradBucket) and isinstance(bucket.buffer(), tensor.Tensor)
    return bucket.communicator.all_reduce(bucket.buffer(), "avg", async_op=True)


def copying_hook(state, bucket):
    """The average as a new tensor, returned at once (not the buffer, no handle): copied into the bucket."""
    t = tensor.from_numpy(tensor.to_numpy(bucket.buffer()).copy())
    return bucket.communicator.all_reduce(t, "avg")


def train_distopt(comm, hook=None, state=None, passes=1, **kw):
    params = make_params(0)
    dopt = opt.DistOpt(make_opt("adam"), communicator=comm, backward_passes_per_step=passes, **kw)
    if hook is not None:
        dopt.register_comm_hook(state, hook)
    for step in range(STEPS * passes):
        dopt.backward_and_update(shard_loss(comm, params, step), threshold=150)
    return values(params), dopt


def scenario_a_hook_that_all_reduces_gives_plain_distopts_parameters(comm):
    for kw in ({}, {"first_bucket": 60}, {"first_bucket": 0, "overlap": False}, {"passes": 2}):
        want, plain = train_distopt(comm, **kw)
        seen = []
        got, hooked = train_distopt(comm, all_reduce_hook, seen, **kw)
        same(got, want, f"all-reducing hook {kw}")
        assert hooked.bytes_sent == plain.bytes_sent, (kw, hooked.bytes_sent, plain.bytes_sent)
        got, _ = train_distopt(comm, copying_hook, **kw)
        same(got, want, f"copying hook {kw}")
        # each step: buckets 0, 1, ... with only the last one last, holding every gradient once
        steps, current = [], []
        for entry in seen:
            if entry[0] == 0 and current:
                steps.append(current)
                current = []
            current.append(entry)
        steps.append(current)
        assert len(steps) == STEPS, (kw, len(steps))
        for buckets in steps:
            assert [b[0] for b in buckets] == list(range(len(buckets))), buckets
            assert [b[1] for b in buckets] == [False] * (len(buckets) - 1) + [True], buckets
            assert sorted(n for b in buckets for n in b[2]) == ["W1", "W2", "b1", "b2"], buckets
            sizes = {"b2": 5, "W2": 200, "b1": 40, "W1": 280}
            for _, _, names, size, offsets in buckets:
                assert size == sum(sizes[n] for n in names), buckets
                assert offsets == list(np.cumsum([0] + [sizes[n] for n in names])[:-1]), buckets
        assert len(steps[0]) > 1, steps[0]  # threshold 150: W2 and W1 go alone, so several buckets
    return "ok"


def scenario_the_hook_is_what_reduces(comm):
    # a hook that sums instead of averaging: the update is world_size times the plain one's (SGD, no momentum)
    def summing(state, bucket):
        return bucket.communicator.all_reduce(bucket.buffer(), "sum", async_op=True)

    def run(hook):
        params = make_params(0)
        dopt = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm)
        if hook is not None:
            dopt.register_comm_hook(None, hook)
        dopt.broadcast_parameters(list(params.values()))
        before = values(params)
        dopt.backward_and_update(shard_loss(comm, params, 0))
        return {k: v - before[k] for k, v in values(params).items()}

    plain, summed = run(None), run(summing)
    for k in plain:
        np.testing.assert_allclose(summed[k], plain[k] * comm.world_size, rtol=1e-5, atol=1e-7, err_msg=k)
    return "ok"


def scenario_ddp_and_data_parallel_take_a_hook(comm):
    from singa_lite import autograd
    from singa_lite.parallel import ddp

    want, _ = train_distopt(comm)

    params = make_params(0)
    dopt = ddp.DistributedOptimizer(make_opt("adam"), communicator=comm, threshold=150)
    calls = []
    dopt.register_comm_hook(calls, all_reduce_hook)
    for step in range(STEPS):
        dopt.reset_grad()
        dopt.backward(shard_loss(comm, params, step))
        dopt.step()
    same(values(params), want, "ddp.DistributedOptimizer with a hook")
    assert calls

    class Net:  # DataParallel wraps a model: the same parameters, as a plain object with get_params
        def __init__(self):
            self.params = make_params(0)

        def get_params(self):
            return dict(self.params)

    def train_dp(hook):
        net = Net()
        dp = parallel.DataParallel(net, communicator=comm, threshold=150)
        if hook is not None:
            dp.register_comm_hook(None, hook)
        sgd = opt.SGD(lr=0.1, momentum=0.9)
        for step in range(STEPS):
            for p, g in autograd.backward(shard_loss(comm, net.params, step)):
                sgd.apply(p.name, p, g)
            sgd.step()
        dp.remove_hooks()
        return values(net.params)

    same(train_dp(all_reduce_hook), train_dp(None), "DataParallel with a hook")
    return "ok"


def scenario_join_with_a_hook(comm):
    # uneven inputs: a rank out of data answers through the same hook (with zeros), so the parameters are those
    # of plain DistOpt under join(), and the hook is called on every rank for every pass
    steps = [3 + 2 * q for q in range(comm.world_size)]

    def run(hook, calls=None):
        params = make_params(0)
        dopt = opt.DistOpt(make_opt("sgd"), communicator=comm)
        if hook is not None:
            dopt.register_comm_hook(calls, hook)
        with dopt.join():
            for step in range(steps[comm.rank]):
                dopt.backward_and_update(shard_loss(comm, params, step), threshold=150)
        return values(params)

    calls = []
    same(run(all_reduce_hook, calls), run(None), "join() with a hook")
    assert sum(1 for c in calls if c[1]) == max(steps), calls  # one last bucket per pass, answered passes too
    return "ok"


def scenario_misuse_is_refused(comm):
    params = make_params(0)
    dopt = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm)
    with pytest.raises(TypeError, match="callable"):
        dopt.register_comm_hook(None, 42)
    dopt.register_comm_hook(None, all_reduce_hook)
    with pytest.raises(RuntimeError, match="already registered"):
        dopt.register_comm_hook(None, all_reduce_hook)
    for call in (lambda: dopt.backward_and_update_half(shard_loss(comm, params, 0)),
                 lambda: dopt.backward_and_partial_update(shard_loss(comm, params, 0)),
                 lambda: dopt.backward_and_sparse_update(shard_loss(comm, params, 0))):
        with pytest.raises(RuntimeError, match="comm hook is registered"):
            call()
    assert dopt.pending is None
    dopt.backward_and_update(shard_loss(comm, params, 0))  # the plain step still works

    late = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm)
    late.backward_and_update(shard_loss(comm, params, 1))
    with pytest.raises(RuntimeError, match="before the first backward"):
        late.register_comm_hook(None, all_reduce_hook)

    # wrong results: a TypeError names the hook and what it returned (every rank alike: no collective made)
    def returns_none(state, bucket):
        return None

    def wrong_shape(state, bucket):
        return tensor.from_numpy(np.zeros(bucket.buffer().size() + 1, np.float32))

    class Handle:
        def wait(self):
            return tensor.from_numpy(np.zeros(3, np.float64))

    def wrong_handle(state, bucket):
        return Handle()

    for hook, said in ((returns_none, "returns_none: returned NoneType None"),
                       (wrong_shape, "wrong_shape: returned a tensor of shape"),
                       (wrong_handle, "wrong_handle: its handle's wait() returned a tensor of shape [3] and dtype "
                                      "float64")):
        bad = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm)
        bad.register_comm_hook(None, hook)
        before = values(params)
        with pytest.raises(TypeError, match=re.escape(said)):
            bad.backward_and_update(shard_loss(comm, params, 2))
        same(values(params), before, f"{hook.__name__}: nothing updated")
        assert bad.pending is None
    return "ok"


def scenario_shipped_hooks_through_distopt(comm):
    # parallel.hooks through DistOpt.register_comm_hook: allreduce_hook is plain DistOpt bit for bit; fp16 and
    # bf16 compression within their precision of it; PowerSGD (rank 2, from the first step) trains as plain does
    # (its loss within 5 % after 30 steps) and leaves every rank with the same parameters; bytes fall.
    from singa_lite.parallel import hooks

    def train(hook=None, state=None, steps=STEPS):
        params = make_params(0)
        dopt = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm)
        if hook is not None:
            dopt.register_comm_hook(state, hook)
        for step in range(steps):
            loss = shard_loss(comm, params, step % STEPS)
            dopt.backward_and_update(loss, threshold=150)
        return values(params), float(tensor.to_numpy(loss).reshape(-1)[0])

    plain, _ = train()
    same(train(hooks.allreduce_hook)[0], plain, "allreduce_hook")
    for hook, tol in ((hooks.fp16_compress_hook, 2e-3), (hooks.bf16_compress_hook, 2e-2)):
        got, _ = train(hook)
        for k in plain:
            np.testing.assert_allclose(got[k], plain[k], atol=tol, err_msg=f"{hook.__name__}: {k}")
    _, plain_loss = train(steps=30)
    state = hooks.PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=1)
    got, psgd_loss = train(hooks.powerSGD_hook, state, steps=30)
    assert psgd_loss < plain_loss * 1.05 + 1e-3, (psgd_loss, plain_loss)
    everyone = comm.all_gather_object({k: v.tobytes() for k, v in got.items()})
    assert all(e == everyone[0] for e in everyone), "PowerSGD left the replicas different"
    stats = state.compression_stats()
    assert stats, stats
    return "ok"


def scenario_replica_check_through_distopt(comm):
    # DistOpt(check_replicas_every=2): equal replicas pass (the check ran at updates 2 and 4); a parameter nudged
    # on the last rank is named, on every rank, at the next check; partial updates are never checked
    from singa_lite.parallel.replica_check import ReplicaMismatch

    params = make_params(0)
    dopt = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm, check_replicas_every=2)
    for step in range(4):
        dopt.backward_and_update(shard_loss(comm, params, step))
    check = dopt.reducer.replica_check
    assert (check.checks, check.last_step) == (2, 4), check
    dopt.backward_and_update(shard_loss(comm, params, 0))  # update 5: no check
    if comm.rank == comm.world_size - 1:
        w = tensor.to_numpy(params["b1"]).copy()
        w[3] = np.nextafter(w[3], np.float32(np.inf))  # one ulp
        params["b1"].copy_from_numpy(w)
    with pytest.raises(ReplicaMismatch) as caught:
        dopt.backward_and_update(shard_loss(comm, params, 1))  # update 6: checked
    said = str(caught.value)
    assert f"rank {comm.world_size - 1}" in said and "b1" in said, said
    partial = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm, check_replicas_every=1)
    for step in range(2):
        partial.backward_and_partial_update(shard_loss(comm, make_params(comm.rank), step))
    assert partial.reducer.replica_check.checks == 0
    with pytest.raises(ValueError, match="every"):
        opt.DistOpt(opt.SGD(lr=0.1), communicator=comm, check_replicas_every=0)
    return "ok"


SCENARIOS = {
    "a_hook_that_all_reduces_gives_plain_distopts_parameters":
        scenario_a_hook_that_all_reduces_gives_plain_distopts_parameters,
    "the_hook_is_what_reduces": scenario_the_hook_is_what_reduces,
    "ddp_and_data_parallel_take_a_hook": scenario_ddp_and_data_parallel_take_a_hook,
    "join_with_a_hook": scenario_join_with_a_hook,
    "misuse_is_refused": scenario_misuse_is_refused,
    "shipped_hooks_through_distopt": scenario_shipped_hooks_through_distopt,
    "replica_check_through_distopt": scenario_replica_check_through_distopt,
}


def run(comm, name):
    return SCENARIOS[name](comm)
