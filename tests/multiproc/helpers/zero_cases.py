"""DistOpt(zero_stage=1|2) checks on a Communicator, run by tests/multiproc/test_zero.py on every rank: each
scenario trains distopt_cases' model (4 parameters of 280, 40, 200 and 5 elements: shards of different sizes,
and on 3 ranks one rank owns a single small parameter) with a sharded DistOpt and with a stage-0 DistOpt on the
same communicator, and raises AssertionError when they differ by more than 1e-6."""
from __future__ import annotations

import numpy as np

import distopt_cases as dc
from singa_lite import opt, tensor

KINDS = ["sgd", "adam", "rmsprop", "adagrad", "user", "nesterov", "adamw", "lamb", "lars"]
TOL = 1e-6


def make_opt(kind: str):
    if kind == "nesterov":
        return opt.SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)
    return dc.make_opt(kind)


def run(comm, kind: str, stage: int, steps: int = 20, threshold: int = 64, half=False, clip=None, passes=1,
        buff: int = 4096, params=None, dopt=None, first: int = 0, overlap=True, poison=None):
    """Trains `steps` updates on this rank's share of each batch; returns (params as numpy, the DistOpt)."""
    from singa_lite import autograd

    params = dc.make_params(0) if params is None else params
    if dopt is None:
        dopt = opt.DistOpt(make_opt(kind), communicator=comm, buffSize=buff, zero_stage=stage,
                           backward_passes_per_step=passes, overlap=overlap)
    autograd.training = True
    for step in range(first, first + steps):
        x, y = dc.data(step)
        x, y = dc.shard_of(x, y, comm.rank, comm.world_size)
        for k in range(passes):  # micro-batches: halves of this rank's share
            m = len(x) // passes
            loss = dc.loss_of(params, x[k * m:(k + 1) * m], y[k * m:(k + 1) * m])
            if step == poison and comm.rank == comm.world_size - 1:  # this rank's gradients become nan
                loss = autograd.mul(loss, tensor.from_numpy(np.array(np.nan, np.float32)))
            pending = dopt.backward(loss, threshold, half=half)
            if clip is not None and not pending.accumulating:
                pending.clip_grad_norm(clip)
            pending.finish()
    return {k: tensor.to_numpy(v) for k, v in params.items()}, dopt


def close(got, want, what):
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=TOL, atol=TOL, err_msg=f"{k}: {what}")


def scenario_equivalence(comm, kinds=tuple(KINDS), stages=(1, 2)):
    """Stages 1 and 2 against stage 0, every optimizer, 20 steps; also the replicas agree bit for bit."""
    done = []
    for kind in kinds:
        want, _ = run(comm, kind, 0)
        for stage in stages:
            got, dopt = run(comm, kind, stage)
            close(got, want, f"{kind}, zero_stage={stage}, rank {comm.rank}")
            every = comm.all_gather_object({k: v.tolist() for k, v in got.items()})
            assert all(e == every[0] for e in every), f"{kind} stage {stage}: the replicas differ"
            done.append(f"{kind}{stage}")
    return done


def scenario_features(comm, half_tol=TOL):
    """Half wire, clipping by the global norm and gradient accumulation, each at stages 1 and 2 against stage 0
    with the same feature. half_tol: the tolerance of the 16-bit wires at stage 2, whose reduce may round
    otherwise than the all-reduce of stage 0 (mpi: MPI's float16 sum rounds at each step of its tree, the
    all-reduce sums in float32 and rounds once); the same on shm and tcp (1e-6)."""
    done = []
    cases = {"half": dict(half=True), "clip": dict(clip=0.05), "accumulate": dict(passes=2),
             "bf16": dict(half=tensor.bfloat16), "no-overlap": dict(overlap=False), "nonfinite": dict(poison=3)}
    plain, _ = run(comm, "adam", 0, steps=8)
    for what, kw in cases.items():
        want, _ = run(comm, "adam", 0, steps=8, **kw)
        if what == "clip":  # the bound is below the gradients' norm: clipping is tested, not skipped
            assert any(np.abs(want[k] - plain[k]).max() > 1e-4 for k in plain), "clipping changed nothing"
        for stage in (1, 2):
            got, d = run(comm, "adam", stage, steps=8, **kw)
            assert d.skipped_steps == (1 if "poison" in kw else 0), d.skipped_steps
            tol = half_tol if "half" in kw and stage == 2 else TOL
            for k in want:
                np.testing.assert_allclose(got[k], want[k], rtol=tol, atol=tol, err_msg=f"{k}: {what}, stage {stage}")
            done.append(f"{what}{stage}")
    return done


