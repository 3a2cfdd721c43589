"""Scenarios for DistOpt's training features (gradient accumulation, clipping by the global norm, buffers
and SyncBatchNorm2d, uneven inputs with join), shared by the shm tests (test_training_features.py, processes
started by multiprocessing) and the mpi job (training_job.py under mpiexec). Each takes a Communicator and
raises AssertionError when an expectation fails; references are one process on the whole batch, computed
on every rank locally."""
from __future__ import annotations

import numpy as np

from singa_lite import autograd, opt, tensor

from distopt_cases import N, data, loss_of, make_opt, make_params, reference, train


def micro_batch(comm, step: int, j: int, k: int):
    """Micro-batch j of k of this rank's share of step `step`'s batch."""
    x, y = data(step)
    per = N // comm.world_size
    micro = per // k
    lo = comm.rank * per + j * micro
    return x[lo:lo + micro], y[lo:lo + micro]


def values(params) -> dict:
    return {k: tensor.to_numpy(v).copy() for k, v in params.items()}


def close(got: dict, want: dict, tol: float, what: str) -> None:
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=tol, atol=tol, err_msg=f"{what}: {name}")


# ---------------------------------------------------------------- gradient accumulation
def accumulate(comm, k: int, spelling: str, steps: int = 20):
    """Trains `steps` updates of k micro-batches per rank; returns (parameters, bytes_sent)."""
    params = make_params(0)
    if spelling == "sum":  # plain sums of k passes: the same as averaging with k times the learning rate
        dopt = opt.DistOpt(opt.SGD(lr=0.1 / k, momentum=0.9), communicator=comm, backward_passes_per_step=k,
                           average_accumulated=False)
    else:
        dopt = opt.DistOpt(make_opt("sgd"), communicator=comm,
                           backward_passes_per_step=1 if spelling == "no_sync" else k)
    autograd.training = True
    for step in range(steps):
        for j in range(k):
            loss = loss_of(params, *micro_batch(comm, step, j, k))
            if spelling in ("per_step", "sum"):
                dopt.backward_and_update(loss, threshold=150)
            elif spelling == "half":
                dopt.backward_and_update_half(loss, threshold=150)
            elif spelling == "sparse":
                dopt.backward_and_sparse_update(loss, threshold=150, spars=1.0, topK=True, corr=True)
            elif spelling == "two_phase":
                pending = dopt.backward(loss, 150)
                pairs = pending.synchronize()
                assert pending.accumulating == (j < k - 1), (j, pending)
                assert (pairs == []) == (j < k - 1), (j, len(pairs))
                pending.finish()
            elif spelling == "no_sync":
                if j < k - 1:
                    with dopt.no_sync():
                        dopt.backward_and_update(loss, threshold=150)
                else:
                    dopt.backward_and_update(loss, threshold=150)
            assert dopt.accumulated_passes == (j + 1) % k, (j, dopt.accumulated_passes)
    return values(params), dopt.bytes_sent


def scenario_accumulation(comm):
    want = reference("sgd", 20)
    plain = opt.DistOpt(make_opt("sgd"), communicator=comm)
    train(make_params(0), plain, 20, shard=(comm.rank, comm.world_size), threshold=150)
    for k in (2, 4):
        for spelling in ("per_step", "two_phase", "no_sync", "sum", "sparse"):
            got, sent = accumulate(comm, k, spelling)
            close(got, want, 1e-5, f"k={k} {spelling}")
            if spelling != "sparse":  # k passes per exchange: the bytes of 20 plain steps for 20 * k passes
                assert sent == plain.bytes_sent, (k, spelling, sent, plain.bytes_sent)
        got, _ = accumulate(comm, k, "half")
        close(got, want, 2e-2, f"k={k} half")
    return "ok"


