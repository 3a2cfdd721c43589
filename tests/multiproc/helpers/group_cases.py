"""Scenarios of issue 30 shared by the shm, tcp and mpi tests (tests/multiproc/test_collective_mismatch.py,
tests/multiproc/test_groups.py) and by the mpiexec job that runs them (jobs/group_job.py). Each takes a
Communicator and returns JSON data; the tests compare it across ranks."""
from __future__ import annotations

import numpy as np

from singa_lite import dist, tensor
from singa_lite.comm import CommError
from singa_lite.parallel import fusion


def T(a) -> tensor.Tensor:
    return tensor.from_numpy(np.ascontiguousarray(a))


# ---------------------------------------------------------------------------------------- CollectiveMismatch
# The same mismatched call on every backend: the last rank passes something else. "kind" (another collective)
# leaves the mpi communicator broken (its data collectives need not pair up), so it comes last and only where
# the communicator goes on.
MISMATCHES = {
    "shape": lambda c, odd: c.all_reduce(T(np.ones(10 + odd, np.float32))),
    "dtype": lambda c, odd: c.all_reduce(T(np.ones(10, np.float64 if odd else np.float32))),
    "op": lambda c, odd: c.all_reduce(T(np.ones(10, np.float32)), "max" if odd else "sum"),
    "root": lambda c, odd: c.broadcast(T(np.ones(10, np.float32)), 1 if odd else 0),
    "big": lambda c, odd: c.all_reduce(T(np.ones(300_000 + odd, np.float32))),  # past every fused path
    "kind": lambda c, odd: c.barrier() if odd else c.all_reduce(T(np.ones(10, np.float32))),
}


def mismatch_cases(comm, cases):
    """For each case: (type name, is a ValueError, fusion.is_mismatch, dist.CollectiveMismatch) of what the
    mismatched call raised (None when nothing was), then a matched all_reduce that proves the ranks are in step
    again."""
    out = {}
    odd = int(comm.rank == comm.world_size - 1)
    for case in cases:
        try:
            MISMATCHES[case](comm, odd)
            out[case] = None
        except Exception as e:  # noqa: BLE001 - reported to the test, which names the type it wants
            out[case] = [type(e).__name__, isinstance(e, ValueError), fusion.is_mismatch(e),
                         isinstance(e, dist.CollectiveMismatch), str(e)[:300]]
        if case != "kind":
            x = T(np.full(3, comm.rank + 1, np.int64))
            comm.all_reduce(x)
            out[case + "/after"] = tensor.to_numpy(x).tolist()
    return out


# ---------------------------------------------------------------------------------------- process groups
def _raises(kind, fn, *needles):
    """None when fn() raises `kind` with every needle in its message, else what happened instead."""
    try:
        fn()
    except kind as e:
        missing = [s for s in needles if s not in str(e)]
        return f"message {str(e)!r} lacks {missing}" if missing else None
    except Exception as e:  # noqa: BLE001
        return f"expected {kind.__name__}, got {type(e).__name__}: {e}"
    return f"expected {kind.__name__}, nothing raised"