def scenario_amp(comm, steps=6):
    """amp.MixedPrecision over float16 parameters: the float32 masters are sharded (each rank holds its
    shard's), the parameters equal stage 0's exactly."""
    from amp_cases import half_loss, half_params
    from singa_lite import autograd
    from singa_lite.optim import amp

    def train(stage):
        params = half_params(0, tensor.float16)
        d = opt.DistOpt(amp.MixedPrecision(opt.Adam(lr=0.01)), communicator=comm, zero_stage=stage)
        autograd.training = True
        for step in range(steps):
            x, y = dc.shard_of(*dc.data(step), comm.rank, comm.world_size)
            d.backward_and_update(half_loss(params, x, y), threshold=64)
        return {k: tensor.to_numpy(v) for k, v in params.items()}, d

    want, d0 = train(0)
    assert len(d0.opt.masters) == 4, sorted(d0.opt.masters)
    out = []
    for stage in (1, 2):
        got, d = train(stage)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{k}: amp, zero_stage={stage}")
        owned = d.reducer.zero.plan.owned(comm.rank)
        assert sorted(d.opt.masters) == sorted(owned) == sorted(d.opt.opt.m), (sorted(d.opt.masters), owned)
        assert sum(comm.all_gather_object(len(owned))) == 4
        out.append(f"amp{stage}")
    return out


def scenario_memory(comm):
    """memory_report() against the arrays held: the optimizer state is the shard's (Adam: two slots the size of
    the owned parameters), the shards add up to stage 0's, stage 2's gradients are those synchronize() gives."""
    _, d0 = run(comm, "adam", 0, steps=2)
    r0 = d0.memory_report()
    nbytes = {n: p.data.nbytes for n, p in d0.reducer.params}
    assert r0["optimizer_state"] == 2 * sum(nbytes.values()), r0
    assert r0["gradients"] == r0["parameters"] == sum(nbytes.values()), r0
    out = []
    for stage in (1, 2):
        params = dc.make_params(0)
        _, d = run(comm, "adam", stage, steps=2, params=params)
        rep = d.memory_report()
        owned = d.reducer.zero.plan.owned(comm.rank)
        held = sum(t.data.nbytes for slot in d.opt.state_tensors().values() for t in slot.values())
        assert rep["optimizer_state"] == held == 2 * sum(nbytes[n] for n in owned), (rep, held, owned)
        assert sorted(d.opt.m) == sorted(owned), (sorted(d.opt.m), owned)
        assert sum(comm.all_gather_object(rep["optimizer_state"])) == r0["optimizer_state"]
        assert rep["parameters"] == r0["parameters"], rep
        assert rep["communication_buffers"] >= r0["communication_buffers"], (rep, r0)
        # one more step in two phases: the gradients this rank keeps are those memory_report counts
        x, y = dc.shard_of(*dc.data(0), comm.rank, comm.world_size)
        pending = d.backward(dc.loss_of(params, x, y), 64)
        pairs = pending.synchronize()
        kept = sum(g.data.nbytes for _, g in pairs)
        pending.finish()
        if stage == 2:
            assert kept == rep["gradients"] == sum(nbytes[n] for n in owned), (kept, rep)
        else:
            assert kept == rep["gradients"] == r0["gradients"], (kept, rep)
        out.append(f"memory{stage}")
    return out