def scenario_accumulation_misuse(comm):
    for bad in (0, -1, 1.5, True):
        try:
            opt.DistOpt(make_opt("sgd"), communicator=comm, backward_passes_per_step=bad)
        except ValueError as e:
            assert "backward_passes_per_step must be an int >= 1" in str(e), e
        else:
            raise AssertionError(f"backward_passes_per_step={bad!r} accepted")
    params = make_params(0)
    dopt = opt.DistOpt(make_opt("sgd"), communicator=comm, backward_passes_per_step=2)
    autograd.training = True
    before = values(params)
    dopt.backward_and_update(loss_of(params, *micro_batch(comm, 0, 0, 2)))
    close(values(params), before, 0, "an accumulating pass changes nothing")
    try:
        dopt.get_states()
    except RuntimeError as e:
        assert "1 backward pass(es) of gradient accumulation" in str(e), e
    else:
        raise AssertionError("get_states in the middle of an accumulation window")
    # discarding an accumulating pass drops that pass only; discarding the exchanging pass drops the window
    with dopt.no_sync():
        dopt.backward(loss_of(params, *micro_batch(comm, 0, 1, 2))).discard()
    assert dopt.accumulated_passes == 1
    dopt.backward(loss_of(params, *micro_batch(comm, 0, 1, 2))).discard()
    assert dopt.accumulated_passes == 0
    close(values(params), before, 0, "discarded passes change nothing")
    dopt.backward_and_update(loss_of(params, *micro_batch(comm, 0, 0, 2)))
    dopt.backward_and_update(loss_of(params, *micro_batch(comm, 0, 1, 2)))
    assert dopt.accumulated_passes == 0 and dopt.get_states()["partial"] == 0
    assert not np.array_equal(values(params)["W1"], before["W1"])
    return "ok"


# ---------------------------------------------------------------- clipping by the global norm
def shard(comm, step: int):
    x, y = data(step)
    per = N // comm.world_size
    return x[comm.rank * per:(comm.rank + 1) * per], y[comm.rank * per:(comm.rank + 1) * per]


def whole_batch_grads(params, step: int) -> dict:
    autograd.training = True
    return {p.name: tensor.to_numpy(g).astype(np.float64) for p, g in autograd.backward(loss_of(params,
                                                                                            *data(step)))}


def numpy_norm(grads: dict, p) -> float:
    flat = np.concatenate([g.ravel() for g in grads.values()])
    return float(np.abs(flat).max()) if p == "inf" else float((np.abs(flat) ** p).sum() ** (1.0 / p))


def same_everywhere(comm, arrays: dict, what: str) -> None:
    for name, a in arrays.items():
        rows = tensor.to_numpy(comm.all_gather(tensor.from_numpy(np.ascontiguousarray(a, np.float32))))
        for r in range(comm.world_size):
            assert rows[r].tobytes() == rows[0].tobytes(), f"{what}: {name} differs between rank 0 and rank {r}"


def clipped_reference(steps: int, max_norm: float) -> dict:
    """One process on the whole batch, SGD with momentum, gradients clipped in numpy."""
    params, sgd = make_params(0), make_opt("sgd")
    for step in range(steps):
        grads = whole_batch_grads(params, step)
        factor = min(1.0, max_norm / (numpy_norm(grads, 2) + 1e-6))
        for name, p in params.items():
            sgd.apply(name, p, tensor.from_numpy((grads[name] * factor).astype(np.float32)))
        sgd.step()
    return values(params)


