"""Scenarios for DistOpt's public two-phase step and its get_states / set_states (test_distopt_public.py
runs them on shm ranks started by multiprocessing; spawned children import this module). Each takes a
Communicator and raises AssertionError when an expectation fails."""
from __future__ import annotations

import warnings

import numpy as np

from singa_lite import autograd, opt, tensor

from distopt_cases import N, data, loss_of, make_opt, make_params


def shard_loss(comm, params, step, poison=False):
    """The loss of this rank's share of step `step`'s batch (with a nan input on the last rank when poison)."""
    x, y = data(step)
    per = N // comm.world_size
    x, y = x[comm.rank * per:(comm.rank + 1) * per].copy(), y[comm.rank * per:(comm.rank + 1) * per]
    if poison and comm.rank == comm.world_size - 1:
        x[0, 0] = np.nan
    autograd.training = True
    return loss_of(params, x, y)


def values(params) -> dict:
    return {k: tensor.to_numpy(v).copy() for k, v in params.items()}


def fresh_copy(params) -> dict:
    return {k: tensor.Tensor(data=tensor.to_numpy(v).copy(), requires_grad=True, stores_grad=True, name=k)
            for k, v in params.items()}


def same(a: dict, b: dict, what: str) -> None:
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=f"{what}: {k}")


def scenario_two_phases_equal_backward_and_update(comm, steps=4):
    # The same training, four spellings: bit-identical parameters (Adam: the optimizer's state goes through
    # the two phases too), for float32 and for float16 on the wire with clipping.
    def run(spelling, half=False):
        params = make_params(0)
        dopt = opt.DistOpt(make_opt("adam"), communicator=comm, first_bucket=60)
        for step in range(steps):
            loss = shard_loss(comm, params, step)
            if spelling == "one call":
                if half:
                    dopt.backward_and_update_half(loss, threshold=150, clipping=True, clip_Value=0.05)
                else:
                    dopt.backward_and_update(loss, threshold=150)
            elif spelling == "finish":
                dopt.backward(loss, 150, half=half, clip=0.05 if half else None).finish()
            elif spelling == "synchronize, finish":
                pending = dopt.backward(loss, 150, half=half, clip=0.05 if half else None)
                pairs = pending.synchronize()
                assert [p.name for p, _ in pairs] == ["b2", "W2", "b1", "W1"], [p.name for p, _ in pairs]
                pending.finish()
            else:  # the DistOpt's own calls on the step backward left open
                dopt.backward(loss, 150, half=half, clip=0.05 if half else None)
                dopt.synchronize()
                dopt.step()
            assert dopt.pending is None
        return values(params), dopt.bytes_sent

    for half in (False, True):
        want, sent = run("one call", half)
        for spelling in ("finish", "synchronize, finish", "dist_opt calls"):
            got, got_sent = run(spelling, half)
            same(got, want, f"{spelling} (half={half})")
            assert got_sent == sent, (spelling, got_sent, sent)
    return "ok"


def scenario_averaged_gradients_between_the_phases(comm):
    params = make_params(0)
    dopt = opt.DistOpt(opt.SGD(lr=0.5), communicator=comm)
    dopt.backward_and_update(shard_loss(comm, params, 0))  # the first step (models compared) is behind us

    # synchronize() gives the average of the ranks' own gradients, the same on every rank
    local = {p.name: tensor.to_numpy(g).copy() for p, g in autograd.backward(shard_loss(comm, params, 1))}
    pending = dopt.backward(shard_loss(comm, params, 1))
    got = {p.name: tensor.to_numpy(g).copy() for p, g in pending.synchronize()}
    for name, g in local.items():
        summed = tensor.Tensor(data=g.copy())
        comm.all_reduce(summed, "sum")
        np.testing.assert_allclose(got[name], tensor.to_numpy(summed) / comm.world_size, rtol=1e-6, atol=1e-7,
                                   err_msg=name)
    assert pending.synchronize() is not None and pending.state == "synchronized" and pending.skipped is False

    # what finish() applies is the gradients as changed in between: here every gradient set to 1
    before = values(params)
    for _, g in pending.gradients:
        g.set_value(1.0)
    pending.finish()
    after = values(params)
    for k in before:
        np.testing.assert_allclose(after[k], before[k] - 0.5, rtol=0, atol=1e-6, err_msg=k)

    # scaled in place through the DistOpt's calls (clipping by the global norm, say): half the step
    before = values(params)
    dopt.backward(shard_loss(comm, params, 2))
    grads = {p.name: tensor.to_numpy(g).copy() for p, g in dopt.synchronize()}
    for _, g in dopt.synchronize():  # the same pairs again
        g *= 0.5
    dopt.step()
    for k in before:
        np.testing.assert_allclose(values(params)[k], before[k] - 0.5 * 0.5 * grads[k], rtol=1e-6, atol=1e-7,
                                   err_msg=k)
    assert dopt.check_parameter_closeness(rtol=0, atol=0)
    return "ok"


