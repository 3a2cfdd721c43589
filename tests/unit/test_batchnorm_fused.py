"""Batch normalisation's fused CPU training passes (csrc/cpu/batch_norm.cpp, used by ops/nn.py's _BatchNorm2d for
float32 / float64 CPU tensors): values against a float64 numpy reference, the same bits for 1 and 2 threads and on
every instruction-set level, the (N, C) form, odd sizes (channel lengths that are no multiple of the 8 summing
lanes), and bad arguments. test_nn_ops.py checks the operator's gradients against finite differences through the
same kernels."""
import numpy as np
import pytest

from singa_lite import _core, tensor


def ct(a):
    return tensor.from_numpy(np.ascontiguousarray(a)).data


def np_(t):
    return tensor.to_numpy(tensor.Tensor(data=t))


def reference(x, scale, bias, dy, eps):
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    M = x.size // x.shape[1]
    mean, var = x.mean(axes), x.var(axes)
    inv_std = 1 / np.sqrt(var + eps)
    xhat = (x - mean.reshape(shape)) * inv_std.reshape(shape)
    y = xhat * scale.reshape(shape) + bias.reshape(shape)
    dbias, dscale = dy.sum(axes), (dy * xhat).sum(axes)
    dx = (scale * inv_std).reshape(shape) / M * (M * dy - dbias.reshape(shape) - xhat * dscale.reshape(shape))
    return y, mean, var, inv_std, dx, dscale, dbias


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("shape", [(16, 64, 8, 8), (3, 5, 7, 9), (5, 3, 1, 1), (7, 6), (2, 4, 3, 5)])
def test_matches_reference(shape, dtype, tol):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3 + 2).astype(dtype)
    scale, bias = rng.standard_normal(shape[1]).astype(dtype), rng.standard_normal(shape[1]).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    y, mean, var, inv_std = _core.batch_norm_train_forward(ct(x), ct(scale), ct(bias), 1e-5)
    dx, dscale, dbias = _core.batch_norm_train_backward(ct(x), ct(dy), mean, inv_std, ct(scale), True)
    ref = reference(*(a.astype(np.float64) for a in (x, scale, bias, dy)), 1e-5)
    for what, got, want in zip(("y", "mean", "var", "inv_std", "dx", "dscale", "dbias"),
                               (y, mean, var, inv_std, dx, dscale, dbias), ref):
        got = np_(got)
        assert got.dtype == dtype and got.shape == want.shape, what
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max())), err_msg=what)
    none_dx, dscale2, _ = _core.batch_norm_train_backward(ct(x), ct(dy), mean, inv_std, ct(scale), False)
    assert none_dx is None and np.array_equal(np_(dscale2), np_(dscale))


def test_same_bits_for_1_and_2_threads(restore_threads):
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((16, 128, 16, 16)).astype(np.float32), rng.standard_normal((16, 128, 16, 16)).astype(
        np.float32)
    scale, bias = rng.standard_normal(128).astype(np.float32), rng.standard_normal(128).astype(np.float32)
    out = {}
    for n in (1, 2):
        _core.set_num_threads(n)
        fwd = _core.batch_norm_train_forward(ct(x), ct(scale), ct(bias), 1e-5)
        bwd = _core.batch_norm_train_backward(ct(x), ct(dy), fwd[1], fwd[3], ct(scale), True)
        out[n] = [np_(t) for t in (*fwd, *bwd)]
    for a, b in zip(out[1], out[2]):
        np.testing.assert_array_equal(a, b)


ISA_LEVELS = ["baseline", "avx2", "avx512"]
ISA_SUPPORTED = ISA_LEVELS[: ISA_LEVELS.index(_core.build_info()["cpu_isa"]["best"]) + 1]


def test_same_bits_on_every_instruction_set_level():
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal((4, 24, 5, 7)).astype(np.float32), rng.standard_normal((4, 24, 5, 7)).astype(
        np.float32)
    scale, bias = rng.standard_normal(24).astype(np.float32), rng.standard_normal(24).astype(np.float32)
    before = _core.get_isa()
    seen = {}
    try:
        for level in ISA_SUPPORTED:
            _core.set_isa(level)
            fwd = _core.batch_norm_train_forward(ct(x), ct(scale), ct(bias), 1e-5)
            bwd = _core.batch_norm_train_backward(ct(x), ct(dy), fwd[1], fwd[3], ct(scale), True)
            seen[level] = b"".join(np_(t).tobytes() for t in (*fwd, *bwd))
    finally:
        _core.set_isa(before)
    assert len(seen) == len(ISA_SUPPORTED) and len(set(seen.values())) == 1


def test_errors():
    x = ct(np.zeros((2, 3, 4, 4), np.float32))
    c3 = ct(np.ones(3, np.float32))
    with pytest.raises(ValueError, match=r"per-channel tensors must be \(3,\)"):
        _core.batch_norm_train_forward(x, ct(np.ones(4, np.float32)), c3, 1e-5)
    with pytest.raises(ValueError, match="more than one value per channel"):
        _core.batch_norm_train_forward(ct(np.zeros((1, 3), np.float32)), c3, c3, 1e-5)
    with pytest.raises(TypeError, match="float32 or float64"):
        _core.batch_norm_train_forward(ct(np.zeros((2, 3, 4, 4), np.int32)), c3, c3, 1e-5)
    with pytest.raises(ValueError, match="shape"):
        _core.batch_norm_train_forward(ct(np.zeros((2, 3, 4), np.float32)), c3, c3, 1e-5)
    with pytest.raises(ValueError, match="must match x"):
        _core.batch_norm_train_backward(x, ct(np.zeros((2, 3, 4, 5), np.float32)), c3, c3, c3, True)
