"""DistOpt checks shared by the mpi (mpiexec) and shm (multiprocessing) tests. Each scenario takes a
Communicator, trains a small model for some steps with DistOpt, and raises AssertionError when the
expectation fails; the reference (one process, the whole batch) is computed on every rank locally."""
from __future__ import annotations

import numpy as np

from singa_lite import _core, autograd, opt, tensor

N, D, H, C = 24, 7, 40, 5  # global batch, input, hidden, classes (hidden 40: W1 has 280 elements)


def data(step: int):
    rng = np.random.default_rng(1000 + step)
    return rng.standard_normal((N, D)).astype(np.float32), rng.integers(0, C, N).astype(np.int32)


def make_params(seed: int):
    rng = np.random.default_rng(seed)
    shapes = {"W1": (D, H), "b1": (H,), "W2": (H, C), "b2": (C,)}
    return {k: tensor.Tensor(data=(rng.standard_normal(s) * 0.3).astype(np.float32), requires_grad=True,
                             stores_grad=True, name=k) for k, s in shapes.items()}


def loss_of(params, x, y):
    h = autograd.tanh(autograd.add_bias(autograd.matmul(tensor.from_numpy(x), params["W1"]), params["b1"]))
    logits = autograd.add_bias(autograd.matmul(h, params["W2"]), params["b2"])
    return autograd.softmax_cross_entropy(logits, tensor.from_numpy(y))


class UserSGD(opt.Optimizer):
    """An optimizer written by a user to the contract of opt.py: DistOpt must need nothing else."""

    def apply(self, param_name, param_value, param_grad):
        g = self._check(param_name, param_value, param_grad)
        _core.axpy_(-self.lr_value, g, param_value.data)


def make_opt(kind: str):
    if kind == "user":
        return UserSGD(lr=0.2)
    return {"sgd": lambda: opt.SGD(lr=0.1, momentum=0.9), "adam": lambda: opt.Adam(lr=0.01),
            "rmsprop": lambda: opt.RMSProp(lr=0.01), "adagrad": lambda: opt.AdaGrad(lr=0.05),
            # large-batch optimizers: per-parameter norms of the averaged gradients must give 1-process ratios
            "adamw": lambda: opt.AdamW(lr=0.01, weight_decay=0.1, amsgrad=True),
            "lamb": lambda: opt.LAMB(lr=0.02, weight_decay=0.01),
            "lars": lambda: opt.LARS(lr=1.0, momentum=0.9, eta=0.02, weight_decay=1e-3)}[kind]()


def shard_of(x, y, rank: int, world: int):
    """Rank `rank`'s consecutive 1/world of the batch (x, y): how every scenario splits the data."""
    per = N // world
    return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]


def train(params, optimizer, steps: int, shard=None, method="backward_and_update", **kw):
    autograd.training = True
    for step in range(steps):
        x, y = data(step)
        if shard is not None:
            x, y = shard_of(x, y, *shard)
        loss = loss_of(params, x, y)
        if method is None:
            optimizer(loss)
        else:
            getattr(optimizer, method)(loss, **kw)
    return {k: tensor.to_numpy(v) for k, v in params.items()}


def reference(kind: str, steps: int):
    return train(make_params(0), make_opt(kind), steps, method=None)


def scenario_equivalence(comm, kind="sgd", threshold=2097152, buff=4194304, steps=20, rtol=1e-5, first_bucket=262144,
                         exchange="thread"):
    params = make_params(0)
    dopt = opt.DistOpt(make_opt(kind), communicator=comm, buffSize=buff, first_bucket=first_bucket, exchange=exchange)
    got = train(params, dopt, steps, shard=(comm.rank, comm.world_size), threshold=threshold)
    want = reference(kind, steps)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=rtol, err_msg=f"{k} ({kind}, {threshold})")
    return "ok"


