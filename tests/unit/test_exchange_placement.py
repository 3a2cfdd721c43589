"""Where DistOpt runs its buckets' all-reduces (DistOpt(exchange=...), parallel/reducer.py): "auto" resolves to
inline on the shm backend when the local ranks' kernel threads fill the cores, to the communication thread on a
network backend; both places give the same values; a bad value is refused before anything starts."""
import numpy as np
import pytest

from singa_lite import autograd, device, dist, opt, tensor
from singa_lite.comm.shm import ShmCommunicator
from singa_lite.parallel import reducer


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
    sgd = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm, exchange=exchange, first_bucket=3)
    autograd.training = True
    x = tensor.from_numpy(rng.standard_normal((5, 6)).astype(np.float32))
    y = tensor.from_numpy(np.array([0, 1, 2, 1, 0], np.int32))
    for _ in range(steps):
        sgd.backward_and_update(autograd.softmax_cross_entropy(autograd.add_bias(autograd.matmul(x, w), b), y))
    return sgd, tensor.to_numpy(w), tensor.to_numpy(b)


def test_auto_is_inline_on_shm_exactly_when_the_threads_fill_the_cores(shm, monkeypatch):
    threads = device.get_num_threads()
    try:
        monkeypatch.setattr(reducer, "usable_cores", lambda: threads)
        assert reducer.inline_pays(shm) == (True, f"1 local ranks x {threads} threads fill the {threads} cores: "
                                                  f"inline")
        monkeypatch.setattr(reducer, "usable_cores", lambda: threads + 1)
        inline, why = reducer.inline_pays(shm)
        assert not inline and "leave some of the" in why, why
        device.set_num_threads(threads + 1)  # the kernels take the spare core: nothing is left to overlap on
        assert reducer.inline_pays(shm)[0]
    finally:
        device.set_num_threads(threads)


def test_auto_overlaps_on_a_network_backend(tcp):
    inline, why = reducer.inline_pays(tcp)
    assert not inline and why == "the tcp backend is not one host's shared memory: overlapped"
    sgd = opt.DistOpt(opt.SGD(), communicator=tcp)
    assert sgd.reducer.exchange_mode_used() == f"communication thread ({why})"


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_inline_and_thread_give_the_same_values(backend, request):
    comm = request.getfixturevalue(backend)
    runs = {mode: _train(comm, mode) for mode in ("inline", "thread", "auto")}
    for mode in ("thread", "auto"):
        np.testing.assert_array_equal(runs[mode][1], runs["inline"][1])
        np.testing.assert_array_equal(runs[mode][2], runs["inline"][2])
    assert runs["inline"][0].reducer.exchange_mode_used() == "inline (exchange='inline')"
    # the two buckets of each step (W's first: first_bucket=3, then b) and the vote
    assert runs["inline"][0].bytes_sent == runs["thread"][0].bytes_sent == 4 * 4 * (18 + 3)


def test_bad_exchange_is_refused_before_anything_starts(tcp):
    for bad in ("fast", None, True, "Inline"):
        with pytest.raises(ValueError, match=r"DistOpt: exchange must be one of 'auto', 'inline', 'thread', got "):
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