def scenario_clip_grad_norm(comm):
    from singa_lite import parallel
    from singa_lite.parallel import ddp

    # the norm of the averaged gradients, for each norm type, against numpy on the whole batch
    params = make_params(0)
    dopt = opt.DistOpt(make_opt("sgd"), communicator=comm)
    for p_norm in (2, 1, 3, "inf"):
        want = whole_batch_grads(make_params(0), 0)
        norm = numpy_norm(want, p_norm)
        max_norm = norm / 3
        pending = dopt.backward(loss_of(params, *shard(comm, 0)))
        got_norm = pending.clip_grad_norm(max_norm, p_norm)
        assert abs(got_norm - norm) <= 1e-5 * norm, (p_norm, got_norm, norm)
        got = {p.name: tensor.to_numpy(g) for p, g in pending.gradients}
        for name in want:
            np.testing.assert_allclose(got[name], want[name] * max_norm / (norm + 1e-6), rtol=1e-5, atol=1e-7,
                                       err_msg=f"{name} ({p_norm})")
        same_everywhere(comm, got, f"clipped gradients ({p_norm})")
        assert opt.grad_norm(pending.gradients, p_norm) <= max_norm * (1 + 1e-5)
        pending.discard()
    # a norm below max_norm changes nothing
    pending = dopt.backward(loss_of(params, *shard(comm, 0)))
    before = {p.name: tensor.to_numpy(g).copy() for p, g in pending.synchronize()}
    opt.clip_grad_norm(pending.synchronize(), 1e6)
    for p, g in pending.gradients:
        np.testing.assert_array_equal(tensor.to_numpy(g), before[p.name])
    pending.discard()

    # 20 steps of training with clipping, three ways, against one process clipping in numpy
    max_norm = 0.5 * numpy_norm(whole_batch_grads(make_params(0), 0), 2)
    want = clipped_reference(20, max_norm)
    for how in ("dist_opt", "ddp", "data_parallel"):
        params = make_params(0)
        if how == "dist_opt":
            trainer = opt.DistOpt(make_opt("sgd"), communicator=comm)
        elif how == "ddp":
            trainer = ddp.DistributedOptimizer(make_opt("sgd"), communicator=comm)
        else:
            model = parallel.DataParallel(params, communicator=comm)
            sgd = make_opt("sgd")
        for step in range(20):
            loss = loss_of(params, *shard(comm, step))
            if how == "dist_opt":
                trainer.backward(loss)
                trainer.clip_grad_norm(max_norm)
                trainer.step()
            elif how == "ddp":
                trainer.backward(loss)
                trainer.clip_grad_norm(max_norm)
                trainer.step()
            else:
                pairs = list(autograd.backward(loss))
                opt.clip_grad_norm(pairs, max_norm)
                for p, g in pairs:
                    sgd.apply(p.name, p, g)
                sgd.step()
        got = values(params)
        close(got, want, 1e-5, f"clipped training ({how})")
        same_everywhere(comm, got, f"clipped training ({how})")
        if how == "data_parallel":
            model.remove_hooks()

    for bad, text in ((0, "max_norm must be a number > 0"), (-1.0, "max_norm must be a number > 0")):
        try:
            opt.clip_grad_norm([tensor.from_numpy(np.ones(3, np.float32))], bad)
        except ValueError as e:
            assert text in str(e), e
        else:
            raise AssertionError(f"max_norm={bad} accepted")
    try:
        opt.clip_grad_norm([tensor.from_numpy(np.ones(3, np.float32))], 1.0, norm_type=0)
    except ValueError as e:
        assert "norm_type must be a number > 0 or 'inf'" in str(e), e
    else:
        raise AssertionError("norm_type=0 accepted")
    return "ok"


# ---------------------------------------------------------------- buffers and SyncBatchNorm2d
BN_N, BN_C, BN_HW = 12, 3, 4  # global batch, channels, height = width


def bn_data(step: int):
    rng = np.random.default_rng(500 + step)
    x = (rng.standard_normal((BN_N, BN_C, BN_HW, BN_HW)) * 2 + 1).astype(np.float32)
    return x, rng.standard_normal((BN_N, BN_C * BN_HW * BN_HW)).astype(np.float32)


def bn_step(bn, w, x: np.ndarray, t: np.ndarray):
    """Forward: x * w (per channel) -> bn -> mse against t; returns (y, loss, x tensor)."""
    autograd.training = True
    xt = tensor.Tensor(data=x.copy(), requires_grad=True, stores_grad=True, name="x")
    y = bn(autograd.mul(xt, w))
    return y, autograd.mse_loss(autograd.flatten(y), tensor.from_numpy(t)), xt


