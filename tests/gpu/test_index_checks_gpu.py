"""Index checks of one_hot / take / index_add_ on the GPU (csrc/cuda/index_faults.h): the kernel checks every index,
skips a bad one and the host raises IndexError at its next wait for the device, instead of copying min / max of the
indices to the host (a blocking sync) before every call. With the deferral off, the call itself raises, as on the
CPU. Marked `gpu`: skipped where no GPU is usable."""
import time

import numpy as np
import pytest

from singa_lite import _core, autograd, device, tensor

pytestmark = pytest.mark.gpu

CPU = _core.Device("cpu")
DT = _core.DType


@pytest.fixture(scope="module")
def gpu():
    return _core.Device("cuda:0")


@pytest.fixture
def deferred():
    saved = _core.cuda_deferred_index_checks()
    _core.cuda_set_deferred_index_checks(True)
    yield
    _core.cuda_set_deferred_index_checks(saved)


@pytest.fixture
def at_the_call():
    saved = _core.cuda_deferred_index_checks()
    _core.cuda_set_deferred_index_checks(False)
    yield
    _core.cuda_set_deferred_index_checks(saved)


def on(gpu, a):
    return _core.Tensor.from_buffer(np.ascontiguousarray(a)).to(gpu)


def host(t):
    return np.asarray(t.to(CPU))


def test_one_hot_reports_at_the_next_wait(gpu, deferred):
    idx = on(gpu, np.array([1, 7, 0, -2], np.int32))
    out = _core.one_hot(idx, 5)  # returns: the check is on the GPU
    with pytest.raises(IndexError, match=r"one_hot: indices must lie in \[0, 5\), got out-of-range values in "
                                         r"\[-2, 7\] on cuda:0.*came before the line that raised"):
        _core.cuda_sync(0)
    got = host(out)  # reported once: this wait is clean
    np.testing.assert_array_equal(got, [[0, 1, 0, 0, 0], [0] * 5, [1, 0, 0, 0, 0], [0] * 5])  # bad rows are zeros


def test_take_and_index_add_skip_bad_indices_and_report_at_a_copy(gpu, deferred):
    x = on(gpu, np.arange(10, dtype=np.float32))
    vals = _core.take(x, on(gpu, np.array([2, 10, 9], np.int64)))
    with pytest.raises(IndexError, match=r"take: indices must lie in \[0, 10\), got out-of-range values in \[10, 10\]"):
        host(vals)  # the copy to the host is the wait
    np.testing.assert_array_equal(host(vals), [2, 0, 9])
    dense = on(gpu, np.zeros(6, np.float32))
    _core.index_add_(dense, on(gpu, np.array([5, 6, -1, 0], np.int64)), on(gpu, np.ones(4, np.float32)))
    with pytest.raises(IndexError, match=r"index_add: indices must lie in \[0, 6\), got out-of-range values in "
                                         r"\[-1, 6\]"):
        _core.cuda_sync(0)
    np.testing.assert_array_equal(host(dense), [1, 0, 0, 0, 0, 1])  # nothing written outside, nothing else lost


def test_the_first_faulting_call_is_the_one_reported(gpu, deferred):
    # every input copied first: a copy from the host waits for the device, and would report the first fault itself
    labels, x, idx = (on(gpu, np.array([9], np.int64)), on(gpu, np.zeros(4, np.float32)),
                      on(gpu, np.array([100], np.int64)))
    _core.one_hot(labels, 3)
    _core.take(x, idx)
    with pytest.raises(IndexError, match=r"one_hot: indices must lie in \[0, 3\), got out-of-range values in \[9, 9\]"):
        _core.cuda_sync(0)
    _core.cuda_sync(0)


def test_with_the_deferral_off_the_call_raises_as_on_the_cpu(gpu, at_the_call):
    labels = np.array([1, 7], np.int32)
    with pytest.raises(IndexError) as on_gpu:
        _core.one_hot(on(gpu, labels), 5)
    with pytest.raises(IndexError) as on_cpu:
        _core.one_hot(_core.Tensor.from_buffer(labels), 5)
    assert str(on_gpu.value) == str(on_cpu.value) == "one_hot: indices must lie in [0, 5), got values in [1, 7]"
    dense = on(gpu, np.zeros(5, np.float32))
    with pytest.raises(IndexError, match=r"index_add: indices must lie in \[0, 5\), got values in \[1, 5\]"):
        _core.index_add_(dense, on(gpu, np.array([1, 5], np.int64)), on(gpu, np.ones(2, np.float32)))
    np.testing.assert_array_equal(host(dense), np.zeros(5))  # checked before the kernel: nothing written


