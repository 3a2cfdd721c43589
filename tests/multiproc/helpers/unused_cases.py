"""Scenarios for DistOpt(find_unused_parameters=True) (test_find_unused.py runs them on shm ranks started by
multiprocessing). A model with a shared trunk and two heads: each rank takes head a or head b, depending on its
rank and the step, and a third head is never used. The reference is one process that averages the ranks'
gradients with zeros where a rank did not use a parameter, and updates only the parameters some rank used."""
from __future__ import annotations

import re

import numpy as np
import pytest

from singa_lite import autograd, layer, model, opt, tensor

from register_hook_cases import all_reduce_hook

B, D, H, C = 6, 5, 8, 3  # per-rank batch, input, hidden, classes
STEPS = 6
SHAPES = {"W0": (D, H), "b0": (H,), "Wa": (H, C), "ba": (C,), "Wb": (H, C), "Wc": (H, C)}


def branch(rank: int, step: int) -> str:
    """Even ranks head a, odd ranks head b (swapped at steps 1, 5); at steps 3, 7... every rank takes a."""
    if step % 4 == 3:
        return "a"
    return "ab"[(rank + (step % 4 == 1)) % 2]


def batch(rank: int, step: int):
    rng = np.random.default_rng(100 * step + rank)
    return rng.standard_normal((B, D)).astype(np.float32), rng.integers(0, C, B).astype(np.int32)


def make_params(names=SHAPES):
    rng = np.random.default_rng(7)
    return {k: tensor.Tensor(data=(rng.standard_normal(SHAPES[k]) * 0.4).astype(np.float32), requires_grad=True,
                             stores_grad=True, name=k) for k in names}


def loss_of(params, rank, step, which=None):
    x, y = batch(rank, step)
    autograd.training = True
    h = autograd.tanh(autograd.add_bias(autograd.matmul(tensor.from_numpy(x), params["W0"]), params["b0"]))
    which = which or branch(rank, step)
    logits = (autograd.add_bias(autograd.matmul(h, params["Wa"]), params["ba"]) if which == "a"
              else autograd.matmul(h, params["Wb"]))
    return autograd.softmax_cross_entropy(logits, tensor.from_numpy(y))


def values(params) -> dict:
    return {k: tensor.to_numpy(v).copy() for k, v in params.items()}


def reference(world: int, steps: int = STEPS, passes: int = 1, loss=loss_of, params=None, order=None) -> dict:
    """One process: per update, the sum over ranks and passes of the gradients (zeros where unused) divided by
    world * passes, applied with SGD(momentum) to the parameters some rank used."""
    params = make_params() if params is None else params
    sgd = opt.SGD(lr=0.1, momentum=0.9)
    for update in range(steps):
        sums = {}
        for k in range(passes):
            for r in range(world):
                for p, g in autograd.backward(loss(params, r, update * passes + k)):
                    sums[p.name] = sums.get(p.name, 0) + tensor.to_numpy(g).astype(np.float64)
        for name in (order or list(params)):
            if name in sums:
                sgd.apply(name, params[name], tensor.from_numpy((sums[name] / (world * passes)).astype(np.float32)))
        sgd.step()
    return values(params)


def replicas_equal(comm, got: dict, what: str) -> None:
    every = comm.all_gather_object({k: v.tobytes() for k, v in got.items()})
    for r, other in enumerate(every):
        for k in got:
            assert other[k] == every[0][k], f"{what}: {k} on rank {r} differs from rank 0's"


def train(comm, steps=STEPS, method="backward_and_update", hook=None, as_list=False, passes=1, **kw):
    params = make_params()
    declared = list(params.values()) if as_list else params
    dopt = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm, find_unused_parameters=True,
                       parameters=declared, backward_passes_per_step=passes)
    if hook is not None:
        dopt.register_comm_hook(None, hook)
    for step in range(steps * passes):
        getattr(dopt, method)(loss_of(params, comm.rank, step), threshold=40, **kw)
    return values(params), dopt


