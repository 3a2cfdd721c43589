"""Where DistOpt runs its buckets' all-reduces (DistOpt(exchange=...), parallel/reducer.py): on the communication
thread (the default) or inline on the training thread. Both give the same values; a bad value is refused before
anything starts; the shm communicator's opt-in in-call spin (SINGA_LITE_SHM_SPIN_US) refuses a bad value."""
import numpy as np
import pytest

from singa_lite import autograd, dist, opt, tensor
from singa_lite.comm.shm import ShmCommunicator


@pytest.fixture(scope="module")
def shm():
    holder = dist.NcclIdHolder()
    c = ShmCommunicator(holder.shm_name, 0, 1, timeout=30)
    yield c
    c.close()


@pytest.fixture(scope="module")
def tcp():
    c = dist.init(backend="tcp", timeout=30)
    yield c
    c.close()


def _train(comm, exchange, steps=4):
    rng = np.random.default_rng(0)
    w = tensor.from_numpy(rng.standard_normal((6, 3)).astype(np.float32))
    w.requires_grad = w.stores_grad = True
    b = tensor.from_numpy(np.zeros(3, np.float32))
    b.requires_grad = b.stores_grad = True
    kw = {} if exchange is None else {"exchange": exchange}
    sgd = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm, first_bucket=3, **kw)
    autograd.training = True
    x = tensor.from_numpy(rng.standard_normal((5, 6)).astype(np.float32))
    y = tensor.from_numpy(np.array([0, 1, 2, 1, 0], np.int32))
    for _ in range(steps):
        sgd.backward_and_update(autograd.softmax_cross_entropy(autograd.add_bias(autograd.matmul(x, w), b), y))
    return sgd, tensor.to_numpy(w), tensor.to_numpy(b)


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_inline_and_thread_give_the_same_values(backend, request):
    comm = request.getfixturevalue(backend)
    runs = {mode: _train(comm, mode) for mode in ("inline", "thread", None)}
    for mode in ("thread", None):
        np.testing.assert_array_equal(runs[mode][1], runs["inline"][1])
        np.testing.assert_array_equal(runs[mode][2], runs["inline"][2])
    assert runs[None][0].reducer.exchange_mode == "thread"  # the default
    assert runs["inline"][0].reducer.fused().inline is True
    assert runs["thread"][0].reducer.fused().inline is False
    # two buckets a step (W's first: first_bucket=3, then b)
    assert runs["inline"][0].bytes_sent == runs["thread"][0].bytes_sent == 4 * 4 * (18 + 3)


def test_bad_exchange_is_refused_before_anything_starts(tcp):
    for bad in ("auto", "fast", None, True, "Inline"):
        with pytest.raises(ValueError, match=r"DistOpt: exchange must be 'thread' \(the default.* or 'inline' "):
            opt.DistOpt(opt.SGD(), communicator=tcp, exchange=bad)


def test_a_comm_hook_keeps_the_communication_thread(shm):
    from singa_lite.parallel import hooks

    sgd = opt.DistOpt(opt.SGD(lr=0.1), communicator=shm, exchange="inline")
    sgd.register_comm_hook(None, hooks.allreduce_hook)
    w = tensor.from_numpy(np.ones((2, 2), np.float32))
    w.requires_grad = w.stores_grad = True
    autograd.training = True
    sgd.backward_and_update(autograd.sum(autograd.matmul(w, w)))
    assert sgd.reducer.fused().inline is False


@pytest.mark.parametrize("bad", ["abc", "-1", "100001", "2.5"])
def test_a_bad_in_call_spin_is_refused_with_what_is_expected(bad, monkeypatch):
    monkeypatch.setenv("SINGA_LITE_SHM_SPIN_US", bad)
    holder = dist.NcclIdHolder()
    with pytest.raises(ValueError, match=f"SINGA_LITE_SHM_SPIN_US must be a whole number of microseconds from 0 to "
                                         f"100000 .*got '{bad}'"):
        ShmCommunicator(holder.shm_name, 0, 1, timeout=30)