def scenario_refusals(comm):
    """What is not supported raises ValueError naming it, on every rank alike, before anything changes."""
    import pytest

    params = dc.make_params(0)
    d = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm, zero_stage=2)
    x, y = dc.shard_of(*dc.data(0), comm.rank, comm.world_size)
    with pytest.raises(ValueError, match="backward_and_partial_update: not supported with zero_stage=2"):
        d.backward_and_partial_update(dc.loss_of(params, x, y))
    with pytest.raises(ValueError, match="backward_and_sparse_update: not supported with zero_stage=2"):
        d.backward_and_sparse_update(dc.loss_of(params, x, y))
    with pytest.raises(ValueError, match="join: not supported"):
        d.join()
    with pytest.raises(ValueError, match="register_comm_hook: not supported with zero_stage=2"):
        d.register_comm_hook(None, lambda s, b: b.buffer())
    with pytest.raises(ValueError, match="check_replicas_every is not supported"):
        opt.DistOpt(opt.SGD(), communicator=comm, zero_stage=1, check_replicas_every=5)
    with pytest.raises(ValueError, match="zero_stage must be 0"):
        opt.DistOpt(opt.SGD(), communicator=comm, zero_stage=3)
    return "refused"


# ---------------------------------------------------------------- checkpoints across stages and world sizes
def scenario_save(comm, path, stage, steps=5):
    """`steps` updates at `stage`, then a checkpoint (each rank's optimizer shard in its own file)."""
    from singa_lite import checkpoint

    params = dc.make_params(0)
    _, d = run(comm, "adam", stage, steps=steps, params=params)
    checkpoint.save(path, params, d)
    return sorted(d.opt.m)


def scenario_resume(comm, path, stage, first=5, steps=5):
    """A fresh model and DistOpt at `stage` load the checkpoint (any saved stage and world size) and train on:
    the result is that of one process training first + steps updates (checked by the caller)."""
    from singa_lite import checkpoint

    params = dc.make_params(7)  # other values: the checkpoint must bring the saved ones back
    d = opt.DistOpt(make_opt("adam"), communicator=comm, buffSize=4096, zero_stage=stage)
    checkpoint.load(path, params, d, reshard=True)
    got, d = run(comm, "adam", stage, steps=steps, params=params, dopt=d, first=first)
    if stage:  # the whole state was loaded, and the first step kept this rank's shard of it
        assert sorted(d.opt.m) == sorted(d.reducer.zero.plan.owned(comm.rank)), sorted(d.opt.m)
    return {k: v.tolist() for k, v in got.items()}


def scenario_empty_shard(comm, steps=10):
    """Fewer parameters than ranks (a linear model: W and b on 3 ranks): some rank owns nothing, and stages 1
    and 2 still equal stage 0, with clipping across the shards."""
    from singa_lite import autograd

    def train(stage):
        rng = np.random.default_rng(3)
        params = {"W": tensor.Tensor(data=rng.standard_normal((dc.D, dc.C)).astype(np.float32), requires_grad=True,
                                     stores_grad=True, name="W"),
                  "b": tensor.Tensor(data=np.zeros(dc.C, np.float32), requires_grad=True, stores_grad=True,
                                     name="b")}
        d = opt.DistOpt(opt.Adam(lr=0.05), communicator=comm, zero_stage=stage)
        autograd.training = True
        for step in range(steps):
            x, y = dc.shard_of(*dc.data(step), comm.rank, comm.world_size)
            logits = autograd.add_bias(autograd.matmul(tensor.from_numpy(x), params["W"]), params["b"])
            pending = d.backward(autograd.softmax_cross_entropy(logits, tensor.from_numpy(y)))
            pending.clip_grad_norm(0.1)
            pending.finish()
        return {k: tensor.to_numpy(v) for k, v in params.items()}, d

    want, _ = train(0)
    out = []
    for stage in (1, 2):
        got, d = train(stage)
        close(got, want, f"linear model, zero_stage={stage}")
        owned = comm.all_gather_object(d.memory_report()["owned_parameters"])
        assert sum(owned) == 2 and 0 in owned, owned
        out.append(f"empty{stage}")
    return out


def scenario_comm_hook(comm, steps=6):
    """Stage 1 exchanges as stage 0 does, comm hooks included: with parallel.hooks.fp16_compress_hook both give
    the same parameters."""
    from singa_lite.parallel import hooks

    got = {}
    for stage in (0, 1):
        params = dc.make_params(0)
        d = opt.DistOpt(make_opt("adam"), communicator=comm, buffSize=4096, zero_stage=stage)
        d.register_comm_hook(None, hooks.fp16_compress_hook)
        got[stage], _ = run(comm, "adam", stage, steps=steps, params=params, dopt=d)
    close(got[1], got[0], "fp16_compress_hook, zero_stage=1")
    return "hook1"