def expect(error, text, fn):
    try:
        fn()
    except error as e:
        assert text in str(e), f"{error.__name__} without {text!r}: {e}"
        return str(e)
    raise AssertionError(f"no {error.__name__} ({text!r})")


def scenario_misuse_is_refused(comm):
    params = make_params(0)
    dopt = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm)
    expect(RuntimeError, "no step is open; call backward(loss) first", dopt.step)
    expect(RuntimeError, "no step is open", dopt.synchronize)

    pending = dopt.backward(shard_loss(comm, params, 0))
    expect(RuntimeError, "not available while the step is exchanging", lambda: pending.gradients)
    for call in (lambda: dopt.backward(shard_loss(comm, params, 1)),
                 lambda: dopt.backward_and_update(shard_loss(comm, params, 1)),
                 lambda: dopt.backward_and_partial_update(shard_loss(comm, params, 1)),
                 lambda: dopt.backward_and_sparse_update(shard_loss(comm, params, 1)),
                 dopt.average_parameters, dopt.get_states):
        expect(RuntimeError, "still open; apply it with finish() / step(), or drop it with discard()", call)
    pending.finish()
    expect(RuntimeError, "PendingStep.finish: the step is already finished", pending.finish)
    expect(RuntimeError, "PendingStep.synchronize: the step is already finished", pending.synchronize)
    expect(RuntimeError, "no step is open", dopt.step)

    # discard: the exchange completes on every rank, nothing is updated, the next step runs normally
    before = values(params)
    dopt.backward(shard_loss(comm, params, 1)).discard()
    same(values(params), before, "after discard")
    dopt.backward(shard_loss(comm, params, 1))
    dopt.synchronize()
    dopt.discard()
    same(values(params), before, "after discard of a synchronized step")
    assert dopt.pending is None
    dopt.backward_and_update(shard_loss(comm, params, 2))
    assert dopt.check_parameter_closeness(rtol=0, atol=0)
    expect(ValueError, "clip must be None or a bound > 0", lambda: dopt.backward(shard_loss(comm, params, 3), clip=0))
    expect(ValueError, "threshold must be a positive number", lambda: dopt.backward(shard_loss(comm, params, 3), 0))
    assert dopt.pending is None
    return "ok"