def scenario_matches_the_reference(comm):
    P = comm.world_size
    want = reference(P)
    start = values(make_params())
    got, dopt = train(comm)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
    np.testing.assert_array_equal(got["Wc"], start["Wc"])  # used on no rank: never updated
    assert not np.array_equal(got["Wb"], start["Wb"])
    replicas_equal(comm, got, "plain")
    # at the last step (5: heads swapped, odd ranks take a) both heads were used somewhere, Wc nowhere
    assert list(dopt.reducer.unused.counts) == [P, P, P // 2, P // 2, (P + 1) // 2, 0], dopt.reducer.unused.counts
    # a list of tensors declares the same set; a hook that all-reduces gives the same bits
    got_list, _ = train(comm, as_list=True)
    got_hook, _ = train(comm, hook=all_reduce_hook)
    for k in got:
        np.testing.assert_array_equal(got_list[k], got[k], err_msg=f"list: {k}")
        np.testing.assert_array_equal(got_hook[k], got[k], err_msg=f"hook: {k}")
    return "ok"


def scenario_half_two_phases_and_accumulation(comm):
    P = comm.world_size
    want = reference(P)
    for dtype in (tensor.float16, tensor.bfloat16):
        got, _ = train(comm, method="backward_and_update_half", dtype=dtype)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=0, atol=2e-2, err_msg=f"{dtype}: {k}")
        np.testing.assert_array_equal(got["Wc"], values(make_params())["Wc"])
        replicas_equal(comm, got, f"half {dtype}")
    # the two-phase step: the averaged gradients in the declared order, zeros averaged in where unused
    params = make_params()
    dopt = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm, find_unused_parameters=True,
                       parameters=params)
    pending = dopt.backward(loss_of(params, comm.rank, 0))
    pairs = pending.synchronize()
    assert [p.name for p, _ in pairs] == ["W0", "b0", "Wa", "ba", "Wb"], [p.name for p, _ in pairs]
    pending.finish()
    # accumulation: two passes per update, the heads changing between them
    want2 = reference(P, steps=3, passes=2)
    got2, _ = train(comm, steps=3, passes=2)
    for k in want2:
        np.testing.assert_allclose(got2[k], want2[k], rtol=1e-5, atol=1e-6, err_msg=f"accumulated: {k}")
    replicas_equal(comm, got2, "accumulated")
    return "ok"


class Branchy(model.Model):
    def __init__(self):
        super().__init__()
        self.trunk = layer.Linear(D, H)
        self.head_a = layer.Linear(H, C)
        self.head_b = layer.Linear(H, C)
        self.head_c = layer.Linear(H, C)

    def forward(self, x, which="a"):
        h = autograd.tanh(self.trunk(x))
        return (self.head_a if which == "a" else self.head_b)(h)

    def train_one_batch(self, x, y, which):
        loss = autograd.softmax_cross_entropy(self.forward(x, which), y)
        self.optimizer(loss)
        return loss


def scenario_a_model_supplies_its_parameters(comm):
    P = comm.world_size
    m = Branchy()
    m.set_optimizer(opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm, find_unused_parameters=True))
    x0, _ = batch(0, 0)
    m.compile([tensor.from_numpy(x0)], is_train=True)  # rank 0's values everywhere
    start = {k: tensor.to_numpy(v).copy() for k, v in m.get_params().items()}
    for step in range(STEPS):
        x, y = batch(comm.rank, step)
        m(tensor.from_numpy(x), tensor.from_numpy(y), branch(comm.rank, step))
    got = {k: tensor.to_numpy(v).copy() for k, v in m.get_params().items()}

    def model_loss(params, rank, step):
        x, y = batch(rank, step)
        autograd.training = True
        lin = lambda t, name: autograd.add_bias(autograd.matmul(t, params[f"{name}.W"]), params[f"{name}.b"])  # noqa
        h = autograd.tanh(lin(tensor.from_numpy(x), "trunk"))
        return autograd.softmax_cross_entropy(lin(h, "head_" + branch(rank, step)), tensor.from_numpy(y))

    ref = {k: tensor.Tensor(data=v.copy(), requires_grad=True, stores_grad=True, name=k) for k, v in start.items()}
    want = reference(P, loss=model_loss, params=ref)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for k in ("head_c.W", "head_c.b"):
        np.testing.assert_array_equal(got[k], start[k])
    replicas_equal(comm, got, "Model")
    return "ok"


