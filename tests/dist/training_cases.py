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


SCENARIOS = {
    "accumulation": scenario_accumulation,
    "accumulation_misuse": scenario_accumulation_misuse,
}


def run(comm, name):
    return SCENARIOS[name](comm)