def scenario_half(comm, steps=20):
    params = make_params(0)
    dopt = opt.DistOpt(make_opt("sgd"), communicator=comm)
    got = train(params, dopt, steps, shard=(comm.rank, comm.world_size), method="backward_and_update_half",
                threshold=100, clipping=True, clip_Value=50.0)
    want = reference("sgd", steps)
    for k in want:  # fp16 on the wire: ~3 significant digits per step
        np.testing.assert_allclose(got[k], want[k], rtol=2e-2, atol=2e-2, err_msg=k)
    return "ok"


def scenario_sparse_full_equals_plain(comm, steps=10):
    params = make_params(0)
    dopt = opt.DistOpt(make_opt("sgd"), communicator=comm)
    got = train(params, dopt, steps, shard=(comm.rank, comm.world_size), method="backward_and_sparse_update",
                threshold=100, spars=1.0, topK=True, corr=True)
    want = reference("sgd", steps)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)
    return "ok"


def scenario_sparse_error_feedback(comm):
    # sent + residual == gradient sum: with corr the residual keeps exactly what was not sent.
    dopt = opt.DistOpt(make_opt("sgd"), communicator=comm)
    rng = np.random.default_rng(comm.rank)
    g = rng.standard_normal(1000).astype(np.float32)
    t = tensor.from_numpy(g.copy())
    acc = tensor.from_numpy(np.zeros(1000, np.float32))
    dopt.sparsification(t, acc, 0.1, True)  # top 10%
    sent_sum = tensor.to_numpy(t)
    residual = tensor.to_numpy(acc)
    assert np.count_nonzero(residual) == 900
    every_g = tensor.to_numpy(comm.all_gather(tensor.from_numpy(g)))
    every_res = tensor.to_numpy(comm.all_gather(tensor.from_numpy(residual)))
    np.testing.assert_allclose(sent_sum + every_res.sum(0), every_g.sum(0), rtol=1e-5, atol=1e-5)
    # threshold mode: exactly the entries with |g| >= spars are sent
    t2, acc2 = tensor.from_numpy(g.copy()), tensor.from_numpy(np.zeros(1000, np.float32))
    dopt.sparsification(t2, acc2, 1.0, False)
    np.testing.assert_array_equal(tensor.to_numpy(acc2) != 0, np.abs(g) < 1.0)
    return "ok"


def scenario_partial(comm, steps=6):
    params = make_params(0)
    dopt = opt.DistOpt(make_opt("sgd"), communicator=comm)
    train(params, dopt, steps, shard=(comm.rank, comm.world_size), method="backward_and_partial_update",
          threshold=50)
    if comm.world_size > 1:
        assert not dopt.check_parameter_closeness(rtol=1e-9, atol=1e-9) or steps == 0
    dopt.average_parameters()
    assert dopt.check_parameter_closeness(rtol=1e-6, atol=1e-7)
    return "ok"


def scenario_first_step_sync(comm):
    # Every rank starts from different values and nobody synchronised them: the first step gives every rank
    # rank 0's values before updating, so the replicas agree from then on.
    params = make_params(comm.rank)
    dopt = opt.DistOpt(make_opt("sgd"), communicator=comm)
    train(params, dopt, 2, shard=(comm.rank, comm.world_size))
    assert dopt.check_parameter_closeness(rtol=0, atol=0)
    # broadcast_parameters does it up front (Model.compile calls it): then even step 1 matches one process
    params = make_params(comm.rank)
    dopt = opt.DistOpt(make_opt("sgd"), communicator=comm)
    dopt.broadcast_parameters(params)
    got = train(params, dopt, 3, shard=(comm.rank, comm.world_size))
    want = reference("sgd", 3)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)
    return "ok"