def scenario_misuse_is_refused(comm):
    params = make_params()
    sgd = opt.SGD(lr=0.1)

    def dist(**kw):
        return opt.DistOpt(sgd, communicator=comm, **kw)

    for bad, err in (("W0", TypeError), (params["W0"], TypeError), (3, TypeError), ({"W0": 1.0}, TypeError),
                     ([], ValueError), ([params["W0"], params["W0"]], ValueError)):
        with pytest.raises(err, match="parameters="):
            dist(find_unused_parameters=True, parameters=bad)
    with pytest.raises(ValueError, match="find_unused_parameters=True"):
        dist(parameters=params)
    with pytest.raises(TypeError, match="find_unused_parameters must be True or False"):
        dist(find_unused_parameters="yes")
    # no parameters= and no Model: every rank is told at the first step, before any collective
    d = dist(find_unused_parameters=True)
    with pytest.raises(ValueError, match=r"parameters=model\.get_params\(\)"):
        d.backward_and_update(loss_of(params, comm.rank, 0))
    # the hook-based wrapper cannot complete a rank's gradients: refused, naming DistOpt
    from singa_lite.parallel import DataParallel

    with pytest.raises(ValueError, match=r"DataParallel: find_unused_parameters=True is not supported.*DistOpt"):
        DataParallel(Branchy(), comm, find_unused_parameters=True)
    # a parameter that got a gradient but was not declared: an error on every rank, naming it where it happened
    d = dist(find_unused_parameters=True, parameters={k: v for k, v in params.items() if k != "Wb"})
    with pytest.raises(ValueError, match="must declare every parameter") as info:
        d.backward_and_update(loss_of(params, comm.rank, 0))  # rank 1 uses Wb
    if comm.rank == 1:
        assert "Wb got a gradient on this rank (rank 1)" in str(info.value), info.value
    return "ok"


def scenario_without_the_option_the_error_names_it(comm):
    params = make_params()
    d = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm)
    with pytest.raises(ValueError, match=re.escape("find_unused_parameters=True")):
        d.backward_and_update(loss_of(params, comm.rank, 0))  # the heads differ at the first step
    # the first step alike, the second not: the bucket mismatch names the option too
    params = make_params()
    d = opt.DistOpt(opt.SGD(lr=0.1), communicator=comm)
    d.backward_and_update(loss_of(params, comm.rank, 0, which="a"))
    with pytest.raises(ValueError, match=re.escape("find_unused_parameters=True")):
        d.backward_and_update(loss_of(params, comm.rank, 1))
    return "ok"


def scenario_ddp_takes_the_option(comm):
    # ddp.DistributedOptimizer passes find_unused_parameters / parameters to its DistOpt: the same reference
    from singa_lite.parallel import ddp

    want = reference(comm.world_size)
    params = make_params()
    dopt = ddp.DistributedOptimizer(opt.SGD(lr=0.1, momentum=0.9), comm, threshold=40,
                                    find_unused_parameters=True, parameters=params, check_replicas_every=2)
    for step in range(STEPS):
        dopt.step(loss_of(params, comm.rank, step))
    got = values(params)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert dopt.dist_opt.reducer.replica_check.checks == STEPS // 2
    replicas_equal(comm, got, "ddp")
    return "ok"


SCENARIOS = {k[len("scenario_"):]: v for k, v in globals().items() if k.startswith("scenario_")}


def run(comm, name):
    return SCENARIOS[name](comm)