def bn_model(layer_cls, **kw):
    from singa_lite import layer
    from singa_lite.parallel import sync_batchnorm

    bn = getattr(sync_batchnorm if layer_cls == "SyncBatchNorm2d" else layer, layer_cls)(BN_C, **kw)
    rng = np.random.default_rng(7)
    bn.scale.copy_from_numpy((rng.standard_normal(BN_C) * 0.5 + 1).astype(np.float32))
    bn.bias.copy_from_numpy((rng.standard_normal(BN_C) * 0.5).astype(np.float32))
    w = tensor.Tensor(data=(rng.standard_normal((1, BN_C, 1, 1)) + 1).astype(np.float32), requires_grad=True,
                      stores_grad=True, name="w")
    bn.scale.name, bn.bias.name = "scale", "bias"
    return bn, w


def scenario_sync_batchnorm(comm):
    P, per = comm.world_size, BN_N // comm.world_size
    lo, hi = comm.rank * per, (comm.rank + 1) * per
    # one step's outputs and gradients: P ranks x per with SyncBatchNorm2d == 1 process x BN_N with BatchNorm2d
    ref_bn, ref_w = bn_model("BatchNorm2d")
    bn, w = bn_model("SyncBatchNorm2d", communicator=comm)
    x, t = bn_data(0)
    y_ref, loss_ref, x_ref = bn_step(ref_bn, ref_w, x, t)
    g_ref = {p.name: tensor.to_numpy(g).copy() for p, g in autograd.backward(loss_ref)}
    y, loss, xt = bn_step(bn, w, x[lo:hi], t[lo:hi])
    np.testing.assert_allclose(tensor.to_numpy(y), tensor.to_numpy(y_ref)[lo:hi], rtol=1e-5, atol=1e-5)
    g = {p.name: tensor.to_numpy(gr).copy() for p, gr in autograd.backward(loss)}
    # dx: this rank's loss is the mean over its share, the reference's over the whole batch: P times larger
    np.testing.assert_allclose(g["x"], P * g_ref["x"][lo:hi], rtol=1e-4, atol=1e-6, err_msg="dx")
    for name in ("w", "scale", "bias"):  # the parameters' gradients, averaged over the ranks
        avg = tensor.from_numpy(g[name])
        comm.all_reduce(avg, "avg")
        np.testing.assert_allclose(tensor.to_numpy(avg), g_ref[name], rtol=1e-4, atol=1e-6, err_msg=name)
    for name in ("running_mean", "running_var"):
        np.testing.assert_allclose(tensor.to_numpy(getattr(bn, name)), tensor.to_numpy(getattr(ref_bn, name)),
                                   rtol=1e-5, atol=1e-6, err_msg=name)

    # ten steps of training with DistOpt: parameters and running statistics as the one process's
    ref_bn, ref_w = bn_model("BatchNorm2d")
    bn, w = bn_model("SyncBatchNorm2d", communicator=comm)
    ref_sgd, dopt = opt.SGD(lr=0.1, momentum=0.9), opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm)
    for step in range(10):
        x, t = bn_data(step)
        ref_sgd(bn_step(ref_bn, ref_w, x, t)[1])
        dopt.backward_and_update(bn_step(bn, w, x[lo:hi], t[lo:hi])[1])
    for name, a, b in (("w", w, ref_w), ("scale", bn.scale, ref_bn.scale), ("bias", bn.bias, ref_bn.bias),
                       ("running_mean", bn.running_mean, ref_bn.running_mean),
                       ("running_var", bn.running_var, ref_bn.running_var)):
        np.testing.assert_allclose(tensor.to_numpy(a), tensor.to_numpy(b), rtol=1e-4, atol=1e-5, err_msg=name)
    same_everywhere(comm, {"running_mean": tensor.to_numpy(bn.running_mean),
                           "running_var": tensor.to_numpy(bn.running_var)}, "SyncBatchNorm2d running statistics")
    # evaluation uses the running statistics, with no collective (only rank 0 evaluates here)
    autograd.training = False
    if comm.rank == 0:
        x, _ = bn_data(0)
        y_eval = tensor.to_numpy(bn(tensor.from_numpy(x)))
        mean = tensor.to_numpy(bn.running_mean).reshape(1, -1, 1, 1)
        var = tensor.to_numpy(bn.running_var).reshape(1, -1, 1, 1)
        want = (x - mean) / np.sqrt(var + 1e-5) * tensor.to_numpy(bn.scale).reshape(1, -1, 1, 1) \
            + tensor.to_numpy(bn.bias).reshape(1, -1, 1, 1)
        np.testing.assert_allclose(y_eval, want, rtol=1e-4, atol=1e-4)
    comm.barrier()
    # bad input and a missing communicator: clear errors, no collective started
    from singa_lite.parallel.sync_batchnorm import SyncBatchNorm2d

    autograd.training = True
    for bad in (np.ones((4, BN_C, 2), np.float32), np.ones((1, BN_C, 1, 1), np.float32) if P == 1 else None):
        if bad is None:
            continue
        try:
            bn(tensor.from_numpy(bad))
        except ValueError as e:
            assert "SyncBatchNorm2d" in str(e), e
        else:
            raise AssertionError(f"input of shape {bad.shape} accepted")
    try:
        SyncBatchNorm2d(BN_C)(tensor.from_numpy(bn_data(0)[0]))
    except RuntimeError as e:
        assert "needs the ranks' communicator for training" in str(e), e
    else:
        raise AssertionError("SyncBatchNorm2d trained without a communicator")
    autograd.training = False
    SyncBatchNorm2d(BN_C)(tensor.from_numpy(bn_data(0)[0]))  # evaluation needs none
    return "ok"


