"""The fused optimizer kernels (_core.sgd_update_) against the formula in numpy, and their argument checks."""
import numpy as np
import pytest

from singa_lite import _core

T = _core.Tensor.from_buffer


def ref_sgd(p, g, buf, lr, momentum, dampening, weight_decay, nesterov, first):
    d = g + weight_decay * p
    if buf is None:
        return p - lr * d, None
    buf = d if first else momentum * buf + (1 - dampening) * d
    return p - lr * ((d + momentum * buf) if nesterov else buf), buf


CONFIGS = [  # lr, momentum, dampening, weight_decay, nesterov
    (0.1, 0.0, 0.0, 0.0, False), (0.05, 0.0, 0.0, 0.01, False), (0.1, 0.9, 0.0, 0.0, False),
    (0.02, 0.9, 0.1, 0.001, False), (0.1, 0.9, 0.0, 0.01, True),
]


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-13), (np.float32, 2e-6), (np.float16, 2e-3)])
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("first", [True, False])
def test_sgd_update_matches_the_formula(dtype, rtol, config, first):
    lr, mom, damp, wd, nesterov = config
    rng = np.random.default_rng(0)
    p, g, b = (rng.standard_normal((37, 65)).astype(dtype) for _ in range(3))
    use_buf = mom != 0
    exp_p, exp_b = ref_sgd(p.astype(np.float64), g.astype(np.float64), b.astype(np.float64) if use_buf else None,
                           lr, mom, damp, wd, nesterov, first)
    tp, tb = T(p.copy()), (T(b.copy()) if use_buf else None)
    _core.sgd_update_(tp, T(g), tb, lr, mom, damp, wd, nesterov, first)
    np.testing.assert_allclose(np.asarray(tp), exp_p, rtol=rtol, atol=rtol)
    if use_buf:
        np.testing.assert_allclose(np.asarray(tb), exp_b, rtol=rtol, atol=rtol)


def test_sgd_update_on_strided_views_writes_only_the_view():
    rng = np.random.default_rng(1)
    base = rng.standard_normal((8, 10)).astype(np.float32)
    g = rng.standard_normal((5, 8)).astype(np.float32)
    tbase = T(base.copy())
    view = tbase.transpose([1, 0]).slice(0, 0, 10, 2)  # (5, 8), strided both ways
    buf = T(np.zeros((5, 8), np.float32))
    _core.sgd_update_(view, T(g), buf, 0.5, 0.9, 0.0, 0.0, False, True)
    expected = base.copy()
    expected.T[0:10:2] -= 0.5 * g
    np.testing.assert_allclose(np.asarray(tbase), expected, rtol=1e-6)


@pytest.mark.parametrize("call,message", [
    (lambda p, g, b: _core.sgd_update_(p, T(np.zeros((3, 5), np.float32)), b, 0.1, 0.9), "grad has shape"),
    (lambda p, g, b: _core.sgd_update_(p, g, T(np.zeros(4, np.float32)), 0.1, 0.9), "buf has shape"),
    (lambda p, g, b: _core.sgd_update_(p, g, None, 0.1, 0.9), "needs a momentum buffer"),
    (lambda p, g, b: _core.sgd_update_(p, T(np.zeros((3, 4))), b, 0.1, 0.9), "float64"),
    (lambda p, g, b: _core.sgd_update_(p, p, b, 0.1, 0.9), "share memory"),
    (lambda p, g, b: _core.sgd_update_(p, g, p, 0.1, 0.9), "share memory"),
    (lambda p, g, b: _core.sgd_update_(T(np.zeros((3, 4), np.int32)), T(np.zeros((3, 4), np.int32)), None, 1, 0),
     "int32"),
])
def test_sgd_update_rejects_bad_arguments_before_writing(call, message):
    p0 = np.arange(12, dtype=np.float32).reshape(3, 4)
    p, g, b = T(p0.copy()), T(np.ones((3, 4), np.float32)), T(np.zeros((3, 4), np.float32))
    with pytest.raises((ValueError, TypeError), match=message):
        call(p, g, b)
    np.testing.assert_array_equal(np.asarray(p), p0)
