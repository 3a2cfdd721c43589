"""find_unused_parameters=True with join(), backward_and_partial_update and backward_and_sparse_update
(test_find_unused.py runs them on shm ranks). The model and branches are unused_cases.py's; each reference is
one process that follows the mode's rule with zeros where a rank did not use a parameter, and no update of a
parameter no rank used."""
from __future__ import annotations

import math

import numpy as np

from singa_lite import autograd, opt, tensor
from singa_lite.parallel.exchange import partitions
from singa_lite.raw import to_host

from unused_cases import SHAPES, STEPS, loss_of, make_params, replicas_equal, values

ORDER = list(SHAPES)  # the declared order (make_params' dict)


def grads_of(params, rank, step) -> dict:
    return {p.name: tensor.to_numpy(g).astype(np.float64) for p, g in autograd.backward(loss_of(params, rank, step))}


def apply(sgd, params, avg: dict) -> None:
    for name in ORDER:
        if name in avg:
            sgd.apply(name, params[name], tensor.from_numpy(avg[name].astype(np.float32)))
    sgd.step()


# ---------------------------------------------------------------- join()
def join_reference(world, steps_of, divide_by_world, passes=1) -> dict:
    """steps_of[r]: the updates rank r trains for; each update sums `passes` passes (accumulation, averaged)."""
    params, sgd = make_params(), opt.SGD(lr=0.1, momentum=0.9)
    for u in range(max(steps_of)):
        trained = [r for r in range(world) if u < steps_of[r]]
        sums = {}
        for r in trained:
            for k in range(passes):
                for name, g in grads_of(params, r, u * passes + k).items():
                    sums[name] = sums.get(name, 0) + g
        div = (world if divide_by_world else len(trained)) * passes
        apply(sgd, params, {k: v / div for k, v in sums.items()})
    return values(params)


def scenario_join_matches_the_reference(comm):
    P, rank = comm.world_size, comm.rank
    steps_of = [STEPS - r for r in range(P)]  # rank 0 trains longest; the others join its passes with zeros
    for divide in (False, True):
        want = join_reference(P, steps_of, divide)
        params = make_params()
        start = values(params)
        dopt = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm, find_unused_parameters=True,
                           parameters=params)
        with dopt.join(divide_by_initial_world_size=divide) as j:
            for step in range(steps_of[rank]):
                dopt.backward_and_update(loss_of(params, rank, step), threshold=40)
        assert j.shadowed == STEPS - steps_of[rank], (j.shadowed, rank)
        got = values(params)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=f"divide={divide}: {k}")
        np.testing.assert_array_equal(got["Wc"], start["Wc"])
        replicas_equal(comm, got, f"join divide={divide}")
    # gradient accumulation inside join(): only the exchanging passes vote and carry the mask
    want = join_reference(P, steps_of, False, passes=2)
    params = make_params()
    dopt = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm, find_unused_parameters=True,
                       parameters=params, backward_passes_per_step=2)
    with dopt.join():
        for step in range(steps_of[rank] * 2):
            dopt.backward_and_update(loss_of(params, rank, step), threshold=40)
    got = values(params)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=f"accumulated: {k}")
    replicas_equal(comm, got, "join accumulated")
    # the two-phase step and the half wire inside join() too (one wire per block: a joined rank repeats its last)
    for half in (False, True):
        params = make_params()
        dopt = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm, find_unused_parameters=True,
                           parameters=params)
        with dopt.join():
            for step in range(steps_of[rank]):
                if half:
                    dopt.backward_and_update_half(loss_of(params, rank, step), threshold=40, dtype=tensor.bfloat16)
                else:
                    dopt.backward(loss_of(params, rank, step), threshold=40).finish()
        got = values(params)
        if not half:
            want = join_reference(P, steps_of, False)
            for k in want:
                np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=f"two phases: {k}")
        replicas_equal(comm, got, f"join half={half}")
    return "ok"


# ---------------------------------------------------------------- backward_and_partial_update
def scenario_partial_follows_its_rule(comm):
    P, rank, threshold = comm.world_size, comm.rank, 40
    # every rank's replica and optimizer, in one process: local updates, then one partition of the declared
    # set's values averaged per step (round robin)
    reps = [make_params() for _ in range(P)]
    sgds = [opt.SGD(lr=0.1, momentum=0.9) for _ in range(P)]
    parts = partitions(ORDER, threshold, size=lambda n: math.prod(SHAPES[n]))
    assert len(parts) == 3, parts
    for step in range(STEPS):
        grads = [grads_of(reps[r], r, step) for r in range(P)]
        used = set().union(*grads)
        for r in range(P):
            apply(sgds[r], reps[r], {k: grads[r].get(k, np.zeros(SHAPES[k])) for k in used})
        for k in parts[step % len(parts)]:
            mean = sum(tensor.to_numpy(reps[r][k]).astype(np.float64) for r in range(P)) / P
            for r in range(P):
                reps[r][k].copy_from_numpy(mean.astype(np.float32))
    params = make_params()
    start = values(params)
    dopt = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm, find_unused_parameters=True,
                       parameters=params)
    for step in range(STEPS):
        dopt.backward_and_partial_update(loss_of(params, rank, step), threshold=threshold)
    assert dopt.partial == STEPS % len(parts)
    got, want = values(params), values(reps[rank])
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=f"rank {rank}: {k}")
    # never updated; its partition's value average (of equal values) may round by an ulp on 3 ranks
    np.testing.assert_allclose(got["Wc"], start["Wc"], rtol=1e-6, atol=0)
    return "ok"


