"""The communication hooks (singa_lite.parallel.hooks, powersgd) in one process, over a real one-rank tcp
communicator: argument checks with clear errors, Gram-Schmidt against numpy's QR, PowerSGD's plain phase,
memory per bucket (warm start kept, rebuilt when a bucket's parameters change), what run_comm_hook accepts
from a hook. Several ranks: tests/multiproc/test_comm_hooks_dist.py."""
import numpy as np
import pytest

from singa_lite import dist, tensor
from singa_lite.parallel import hooks
from singa_lite.parallel.bucket import GradBucket
from singa_lite.parallel.powersgd import PowerSGDState, orthogonalize, powerSGD_hook


@pytest.fixture(scope="module")
def comm():
    c = dist.init(backend="tcp", timeout=30)
    yield c
    c.close()


def param(shape, seed=0):
    return tensor.Tensor(data=np.random.default_rng(seed).standard_normal(shape).astype(np.float32),
                         stores_grad=True)


def make_bucket(comm, values, ps, index=0, last=True):
    return GradBucket(index, tensor.from_numpy(np.asarray(values, np.float32)), ps, last, comm)


# ----------------------------------------------------------------------------------------- checks
@pytest.mark.parametrize("kwargs,match", [
    ({"matrix_approximation_rank": 0}, "matrix_approximation_rank must be an int >= 1, got 0"),
    ({"matrix_approximation_rank": 1.5}, "matrix_approximation_rank must be an int >= 1"),
    ({"start_powerSGD_iter": -1}, "start_powerSGD_iter must be an int >= 0, got -1"),
    ({"min_compression_rate": 0}, "min_compression_rate must be a finite number > 0"),
    ({"orthogonalization_epsilon": -1e-8}, "orthogonalization_epsilon must be a finite number >= 0"),
    ({"orthogonalization_epsilon": float("nan")}, "orthogonalization_epsilon must be a finite number"),
    ({"random_seed": True}, "random_seed must be an int >= 0"),
])
def test_powersgd_state_refuses_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PowerSGDState(**kwargs)


def test_powersgd_state_flags_and_group_are_checked():
    with pytest.raises(TypeError, match="use_error_feedback must be True or False, got 'yes'"):
        PowerSGDState(use_error_feedback="yes")
    with pytest.raises(TypeError, match=r"process_group=...\): expected a Communicator .* got int"):
        PowerSGDState(process_group=3)


def test_check_comm_hook(comm):
    assert hooks.check_comm_hook(None, hooks.allreduce_hook) == (None, hooks.allreduce_hook)
    state = PowerSGDState()
    assert hooks.check_comm_hook(state, powerSGD_hook) == (state, powerSGD_hook)
    with pytest.raises(TypeError, match=r"hook must be a callable hook\(state, bucket\), got NoneType"):
        hooks.check_comm_hook(None, None, "DistOpt.register_comm_hook")
    with pytest.raises(TypeError, match="were they swapped"):
        hooks.check_comm_hook(powerSGD_hook, state)
    with pytest.raises(TypeError, match="powerSGD_hook needs a PowerSGDState as its state, got NoneType"):
        hooks.check_comm_hook(None, powerSGD_hook)
    with pytest.raises(TypeError, match="expected a Communicator"):
        hooks.check_comm_hook("group", hooks.fp16_compress_hook)
    hooks.check_comm_hook(comm, hooks.bf16_compress_hook)  # a Communicator as the state: PyTorch's form


def test_hooks_refuse_what_they_cannot_compress(comm):
    p = tensor.Tensor(data=np.zeros(4, np.int32), stores_grad=True)
    b = GradBucket(0, tensor.from_numpy(np.arange(4, dtype=np.int32)), [p], True, comm)
    with pytest.raises(TypeError, match="fp16_compress_hook: the bucket holds int32 gradients"):
        hooks.fp16_compress_hook(None, b)
    with pytest.raises(TypeError, match="powerSGD_hook: state must be a PowerSGDState, got HookState"):
        powerSGD_hook(hooks.HookState(), b)
    with pytest.raises(TypeError, match="expected a parallel.bucket.GradBucket, got Tensor"):
        hooks.allreduce_hook(None, b.buffer())