def _collectives(g, world_ranks):
    """Every collective of group g (members: world_ranks, in group rank order), each value tagged by the world
    rank, so that a wrong renumbering or a value from outside the group shows. Returns what each gave."""
    me, P = world_ranks[g.rank], g.world_size
    out = {}
    t = T(np.full(4, me + 1, np.float32))
    g.all_reduce(t)
    out["all_reduce"] = tensor.to_numpy(t).tolist()
    t = T(np.full(4, me + 1, np.float16))
    g.all_reduce(t, "avg")
    out["avg"] = tensor.to_numpy(t).astype(float).tolist()
    t = T(np.full(3, me, np.int64))
    g.broadcast(t, root=P - 1)
    out["broadcast"] = tensor.to_numpy(t).tolist()
    t = T(np.full(3, me + 1, np.int64))
    g.reduce(t, root=0, op="prod")
    out["reduce"] = tensor.to_numpy(t).tolist()
    out["all_gather"] = tensor.to_numpy(g.all_gather(T(np.array([me], np.int32)))).ravel().tolist()
    rs = g.reduce_scatter(T(np.arange(2 * P, dtype=np.float64) + me))
    out["reduce_scatter"] = tensor.to_numpy(rs).tolist()
    got = g.gather(T(np.array([me * 10], np.int64)), root=0)
    out["gather"] = None if got is None else tensor.to_numpy(got).ravel().tolist()
    sc = g.scatter(T(np.arange(P, dtype=np.int32) + 100 * me), root=P - 1)
    out["scatter"] = tensor.to_numpy(sc).tolist()
    g.barrier()
    if P > 1:  # a ring: group rank r sends to r + 1
        t = T(np.zeros(2, np.int64))
        if g.rank == 0:
            g.send(T(np.full(2, me, np.int64)), (g.rank + 1) % P)
            g.recv(t, (g.rank - 1) % P)
        else:
            g.recv(t, (g.rank - 1) % P)
            g.send(T(np.full(2, me, np.int64)), (g.rank + 1) % P)
        out["recv"] = tensor.to_numpy(t).tolist()
    out["broadcast_object"] = g.broadcast_object({"from": me} if g.rank == 0 else None, root=0)
    out["all_gather_object"] = g.all_gather_object(me)
    work = g.all_reduce(T(np.ones(2, np.float32)), async_op=True)
    out["async"] = tensor.to_numpy(work.wait()).tolist()
    return out


def group_of_0_and_2(comm):
    """World of 3: ranks 0 and 2 make a group and use every collective in it while rank 1 does not take part;
    the group [2, 0] numbers them the other way round; the world goes on meanwhile; bad ranks, ranks that
    differ across callers, a rank outside a group using it and a mismatch inside a group raise clear errors;
    closing the world closes its groups."""
    assert comm.world_size == 3, comm.world_size
    res = {"errors": []}
    errs = res["errors"]
    for bad, needle in (([], "at least one rank"), ([0, 0], "distinct"), ([0, 3], "must be in [0, 3)"),
                        (["0"], "must be ints"), (0, "list of ranks")):
        errs.append(_raises(ValueError, lambda bad=bad: comm.new_group(bad), needle))
    # ranks that differ across callers: every rank raises, and the world is still in step after
    errs.append(_raises(dist.CollectiveMismatch, lambda: comm.new_group([0, 1] if comm.rank == 1 else [0, 2]),
                        "rank 0 passed [0, 2]", "rank 1 passed [0, 1]"))
    g = dist.new_group([0, 2], communicator=comm)
    back = comm.new_group([2, 0], timeout=comm.timeout / 2)
    res["is_member"] = [g.is_member, back.is_member]
    res["ranks"] = [g.ranks, back.ranks]
    if g.is_member:
        res["rank"], res["size"], res["backend"] = [g.rank, back.rank], [g.world_size, back.world_size], g.backend
        res["timeout"] = [g.timeout == comm.timeout, back.timeout == comm.timeout / 2]
        res["group"] = _collectives(g, [0, 2])
        res["back"] = _collectives(back, [2, 0])
        odd = int(g.rank == 1)  # a mismatch inside the group: named in the world's ranks too
        errs.append(_raises(dist.CollectiveMismatch, lambda: g.all_reduce(T(np.ones(5 + odd, np.float32))),
                            "group of ranks [0, 2]", "1 = 2"))
        x = T(np.ones(2, np.float32))
        g.all_reduce(x)
        res["after_mismatch"] = tensor.to_numpy(x).tolist()
    else:
        res["repr"] = repr(g)
        for use in (lambda: g.all_reduce(T(np.ones(2, np.float32))), lambda: g.world_size, lambda: g.barrier(),
                    lambda: g.new_group([0]), lambda: g.rank):
            errs.append(_raises(ValueError, use, "rank 1 is not in the group [0, 2]", "only its members may use it",
                                "is_member"))
        from singa_lite import opt
        errs.append(_raises(ValueError, lambda: opt.DistOpt(opt.SGD(lr=0.1), communicator=g),
                            "rank 1 is not in the group [0, 2]"))
        g.close()  # does nothing, and says nothing
    x = T(np.full(3, comm.rank + 1, np.int64))
    comm.all_reduce(x)  # the world is in step and works
    res["world"] = tensor.to_numpy(x).tolist()
    comm.close()
    if g.is_member:
        res["closed_with_world"] = [g.closed, back.closed]
        errs.append(_raises(CommError, lambda: g.all_reduce(T(np.ones(2, np.float32))), "used after close()",
                            "which was closed"))
    res["errors"] = [e for e in errs if e]
    return res


