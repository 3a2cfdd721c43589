"""Scenarios for the replica check (singa_lite.parallel.replica_check) on real communicators: identical
replicas pass; a parameter or a momentum buffer nudged by one ulp on one rank is named, with the rank, on every
rank. Run by tests/multiproc/test_replica_check_dist.py (tcp, shm) and jobs/comm_hooks_job.py (mpi)."""
from __future__ import annotations

import numpy as np

from singa_lite import opt, tensor
from singa_lite.parallel.replica_check import ReplicaCheck, ReplicaMismatch, check_replicas


def model_and_optimizer(steps=3):
    """The same small model on every rank, and SGD with momentum after `steps` identical updates (so the
    momentum buffers exist and are equal)."""
    rng = np.random.default_rng(0)
    shapes = {"fc1.W": (6, 5), "fc1.b": (5,), "fc2.W": (5, 3), "fc2.b": (3,)}
    model = {n: tensor.Tensor(data=rng.standard_normal(s).astype(np.float32), stores_grad=True, name=n)
             for n, s in shapes.items()}
    sgd = opt.SGD(lr=0.1, momentum=0.9)
    for step in range(steps):
        for n, p in model.items():
            g = np.random.default_rng([step, len(n)]).standard_normal(p.shape).astype(np.float32)
            sgd.apply(n, p, tensor.from_numpy(g))
        sgd.step()
    return model, sgd


def nudge(t, index=0):
    """t with one element moved by one ulp (the smallest difference there is)."""
    a = tensor.to_numpy(t)
    flat = a.reshape(-1)
    flat[index] = np.nextafter(flat[index], np.float32(np.inf))
    t.copy_from_numpy(a)


def expect_mismatch(fn):
    try:
        fn()
    except ReplicaMismatch as e:
        return e
    raise AssertionError("no ReplicaMismatch")


def scenario_all(comm):
    P, r = comm.world_size, comm.rank
    last = P - 1
    done = []

    model, sgd = model_and_optimizer()
    check_replicas(comm, model, sgd)  # identical: no error
    check_replicas(comm, list(model.items()), sgd.get_states())  # the other accepted forms
    done.append("identical")

    # a parameter nudged by one ulp on the last rank
    model, sgd = model_and_optimizer()
    if r == last:
        nudge(model["fc2.W"], 7)
    e = expect_mismatch(lambda: check_replicas(comm, model, sgd, step=100))
    assert e.differing == {last: ("parameter", "fc2.W")}, (e.differing, str(e))
    assert e.reference == list(range(P - 1)) and e.step == 100, str(e)
    assert f"rank {last} first differs at parameter 'fc2.W'" in str(e) and "at step 100" in str(e), str(e)
    done.append("parameter")

    # the momentum buffer of fc1.W nudged on the last rank: named as optimizer state
    model, sgd = model_and_optimizer()
    if r == last:
        nudge(sgd.moments["fc1.W"], 3)
    e = expect_mismatch(lambda: check_replicas(comm, model, sgd))
    assert e.differing == {last: ("optimizer state", "moments of fc1.W")}, str(e)
    assert f"rank {last} first differs at optimizer state 'moments of fc1.W'" in str(e), str(e)
    # ... also through get_states(), and not at all when only the parameters are compared
    e = expect_mismatch(lambda: check_replicas(comm, model, sgd.get_states()))
    assert e.differing == {last: ("optimizer state", "moments of fc1.W")}, str(e)
    check_replicas(comm, model)
    done.append("momentum")

    if P >= 3:  # rank 0 is the odd one out: the majority is the reference, rank 0 is named
        model, sgd = model_and_optimizer()
        if r == 0:
            nudge(model["fc1.b"], 1)
        e = expect_mismatch(lambda: check_replicas(comm, model, sgd))
        assert e.reference == list(range(1, P)) and e.differing == {0: ("parameter", "fc1.b")}, str(e)
        done.append("majority")

    # ReplicaCheck: nothing is exchanged between multiples of `every` (the nudged replica goes unseen there),
    # the check at the multiple raises
    model, sgd = model_and_optimizer()
    check = ReplicaCheck(comm, every=3)
    if r == last:
        nudge(model["fc1.W"], 0)
    assert check.after_step(1, model, sgd) is False and check.after_step(2, model, sgd) is False
    e = expect_mismatch(lambda: check.after_step(3, model, sgd))
    assert e.step == 3 and e.differing == {last: ("parameter", "fc1.W")}, str(e)
    assert check.checks == 1 and check.seconds > 0
    if r == last:  # the replicas made equal again: the next check passes
        model, _ = model_and_optimizer()
    model_equal, sgd_equal = model_and_optimizer()
    assert check.after_step(6, model_equal, sgd_equal) is True and check.checks == 2
    done.append("every")
    return done