# ---------------------------------------------------------------- backward_and_sparse_update
def sparse_reference(world, threshold, spars, topK):
    """Per step: the groups of the used parameters in the declared order; on each rank the group's gradient
    (zeros where unused) plus its residual, the significant entries sent, the rest kept per parameter."""
    params, sgd = make_params(), opt.SGD(lr=0.1, momentum=0.9)
    res = [{k: np.zeros(int(np.prod(SHAPES[k]))) for k in ORDER} for _ in range(world)]
    for step in range(STEPS):
        grads = [grads_of(params, r, step) for r in range(world)]
        used = [k for k in ORDER if any(k in g for g in grads)]
        avg = {}
        for group in partitions(used, threshold, size=lambda n: math.prod(SHAPES[n])):
            sizes = [math.prod(SHAPES[k]) for k in group]
            total = 0
            for r in range(world):
                flat = np.concatenate([grads[r][k].ravel() if k in grads[r] else np.zeros(s)
                                       for k, s in zip(group, sizes)]).astype(np.float32).astype(np.float64)
                flat = flat + np.concatenate([res[r][k] for k in group])
                if topK:
                    keep = np.zeros(flat.size, bool)
                    keep[np.argsort(-np.abs(flat), kind="stable")[:math.ceil(spars * flat.size)]] = True
                else:
                    keep = np.abs(flat) >= spars
                sent = np.where(keep, flat, 0)
                total = total + sent / world
                off = 0
                for k, s in zip(group, sizes):
                    res[r][k] = (flat - sent)[off:off + s]
                    off += s
            off = 0
            for k, s in zip(group, sizes):
                avg[k] = total[off:off + s].reshape(SHAPES[k])
                off += s
        apply(sgd, params, avg)
    return values(params), res


def scenario_sparse_follows_its_rule(comm):
    P, rank = comm.world_size, comm.rank
    for threshold, spars, topK in ((40, 0.05, False), (40, 0.3, True), (1, 0.3, True)):
        what = f"threshold={threshold} spars={spars} topK={topK}"
        want, want_res = sparse_reference(P, threshold, spars, topK)
        params = make_params()
        start = values(params)
        dopt = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm, find_unused_parameters=True,
                           parameters=params)
        for step in range(STEPS):
            dopt.backward_and_sparse_update(loss_of(params, rank, step), threshold=threshold, spars=spars,
                                            topK=topK)
        got = values(params)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=f"{what}: {k}")
        np.testing.assert_array_equal(got["Wc"], start["Wc"])
        replicas_equal(comm, got, f"sparse {what}")
        # residuals kept per parameter: this rank's equal the reference's (Wc never used: none kept)
        residuals = {k: np.asarray(to_host(v)).ravel() for k, v in dopt.reducer.sparse.residuals.items()}
        assert set(residuals) == {(k,) for k in ORDER if k != "Wc"}, sorted(residuals)
        for (k,), v in residuals.items():
            np.testing.assert_allclose(v, want_res[rank][k], rtol=1e-4, atol=1e-5, err_msg=f"{what}: residual {k}")
    return "ok"


# ---------------------------------------------------------------- without branches: the mode itself
def scenario_without_branches_equals_the_mode(comm):
    """Every rank takes head a: the option changes nothing when the declared order is the backward order
    (the groups and partitions are then the same) -- bit for bit against the mode without the option."""
    rank = comm.rank
    backward_order = ["ba", "Wa", "b0", "W0"]

    def run_mode(method, declared, **kw):
        params = make_params()
        extra = {} if declared is None else {"find_unused_parameters": True,
                                             "parameters": [params[k] for k in declared]}
        dopt = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm, **extra)
        for step in range(STEPS):
            getattr(dopt, method)(loss_of(params, rank, step, which="a"), **kw)
        return values(params)

    cases = [("backward_and_partial_update", backward_order, {"threshold": 30}),
             ("backward_and_sparse_update", backward_order + ["Wb", "Wc"], {"threshold": 10, "spars": 0.3,
                                                                             "topK": True}),
             ("backward_and_sparse_update", backward_order + ["Wb", "Wc"], {"threshold": 40, "spars": 0.05})]
    for method, declared, kw in cases:
        plain, unused = run_mode(method, None, **kw), run_mode(method, declared, **kw)
        for k in plain:
            np.testing.assert_array_equal(unused[k], plain[k], err_msg=f"{method} {kw}: {k}")
    return "ok"


SCENARIOS = {k[len("scenario_"):]: v for k, v in globals().items() if k.startswith("scenario_")}


def run(comm, name):
    return SCENARIOS[name](comm)