def group_distopt(comm, steps=4):
    """DistOpt(opt, communicator=group) trains within the group [0, 2] of a world of 3, each member on its half of
    every batch, while rank 1 trains alone on the whole batch with another learning rate. Returns this rank's
    parameters and, on the members, those of one process training on the whole batch (what the group's averaged
    gradients amount to)."""
    from singa_lite import autograd, opt

    from distopt_cases import data, loss_of, make_params, shard_of

    group = comm.new_group([0, 2])
    params = make_params(0)
    reference = make_params(0)
    autograd.training = True
    if group.is_member:
        dopt = opt.DistOpt(opt.SGD(lr=0.1), communicator=group)
        alone = opt.SGD(lr=0.1)
        for step in range(steps):
            x, y = data(step)
            dopt.backward_and_update(loss_of(params, *shard_of(x, y, group.rank, group.world_size)))
            alone.backward_and_update(loss_of(reference, x, y))
    else:
        alone = opt.SGD(lr=0.3)
        for step in range(steps):
            x, y = data(step)
            alone.backward_and_update(loss_of(params, x, y))
    flat = {k: tensor.to_numpy(v).ravel().tolist() for k, v in params.items()}
    ref = {k: tensor.to_numpy(v).ravel().tolist() for k, v in reference.items()} if group.is_member else None
    comm.barrier()
    return {"params": flat, "reference": ref}


def group_member_dies(comm):
    """Rank 2 of the group [0, 2] dies (SIGKILL) while rank 0 waits for it in the group's all_reduce: rank 0
    must fail fast, naming it. Returns (error type, seconds, message) on rank 0."""
    import os
    import signal
    import time

    g = comm.new_group([0, 2])
    if comm.rank == 2:
        time.sleep(0.5)  # rank 0 is inside the all_reduce by then
        os.kill(os.getpid(), signal.SIGKILL)
    result = "not a member"
    if comm.rank == 0:
        start = time.monotonic()
        try:
            g.all_reduce(T(np.ones(4, np.float32)))
            result = "nothing raised"
        except Exception as e:  # noqa: BLE001 - the test names the type it wants
            result = [type(e).__name__, time.monotonic() - start, str(e)]
    comm.close()  # (the world has a dead rank too: nothing more goes through it)
    return result


def hierarchical_group(world):
    """A group of a hierarchical communicator (ranks 0-1 and 2-3 of a world of 4 playing two hosts): a flat group
    of the world's backend (made hierarchical again only where its members span real hosts), with the same
    numbering and errors as any group. Closing the hierarchical communicator closes it."""
    import importlib.util

    import paths

    spec = importlib.util.spec_from_file_location("hierarchical_job", paths.job("hierarchical_job.py"))
    hierarchical_job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hierarchical_job)
    h = hierarchical_job.two_hosts(world, sharded=False)
    g = h.new_group([3, 0, 2])
    if g.is_member:
        t = T(np.full(4, world.rank + 1, np.float32))
        g.all_reduce(t, "avg")
        result = [g.backend, g.rank, g.ranks, tensor.to_numpy(t).tolist(), g.all_gather_object(world.rank)]
    else:
        result = ["not a member", _raises(ValueError, lambda: g.barrier(), "rank 1 is not in the group [3, 0, 2]")]
    h.close()
    result.append(g.closed if g.is_member else None)
    return result


def group_abort(comm):
    """Rank 0 aborts the world while rank 2 waits for it in their group's all_reduce: the world's abort reaches
    its groups, so rank 2 fails at once with rank 0's reason. Returns (seconds, message) on rank 2."""
    import time

    g = comm.new_group([0, 2])
    result = "not a member"
    if comm.rank == 0:
        time.sleep(0.5)  # rank 2 is inside the all_reduce by then
        comm.abort("rank 0 stops the job here")
        result = "aborted"
    elif comm.rank == 2:
        start = time.monotonic()
        try:
            g.all_reduce(T(np.ones(4, np.float32)))
            result = "nothing raised"
        except CommError as e:
            result = [time.monotonic() - start, str(e)]
    comm.close()
    return result