def bn_net():
    """A Model of one BatchNorm2d(BN_C): its running statistics are the buffers."""
    from singa_lite import layer, model as model_mod

    class Net(model_mod.Model):
        def __init__(self):
            super().__init__()
            self.bn = layer.BatchNorm2d(BN_C)

        def forward(self, x):
            return self.bn(x)

    return Net()


def scenario_sync_buffers(comm):
    results = {}
    for how in (True, "average", False):
        net = bn_net()
        dopt = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm, broadcast_buffers=how)
        net.set_optimizer(dopt)
        net.train()
        x, _ = bn_data(comm.rank)  # each rank's own batch: its running statistics differ
        net.forward(tensor.from_numpy(x))
        mine = {k: tensor.to_numpy(v).copy() for k, v in (("mean", net.bn.running_mean), ("var", net.bn.running_var))}
        every = {k: tensor.to_numpy(comm.all_gather(tensor.from_numpy(v))) for k, v in mine.items()}
        net.eval()  # Model.eval() calls dopt.sync_buffers(net)
        got = {"mean": tensor.to_numpy(net.bn.running_mean), "var": tensor.to_numpy(net.bn.running_var)}
        for k in got:
            want = {True: every[k][0], "average": every[k].mean(0), False: mine[k]}[how]
            np.testing.assert_allclose(got[k], want, rtol=1e-6, atol=1e-7, err_msg=f"{how} {k}")
        if how is not False:
            same_everywhere(comm, got, f"buffers ({how})")
        results[how] = got
    # by hand, on a plain dict, and bad modes
    d = {"m": tensor.from_numpy(np.full(4, float(comm.rank), np.float32))}
    dopt.sync_buffers(d, how="average")
    np.testing.assert_allclose(tensor.to_numpy(d["m"]), np.full(4, (comm.world_size - 1) / 2), rtol=1e-6)
    try:
        opt.DistOpt(opt.SGD(lr=0.1), communicator=comm, broadcast_buffers="mean")
    except ValueError as e:
        assert "broadcast_buffers must be True" in str(e), e
    else:
        raise AssertionError("broadcast_buffers='mean' accepted")
    return "ok"