def scenario_nonfinite_between_the_phases(comm):
    # A nan on the last rank makes the average non-finite on every rank: synchronize() says so (skip) or raises
    # (raise); either way the next step runs.
    params = make_params(0)
    dopt = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm)
    dopt.backward_and_update(shard_loss(comm, params, 0))
    before = values(params)
    pending = dopt.backward(shard_loss(comm, params, 1, poison=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        pending.synchronize()
    assert pending.skipped is True and dopt.skipped_steps == 1
    pending.finish()
    same(values(params), before, "a skipped step")

    strict = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm, on_nonfinite="raise")
    strict.backward_and_update(shard_loss(comm, params, 0))
    before = values(params)
    pending = strict.backward(shard_loss(comm, params, 1, poison=True))
    expect(FloatingPointError, "contain inf or nan", pending.synchronize)
    assert pending.state == "finished" and strict.pending is None
    expect(RuntimeError, "already finished", pending.finish)
    same(values(params), before, "a refused step")
    strict.backward(shard_loss(comm, params, 2)).finish()
    assert strict.check_parameter_closeness(rtol=0, atol=0)
    return "ok"


def scenario_states_round_trip(comm):
    # A DistOpt that has done partial updates (its ranks' parameters now differ, its partition counter moved),
    # sparse updates with error feedback (residuals), skipped a step and synced its models is saved; a fresh
    # DistOpt given those states and the saved parameters continues bit for bit as the original does.
    def steps(dopt, params, start, stop):
        for step in range(start, stop):
            if step % 2:
                dopt.backward_and_partial_update(shard_loss(comm, params, step), threshold=50)
            else:
                dopt.backward_and_sparse_update(shard_loss(comm, params, step), threshold=100, spars=0.3, topK=True)

    params = make_params(0)
    dopt = opt.DistOpt(make_opt("adam"), communicator=comm)
    steps(dopt, params, 0, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        dopt.backward(shard_loss(comm, params, 3, poison=True)).finish()
    saved, saved_params = dopt.get_states(), fresh_copy(params)
    assert set(saved) == {"opt", "partial", "skipped_steps", "synced", "residuals", "zero_stage"}, sorted(saved)
    assert saved["zero_stage"] == 0, saved
    assert saved["synced"] is True and saved["skipped_steps"] == 1 and saved["partial"] > 0, saved
    assert saved["residuals"] and all(isinstance(k, tuple) for k in saved["residuals"]), saved["residuals"]
    if comm.world_size > 1:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            assert not dopt.check_parameter_closeness(rtol=0, atol=0)  # so a broadcast at resume would show
    steps(dopt, params, 4, 8)
    want = values(params)

    def resume(states):
        resumed = fresh_copy(saved_params)
        other = opt.DistOpt(make_opt("adam"), communicator=comm)
        other.set_states(states)
        got = other.get_states()
        assert {k: got[k] for k in ("partial", "skipped_steps", "synced")} == \
            {k: states[k] for k in ("partial", "skipped_steps", "synced")}, got
        assert other.synced is states["synced"]
        for k, v in saved["residuals"].items():
            np.testing.assert_array_equal(got["residuals"][k], v, err_msg=str(k))
        steps(other, resumed, 4, 8)
        return values(resumed)

    same(resume(saved), want, "resumed from get_states()")
    if comm.world_size > 1:  # without the synced flag the resumed replicas would take rank 0's parameters
        got = resume(dict(saved, synced=False))
        assert any(not np.array_equal(got[k], want[k]) for k in want), "the synced flag made no difference"

    # refused states change nothing
    other = opt.DistOpt(make_opt("adam"), communicator=comm)
    before = other.get_states()
    expect(ValueError, "partial must be an int >= 0", lambda: other.set_states(dict(saved, partial=-1)))
    expect(TypeError, "synced must be a bool", lambda: other.set_states(dict(saved, synced="yes")))
    expect(TypeError, "residual keys are tuples of parameter names",
           lambda: other.set_states(dict(saved, residuals={(1, 2): np.zeros(3, np.float32)})))
    expect(ValueError, "missing ['residuals']", lambda: other.set_states({"opt": saved["opt"], "partial": 0}))
    after = other.get_states()
    assert {k: after[k] for k in ("partial", "skipped_steps", "synced")} == \
        {k: before[k] for k in ("partial", "skipped_steps", "synced")} and not after["residuals"], after
    return "ok"


def scenario_ddp_optimizer_between_the_phases(comm):
    # ddp.DistributedOptimizer is the same two phases: synchronize() between backward() and step() gives the
    # averaged gradients, and what step() applies is them as changed
    from singa_lite.parallel import ddp

    params = make_params(0)
    dopt = ddp.DistributedOptimizer(opt.SGD(lr=0.5), communicator=comm)
    assert isinstance(dopt.dist_opt, opt.DistOpt)
    expect(RuntimeError, "no gradients", dopt.synchronize)
    dopt.step(shard_loss(comm, params, 0))
    before = values(params)
    dopt.backward(shard_loss(comm, params, 1))
    for _, g in dopt.synchronize():
        g.set_value(2.0)
    dopt.step()
    for k in before:
        np.testing.assert_allclose(values(params)[k], before[k] - 1.0, rtol=0, atol=1e-6, err_msg=k)
    return "ok"


def sparse_step(comm, dopt, W, grads, **kw):
    """One backward_and_sparse_update of loss = sum(W * c), whose gradient is c = grads[rank]."""
    autograd.training = True
    c = tensor.from_numpy(np.asarray(grads[comm.rank], tensor.to_numpy(W).dtype))
    dopt.backward_and_sparse_update(autograd.reduce_sum(autograd.mul(W, c)), **kw)


def zeros_param(n, dtype):
    return tensor.Tensor(data=np.zeros(n, dtype), requires_grad=True, stores_grad=True, name="W")


def scenario_sparse_average_does_not_overflow(comm):
    # The ranks' values sum past the dtype's largest (float16 65504, float32 3.4e38) while their average fits:
    # the average is what the step applies, on every rank, with nothing skipped; what was not sent stays in
    # the residual. Ranks alternate between two values (rank r has big[r % 2]).
    P = comm.world_size
    for dt, big in ((np.float16, (30000.0, 50000.0)), (np.float32, (3e38, 2e38))):
        grads = [np.array([big[r % 2], -big[(r + 1) % 2], 0.5, 0.25, 0, 0, 0, 0], dt) for r in range(P)]
        want = -np.mean(np.stack(grads).astype(np.float64), axis=0)  # lr 1: the step is minus the average
        want[2:] = 0  # not sent: below the threshold, or not among the top 2 of 8
        for topK, spars in ((True, 0.25), (False, 1.0)):
            for corr in (True, False):
                where = f"{np.dtype(dt).name} topK={topK} corr={corr}"
                W = zeros_param(8, dt)
                dopt = opt.DistOpt(opt.SGD(lr=1.0), communicator=comm)
                with warnings.catch_warnings():
                    warnings.simplefilter("error", RuntimeWarning)  # no skip, no overflow warning
                    sparse_step(comm, dopt, W, grads, spars=spars, topK=topK, corr=corr)
                got = tensor.to_numpy(W)
                assert np.isfinite(got).all() and dopt.skipped_steps == 0, (where, got)
                np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-3 if dt == np.float16 else 1e-6,
                                           err_msg=where)
                assert dopt.check_parameter_closeness(rtol=0, atol=0), where
                residuals = dopt.get_states()["residuals"]
                if corr:
                    np.testing.assert_array_equal(residuals[("W",)], np.where(np.arange(8) < 2, 0, grads[comm.rank]),
                                                  err_msg=where)
                else:
                    assert not residuals, (where, residuals)
    return "ok"


def scenario_sparse_nonfinite_average_is_skipped(comm):
    # Each rank's gradients are finite, but on rank 0 the residual kept from the last step added to this step's
    # gradient overflows (float16 40000 + 40000; float32 3e38 + 3e38), is sent, and the average is inf. The step
    # is skipped on every rank (on_nonfinite="skip": counted, a warning on rank 0) or raises FloatingPointError on
    # every rank ("raise"), and no parameter, momentum or residual changes anywhere; the next step runs.
    for dt, g, thr, sent, lr in ((np.float16, 40000.0, 50000.0, 60000.0, 1e-3),
                                 (np.float32, 3e38, 3.2e38, 3.3e38, 1e-30)):
        for mode in ("skip", "raise"):
            where = f"{np.dtype(dt).name} on_nonfinite={mode}"
            W = zeros_param(4, dt)
            dopt = opt.DistOpt(opt.SGD(lr=lr, momentum=0.9), communicator=comm, on_nonfinite=mode)
            kw = {"spars": thr, "topK": False, "corr": True}
            # step 1: entry 1 is sent (the average moves W and the momentum), entry 0 of rank 0 is kept
            sparse_step(comm, dopt, W, [np.array([g if r == 0 else 1, sent, 0, 0], dt)
                                        for r in range(comm.world_size)], **kw)
            assert tensor.to_numpy(W)[1] != 0 and dopt.skipped_steps == 0, (where, tensor.to_numpy(W))
            before, states = tensor.to_numpy(W).copy(), dopt.get_states()
            assert states["residuals"][("W",)][0] == (g if comm.rank == 0 else 1), (where, states["residuals"])
            poisoned = [np.array([g if r == 0 else 2, 3, 0, 0], dt) for r in range(comm.world_size)]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", RuntimeWarning)
                if mode == "skip":
                    sparse_step(comm, dopt, W, poisoned, **kw)
                else:
                    try:
                        sparse_step(comm, dopt, W, poisoned, **kw)
                    except FloatingPointError as e:
                        assert "the averaged gradients contain inf or nan; no parameter was changed on any " \
                               "rank" in str(e), e
                    else:
                        raise AssertionError(f"{where}: no FloatingPointError")
            if mode == "skip":
                assert dopt.skipped_steps == 1, (where, dopt.skipped_steps)
                texts = [str(w.message) for w in caught]
                if comm.rank == 0:
                    assert any("inf or nan in the averaged gradients: step skipped on every rank" in t
                               for t in texts), (where, texts)
                else:
                    assert not texts, (where, texts)
            else:
                assert dopt.skipped_steps == 0, where
            same({"W": tensor.to_numpy(W)}, {"W": before}, f"{where}: parameters")
            after = dopt.get_states()
            for slot, values in states["opt"].items():
                if isinstance(values, dict):
                    same(after["opt"][slot], values, f"{where}: optimizer {slot}")
            same(after["residuals"], states["residuals"], f"{where}: residuals")
            # the next step applies on every rank alike
            sparse_step(comm, dopt, W, [np.array([1, 2, 3, 4], dt)] * comm.world_size, **kw)
            assert np.isfinite(tensor.to_numpy(W)).all() and not np.array_equal(tensor.to_numpy(W), before), where
            assert dopt.check_parameter_closeness(rtol=0, atol=0), where
    return "ok"


SCENARIOS = {
    "sparse_average_does_not_overflow": scenario_sparse_average_does_not_overflow,
    "sparse_nonfinite_average_is_skipped": scenario_sparse_nonfinite_average_is_skipped,
    "ddp_optimizer_between_the_phases": scenario_ddp_optimizer_between_the_phases,
    "two_phases_equal_backward_and_update": scenario_two_phases_equal_backward_and_update,
    "averaged_gradients_between_the_phases": scenario_averaged_gradients_between_the_phases,
    "misuse_is_refused": scenario_misuse_is_refused,
    "nonfinite_between_the_phases": scenario_nonfinite_between_the_phases,
    "states_round_trip": scenario_states_round_trip,
}


def run(comm, name):
    return SCENARIOS[name](comm)