def scenario_states_resume(comm):
    # Sparse top-K with error feedback (residuals) and Adam state: saving after 3 steps and resuming in a
    # fresh DistOpt gives bit-identical parameters to the uninterrupted run.
    def run(steps, states=None, params=None):
        params = params or make_params(0)
        dopt = opt.DistOpt(make_opt("adam"), communicator=comm)
        if states is not None:
            dopt.set_states(states)
            dopt.broadcast_parameters(params)
        autograd.training = True
        for step in range(steps[0], steps[1]):
            x, y = data(step)
            per = N // comm.world_size
            x, y = x[comm.rank * per:(comm.rank + 1) * per], y[comm.rank * per:(comm.rank + 1) * per]
            dopt.backward_and_sparse_update(loss_of(params, x, y), threshold=100, spars=0.2, topK=True)
        return params, dopt

    straight, _ = run((0, 6))
    params, dopt = run((0, 3))
    saved = dopt.get_states()
    assert saved["residuals"], "sparse error feedback left no residuals to save"
    fresh = {k: tensor.Tensor(data=tensor.to_numpy(v), requires_grad=True, stores_grad=True, name=k)
             for k, v in params.items()}
    resumed, _ = run((3, 6), states=saved, params=fresh)
    for k in straight:
        np.testing.assert_array_equal(tensor.to_numpy(resumed[k]), tensor.to_numpy(straight[k]), err_msg=k)
    return "ok"


def scenario_model_mismatch(comm):
    params = make_params(0)
    if comm.rank == 1:
        params["W2"] = tensor.Tensor(data=np.zeros((H, C + 1), np.float32), requires_grad=True,
                                     stores_grad=True, name="W2")
        params["b2"] = tensor.Tensor(data=np.zeros(C + 1, np.float32), requires_grad=True, stores_grad=True,
                                     name="b2")
    dopt = opt.DistOpt(make_opt("sgd"), communicator=comm)
    autograd.training = True
    x, y = data(0)
    try:
        dopt.backward_and_update(loss_of(params, x, y))
    except ValueError as e:
        assert "models differ" in str(e) and "rank 1" in str(e), e
        return "ok"
    raise AssertionError("different models were not detected")


def scenario_singa_low_level(comm):
    # The six checks of SINGA's own test_dist.py, through the low-level calls SINGA scripts use: every rank
    # holds param = 10 and grad = 1; after the exchange and update(param, grad) (which divides by the world
    # size) with lr 0.1, param = 9.9 on every rank, whatever the world size.
    sgd = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm)

    def check(exchange):
        param = tensor.Tensor((10, 10)).set_value(10.0)
        grad = tensor.Tensor((10, 10)).set_value(1.0)
        exchange(grad)
        sgd.wait()
        sgd.update(param, grad)
        np.testing.assert_allclose(tensor.to_numpy(param), np.full((10, 10), 9.9, np.float32), atol=1e-5)

    check(lambda g: sgd.all_reduce(g.data))
    check(lambda g: (sgd.fused_all_reduce([g.data], send=False), sgd.fused_all_reduce([g.data])))
    check(lambda g: sgd.all_reduce_half(g.data))
    check(lambda g: (sgd.fused_all_reduce_half([g.data], send=False), sgd.fused_all_reduce_half([g.data])))
    check(lambda g: sgd.sparsification(g.data, accumulation=None, spars=0.05, topK=False))
    check(lambda g: sgd.sparsification(g.data, accumulation=None, spars=1, topK=True))
    return "ok"