def scenario_buffers_at_checkpoint(comm):
    # A checkpoint holds one model whose buffers are what sync_buffers would give (rank 0's, or the ranks'
    # mean with "average"), and every rank's own buffers besides: the same job resumes bit for bit, a
    # resharded load (here: one process) gets the one model. Saving changes no rank's live buffers.
    import shutil
    import tempfile

    from singa_lite import checkpoint

    def buffers(net):
        return {"mean": tensor.to_numpy(net.bn.running_mean).copy(), "var": tensor.to_numpy(net.bn.running_var).copy()}

    path = comm.broadcast_object(tempfile.mkdtemp(prefix="sl_bufckpt_") if comm.rank == 0 else None, 0)
    try:
        for how in (True, "average", False):
            net = bn_net()
            dopt = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm, broadcast_buffers=how)
            net.set_optimizer(dopt)
            net.train()
            net.forward(tensor.from_numpy(bn_data(comm.rank)[0]))  # each rank's own running statistics
            mine = buffers(net)
            every = {k: tensor.to_numpy(comm.all_gather(tensor.from_numpy(v))) for k, v in mine.items()}
            checkpoint.save(path, net, dopt)
            for k, v in buffers(net).items():
                assert np.array_equal(v, mine[k]), f"save changed the live buffer {k} ({how})"
            again = bn_net()
            again.forward(tensor.from_numpy(bn_data(0)[0]))  # creates the states
            checkpoint.load(path, again, opt.DistOpt(opt.SGD(lr=0.1), communicator=comm, broadcast_buffers=how))
            for k, v in buffers(again).items():  # the same number of ranks: each rank's own, bit for bit
                assert np.array_equal(v, mine[k]), f"rank {comm.rank}'s {k} not restored exactly ({how})"
            comm.barrier()
            if comm.rank == 0:  # the checkpoint's one model, loaded by one process
                single = bn_net()
                single.forward(tensor.from_numpy(bn_data(0)[0]))
                checkpoint.load(path, single, reshard=True)
                for k, v in buffers(single).items():
                    want = every[k].mean(0) if how == "average" else every[k][0]
                    np.testing.assert_allclose(v, want, rtol=1e-6, atol=1e-7, err_msg=f"{how} {k}")
                    if how == "average":
                        assert not np.array_equal(v, every[k][0]), f"{k}: rank 0's, not the mean"
            comm.barrier()
    finally:
        comm.barrier()
        if comm.rank == 0:
            shutil.rmtree(path, ignore_errors=True)
    return "ok"


# ---------------------------------------------------------------- uneven inputs: join
def shard_grads(params, rank: int, world: int, step: int) -> dict:
    x, y = data(step)
    per = N // world
    autograd.training = True
    loss = loss_of(params, x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per])
    return {p.name: tensor.to_numpy(g).astype(np.float64) for p, g in autograd.backward(loss)}


def join_reference(world: int, steps: list, divide_by_world: bool) -> dict:
    """One process: at each step, the mean of the gradients of the ranks that still have data (or their sum
    over the world size), SGD with momentum."""
    params, sgd = make_params(0), make_opt("sgd")
    for step in range(max(steps)):
        active = [r for r in range(world) if step < steps[r]]
        grads = [shard_grads(params, r, world, step) for r in active]
        for name, p in params.items():
            total = sum(g[name] for g in grads) / (world if divide_by_world else len(active))
            sgd.apply(name, p, tensor.from_numpy(total.astype(np.float32)))
        sgd.step()
    return values(params)