def test_run_comm_hook_checks_what_the_hook_returns(comm):
    ps = [param((3, 4))]
    b = make_bucket(comm, np.arange(12), ps)
    # (the check is bucket.take_result, the reducer's too)
    with pytest.raises(TypeError, match=r"returned NoneType None; a hook must return the averaged bucket"):
        hooks.run_comm_hook(lambda s, bk: None, None, b).wait()
    with pytest.raises(TypeError, match=r"returned a tensor of shape \[11\] and dtype float32; .* shape \[12\] "
                                        r"and dtype float32"):
        hooks.run_comm_hook(lambda s, bk: tensor.from_numpy(np.zeros(11, np.float32)), None, b).wait()
    with pytest.raises(TypeError, match=r"its handle's wait\(\) returned a tensor of shape \[12\] and dtype float64"):
        hooks.run_comm_hook(lambda s, bk: hooks.HookFuture(lambda: tensor.from_numpy(np.zeros(12))), None, b).wait()
    # another tensor of the right kind is copied into the buffer; a handle's result too
    out = hooks.run_comm_hook(lambda s, bk: tensor.from_numpy(np.full(12, 2, np.float32)), None, b).wait()
    assert out is b.buffer() and (tensor.to_numpy(b.buffer()) == 2).all()
    h = hooks.run_comm_hook(lambda s, bk: hooks.HookFuture(lambda: tensor.from_numpy(np.ones(12, np.float32))),
                            None, b)
    assert (tensor.to_numpy(h.wait()) == 1).all() and h.done()


def test_hook_future_runs_once_and_keeps_its_error():
    calls = []

    def finish():
        calls.append(1)
        raise RuntimeError("collective failed")
    f = hooks.HookFuture(finish)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="collective failed"):
            f.wait()
    assert calls == [1]  # a second wait() must not issue the collectives again
    assert hooks.HookFuture.completed(5).wait() == 5


# ----------------------------------------------------------------------------------------- PowerSGD pieces
@pytest.mark.parametrize("n,r", [(9, 1), (9, 3), (40, 4)])
def test_orthogonalize_matches_numpy_qr(n, r):
    a = np.random.default_rng(n + r).standard_normal((n, r))
    t = tensor.from_numpy(a)
    assert orthogonalize(t) is t
    q = tensor.to_numpy(t)
    np.testing.assert_allclose(q.T @ q, np.eye(r), atol=1e-12)
    ref, rr = np.linalg.qr(a)
    np.testing.assert_allclose(q, ref * np.sign(np.diag(rr)), atol=1e-12)  # QR up to the columns' signs


def test_orthogonalize_zero_column_stays_zero_and_epsilon_is_added():
    a = np.zeros((5, 2))
    a[:, 1] = 3.0
    t = tensor.from_numpy(a)
    q = tensor.to_numpy(orthogonalize(t))
    assert np.isfinite(q).all() and (q[:, 0] == 0).all()
    np.testing.assert_allclose(q[:, 1], 1 / np.sqrt(5))
    q = tensor.to_numpy(orthogonalize(tensor.from_numpy(np.full((4, 1), 0.5)), epsilon=1.0))
    np.testing.assert_allclose(q[:, 0], 0.5 / (1.0 + 1.0))  # norm 1, plus epsilon


def test_powersgd_plain_phase_then_compression(comm):
    ps = [param((12, 10)), param((10,))]
    state = PowerSGDState(matrix_approximation_rank=1, start_powerSGD_iter=2)
    g = np.random.default_rng(0).standard_normal(130).astype(np.float32)
    for step in range(3):
        b = make_bucket(comm, g, ps)
        out = tensor.to_numpy(hooks.run_comm_hook(powerSGD_hook, state, b).wait())
        if step < 2:  # one rank's plain average: the gradient itself, no memory yet
            np.testing.assert_array_equal(out, g)
            assert state._buckets == {}
        else:
            assert np.linalg.matrix_rank(out[:120].reshape(12, 10), tol=1e-5) == 1
            np.testing.assert_array_equal(out[120:], g[120:])  # the bias is sent uncompressed
    assert state.iter == 3
    assert state.bytes_plain == 3 * 130 * 4 and state.bytes_sent == 2 * 130 * 4 + (12 + 10 + 10) * 4
    rate, before, after = state.compression_stats()
    assert (before, after) == (130, 32) and rate == pytest.approx(130 / 32)