def scenario_buckets_leave_during_backward(comm):
    """Overlap: a bucket's all-reduce is launched while backward still runs. The gradients come as b2 (5), W2
    (200), b1 (40), W1 (280); with first_bucket=200 the first bucket leaves as soon as it holds 205 elements,
    before b1's gradient exists; the rest leaves with the last gradient. first_bucket=0 / overlap=False: one
    bucket, after the whole backward pass."""

    calls = []  # each all_reduce's async_op

    def events_of_a_step(threshold=2097152, **kw):
        calls.clear()
        params = make_params(0)
        dopt = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm, **kw)
        shard = (comm.rank, comm.world_size)
        train(params, dopt, 1, shard=shard, threshold=threshold)  # the first step compares the models
        events, real_backward, real_all_reduce = [], autograd.backward, comm.all_reduce

        def backward(loss):
            for p, g in real_backward(loss):
                events.append(("grad", p.name))
                yield p, g

        def all_reduce(t, op="sum", async_op=False):
            events.append(("send", t.numel))
            calls.append(async_op)
            return real_all_reduce(t, op, async_op)
        autograd.backward, comm.all_reduce = backward, all_reduce
        try:
            train(params, dopt, 1, shard=shard, threshold=threshold)
        finally:
            autograd.backward = real_backward
            del comm.all_reduce
        return [e for e in events if e != ("send", 1)]  # the one-element finiteness vote

    grads = [("grad", n) for n in ("b2", "W2", "b1", "W1")]
    got = events_of_a_step(first_bucket=200)
    assert got == grads[:2] + [("send", 205)] + grads[2:] + [("send", 320)], got
    assert events_of_a_step(first_bucket=0) == grads + [("send", 525)]
    assert events_of_a_step(overlap=False) == grads + [("send", 525)]
    # large tensors go alone as they come; the first bucket waits for its threshold as any other
    got = events_of_a_step(first_bucket=200, threshold=100)
    assert got == grads[:2] + [("send", 200)] + grads[2:] + [("send", 280), ("send", 45)], got
    # where the all-reduces run changes nothing of when they start: on the communication thread (async) or
    # inline, on this thread, before backward goes on
    for exchange, asynchronous in (("thread", True), ("inline", False)):
        got = events_of_a_step(first_bucket=200, exchange=exchange)
        assert got == grads[:2] + [("send", 205)] + grads[2:] + [("send", 320)], (exchange, got)
        assert calls[:2] == [asynchronous] * 2 and calls[2:] == [False], (exchange, calls)  # then the vote
    return "ok"


def scenario_exchange_modes(comm):
    """The thread is the default; both modes are kept where they are set; anything else is refused."""
    assert opt.DistOpt(opt.SGD(lr=0.1), communicator=comm).reducer.exchange_mode == "thread"
    assert opt.DistOpt(opt.SGD(lr=0.1), communicator=comm, exchange="inline").reducer.exchange_mode == "inline"
    for bad in ("auto", "fast", None):
        try:
            opt.DistOpt(opt.SGD(lr=0.1), communicator=comm, exchange=bad)
        except ValueError as e:
            assert "exchange must be 'thread' (the default" in str(e) and f"got {bad!r}" in str(e), e
        else:
            raise AssertionError(f"exchange={bad!r} was accepted")
    return "ok"

SCENARIOS = {
    "singa_low_level": scenario_singa_low_level,
    "equivalence_sgd": lambda c: scenario_equivalence(c, "sgd"),
    "equivalence_adam": lambda c: scenario_equivalence(c, "adam"),
    "equivalence_other_optimizers": lambda c: [scenario_equivalence(c, k, steps=10) for k in
                                               ("rmsprop", "adagrad", "user", "adamw", "lamb", "lars")],
    "equivalence_small_buckets": lambda c: scenario_equivalence(c, "sgd", threshold=50, buff=100),
    "equivalence_small_first_bucket": lambda c: scenario_equivalence(c, "sgd", threshold=300, first_bucket=100),
    "buckets_leave_during_backward": scenario_buckets_leave_during_backward,
    "equivalence_inline": lambda c: scenario_equivalence(c, "adam", threshold=300, first_bucket=100, exchange="inline"),
    "equivalence_thread": lambda c: scenario_equivalence(c, "adam", threshold=300, first_bucket=100, exchange="thread"),
    "exchange_modes": scenario_exchange_modes,
    "half": scenario_half,
    "sparse_full": scenario_sparse_full_equals_plain,
    "sparse_feedback": scenario_sparse_error_feedback,
    "partial": scenario_partial,
    "first_step_sync": scenario_first_step_sync,
    "states_resume": scenario_states_resume,
    "model_mismatch": scenario_model_mismatch,
}


def run_all(comm):
    done = []
    for name, fn in SCENARIOS.items():
        if name == "model_mismatch" and comm.world_size == 1:
            continue
        fn(comm)
        done.append(name)
    return done