def scenario_join(comm):
    P, r = comm.world_size, comm.rank
    steps = [3 + 2 * q for q in range(P)]  # rank q has 3 + 2q batches
    autograd.training = True
    for how in ("update", "two_phase", "initial"):
        params = make_params(0)
        dopt = opt.DistOpt(make_opt("sgd"), communicator=comm)
        with dopt.join(divide_by_initial_world_size=how == "initial") as join:
            for step in range(steps[r]):
                loss = loss_of(params, *shard(comm, step))
                if how == "two_phase":
                    pending = dopt.backward(loss, 150)
                    pending.synchronize()
                    pending.finish()
                else:
                    dopt.backward_and_update(loss, 150)
        assert join.shadowed == max(steps) - steps[r], (how, join.shadowed)
        got = values(params)
        close(got, join_reference(P, steps, how == "initial"), 1e-5, f"join ({how})")
        same_everywhere(comm, got, f"join ({how})")
        comm.barrier()  # the communicator is still in step after the block
    # a discarded step inside the block, and the partial update refused there
    params = make_params(0)
    dopt = opt.DistOpt(make_opt("sgd"), communicator=comm)
    with dopt.join():
        for step in range(1 + r):
            dopt.backward(loss_of(params, *shard(comm, step))).discard() if step == 0 else \
                dopt.backward_and_update(loss_of(params, *shard(comm, step)))
        try:
            dopt.backward_and_partial_update(loss_of(params, *shard(comm, 0)))
        except RuntimeError as e:
            assert "not supported inside a join() block" in str(e), e
        else:
            raise AssertionError("partial update inside join()")
    comm.barrier()
    return "ok"


def scenario_finished_early(comm):
    """Rank 0 returns (its process ends normally) while the others enter one more all-reduce."""
    if comm.rank == 0:
        return "ok"
    t = tensor.from_numpy(np.ones(4, np.float32))
    comm.all_reduce(t)
    raise AssertionError("the all-reduce finished without rank 0")


def scenario_join_ddp_and_accumulation(comm):
    """join() through ddp.DistributedOptimizer with no_sync(), and DistOpt's join with accumulation (k=2):
    the same parameters as one process averaging the ranks that still have data."""
    from singa_lite.parallel import ddp

    P, r = comm.world_size, comm.rank
    steps = [2 + q for q in range(P)]
    want = join_reference(P, steps, False)
    autograd.training = True
    # ddp: each step is two half-batches, the first inside no_sync
    params = make_params(0)
    trainer = ddp.DistributedOptimizer(make_opt("sgd"), communicator=comm, threshold=150)
    with trainer.join():
        for step in range(steps[r]):
            for j in range(2):
                loss = loss_of(params, *micro_batch(comm, step, j, 2))
                if j == 0:
                    with trainer.no_sync():
                        trainer.step(loss)
                else:
                    trainer.step(loss)
    close(values(params), want, 1e-5, "ddp join + no_sync")
    # DistOpt with backward_passes_per_step=2
    params = make_params(0)
    dopt = opt.DistOpt(make_opt("sgd"), communicator=comm, backward_passes_per_step=2)
    with dopt.join():
        for step in range(steps[r]):
            for j in range(2):
                dopt.backward_and_update(loss_of(params, *micro_batch(comm, step, j, 2)), 150)
        try:
            with dopt.join():
                pass
        except RuntimeError as e:
            assert "do not nest" in str(e), e
        else:
            raise AssertionError("nested join() accepted")
    close(values(params), want, 1e-5, "join + accumulation")
    same_everywhere(comm, values(params), "join + accumulation")
    return "ok"


SCENARIOS = {
    "accumulation": scenario_accumulation,
    "accumulation_misuse": scenario_accumulation_misuse,
    "clip_grad_norm": scenario_clip_grad_norm,
    "sync_batchnorm": scenario_sync_batchnorm,
    "sync_buffers": scenario_sync_buffers,
    "buffers_at_checkpoint": scenario_buffers_at_checkpoint,
    "join": scenario_join,
    "join_ddp_and_accumulation": scenario_join_ddp_and_accumulation,
}


def run(comm, name):
    return SCENARIOS[name](comm)