def test_powersgd_iter_counts_steps_not_buckets(comm):
    ps = [param((12, 10))]
    state = PowerSGDState(start_powerSGD_iter=0)
    for _ in range(2):
        for i in range(3):
            hooks.run_comm_hook(powerSGD_hook, state, make_bucket(comm, np.ones(120), ps, i, last=i == 2)).wait()
    assert state.iter == 2 and sorted(state._buckets) == [0, 1, 2]


def seeds_drawn(state, most=5):
    """How many initial-Q seeds the state's generator has drawn (replayed on a fresh generator)."""
    probe = state.rng.randint(1 << 30)
    for k in range(most):
        fresh = np.random.RandomState(state.random_seed)
        for _ in range(k):
            fresh.randint(1_000_000_000)
        if fresh.randint(1 << 30) == probe:
            return k
    raise AssertionError("more seeds drawn than expected")


@pytest.mark.parametrize("warm_start,draws", [(True, 1), (False, 3)])
def test_powersgd_memory_warm_start_and_rebuild(comm, warm_start, draws):
    ps = [param((16, 12), 1), param((12,), 2)]
    state = PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=0, warm_start=warm_start)
    g = np.random.default_rng(1).standard_normal(204).astype(np.float32)
    errors = []
    for _ in range(3):
        hooks.run_comm_hook(powerSGD_hook, state, make_bucket(comm, g, ps)).wait()
        errors.append(tensor.to_numpy(state._buckets[0].error))
    assert seeds_drawn(state) == draws  # warm start: one random Q, then the last step's
    mem = state._buckets[0]
    # error feedback: the same gradient three times, but each step's input included the last error
    assert not np.array_equal(errors[0], errors[1]) and not np.array_equal(errors[1], errors[2])
    # other parameters at the same index (a rebuilt bucket): new memory, zero error, a new random Q
    other = [param((16, 12), 3), param((12,), 4)]
    b = make_bucket(comm, np.zeros(204), other)
    hooks.run_comm_hook(powerSGD_hook, state, b).wait()
    assert state._buckets[0] is not mem
    np.testing.assert_array_equal(tensor.to_numpy(state._buckets[0].error), 0)  # 0 in, no error carried


def test_powersgd_small_and_1d_tensors_go_uncompressed(comm):
    # 3 x 2 at rank 1: (3 + 2) * 1 * 2 = 10 > 6 elements, compression would not pay; a bucket of only those
    ps = [param((3, 2)), param((4,))]
    state = PowerSGDState(start_powerSGD_iter=0)
    g = np.arange(10, dtype=np.float32)
    out = tensor.to_numpy(hooks.run_comm_hook(powerSGD_hook, state, make_bucket(comm, g, ps)).wait())
    np.testing.assert_array_equal(out, g)
    assert state.bytes_sent == state.bytes_plain == 40
    # min_compression_rate lowered below 6/10: now the 3 x 2 matrix is compressed
    state = PowerSGDState(start_powerSGD_iter=0, min_compression_rate=0.5)
    hooks.run_comm_hook(powerSGD_hook, state, make_bucket(comm, g, ps)).wait()
    assert state.bytes_sent == (3 + 2 + 4) * 4


def test_compress_hooks_round_to_16_bits(comm):
    ps = [param((5,))]
    g = np.array([1.0, 1 + 2 ** -9, 1 + 2 ** -12, 3e-8, 70000.0], np.float32)
    out16 = tensor.to_numpy(hooks.run_comm_hook(hooks.fp16_compress_hook, None, make_bucket(comm, g, ps)).wait())
    np.testing.assert_array_equal(out16[:4], g[:4].astype(np.float16).astype(np.float32))
    assert np.isinf(out16[4])  # beyond float16's range: the documented limit of fp16 compression
    outbf = tensor.to_numpy(hooks.run_comm_hook(hooks.bf16_compress_hook, None, make_bucket(comm, g, ps)).wait())
    assert outbf[1] == 1.0 and outbf[4] == 70144.0  # 8 bits of mantissa, float32's range