def test_valid_indices_give_the_cpus_results(gpu, deferred, rng):
    labels = rng.integers(0, 10, 64).astype(np.int32)
    np.testing.assert_array_equal(host(_core.one_hot(on(gpu, labels), 10)),
                                  np.asarray(_core.one_hot(_core.Tensor.from_buffer(labels), 10)))
    x = rng.standard_normal(1000).astype(np.float32)
    idx = np.sort(rng.choice(1000, 100, replace=False)).astype(np.int64)
    np.testing.assert_array_equal(host(_core.take(on(gpu, x), on(gpu, idx))), x[idx])
    dense = on(gpu, x)
    _core.index_add_(dense, on(gpu, idx), on(gpu, x[idx]))
    want = x.copy()
    want[idx] *= 2
    np.testing.assert_array_equal(host(dense), want)
    _core.cuda_sync(0)  # nothing reported


def _queue_gpu_work(gpu, seconds=0.3):
    """Queues about `seconds` of GPU time (float32 GEMMs, no TF32), measured once with a sync."""
    a = on(gpu, np.random.default_rng(0).standard_normal((4096, 4096)).astype(np.float32))
    _core.matmul(a, a)
    _core.cuda_sync(0)
    start = time.perf_counter()
    _core.matmul(a, a)
    _core.cuda_sync(0)
    one = time.perf_counter() - start
    outs = [_core.matmul(a, a) for _ in range(max(1, int(seconds / one)))]
    return outs, one * len(outs)


def test_the_checks_do_not_wait_for_the_gpu(gpu, deferred):
    """With GPU work queued, a deferred one_hot / take / index_add_ returns long before it is done; checked at the
    call, each waits for the queue (the cost this removes: one softmax cross-entropy step, 2 + 2P per sparse
    DistOpt step)."""
    # every input is on the GPU before the work is queued: a copy from the host waits for the queue itself
    idx, x = on(gpu, np.array([3, 1], np.int64)), on(gpu, np.arange(8, dtype=np.float32))
    ones = on(gpu, np.ones(2, np.float32))
    _core.one_hot(idx, 8)
    _core.take(x, idx)
    _core.index_add_(x, idx, ones)
    _core.cuda_sync(0)
    work, queued = _queue_gpu_work(gpu)
    start = time.perf_counter()
    _core.one_hot(idx, 8)
    _core.take(x, idx)
    _core.index_add_(x, idx, ones)
    deferred_s = time.perf_counter() - start
    _core.cuda_sync(0)
    _core.cuda_set_deferred_index_checks(False)
    work, queued = _queue_gpu_work(gpu)
    start = time.perf_counter()
    _core.one_hot(idx, 8)
    at_call_s = time.perf_counter() - start
    _core.cuda_sync(0)
    assert queued > 0.1, f"only {queued:.3f} s of work queued: the comparison means nothing"
    assert at_call_s > 0.5 * queued, (at_call_s, queued)  # the control: a check at the call waits
    assert deferred_s < 0.25 * queued, (deferred_s, queued)


def test_a_training_step_with_a_bad_label_raises_by_the_loss(gpu, deferred):
    dev = device.create_cuda_gpu_on(0)
    logits = tensor.Tensor(data=np.zeros((4, 3), np.float32), device=dev, requires_grad=True, stores_grad=True)
    labels = tensor.Tensor(data=np.array([0, 1, 3, 2], np.int32), device=dev, requires_grad=False)
    saved = autograd.training
    autograd.training = True
    try:
        # by the time the loss is read at the latest (an op of the loss that waits for the device reports it earlier)
        with pytest.raises(IndexError, match=r"one_hot: indices must lie in \[0, 3\), got out-of-range values in "
                                             r"\[3, 3\]"):
            loss = autograd.softmax_cross_entropy(logits, labels)
            loss.item()
    finally:
        autograd.training = saved
