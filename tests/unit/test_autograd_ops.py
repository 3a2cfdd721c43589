"""Every autograd operator: forward against numpy, backward against central finite differences (float64, CPU).

Each case names the op, a function of Tensors, its numpy reference and the input shapes (or generators).
All inputs are parameters; the gradient checked is that of sum(y * R) for a fixed random R, passed as dy.
"""
import zlib

import numpy as np
import pytest

from singa_lite import autograd, tensor
from autograd_cases import CASES, make_inputs, param
from core_testutil import numeric_grads

RTOL = ATOL = 1e-5


pytestmark = pytest.mark.usefixtures("training")


@pytest.mark.parametrize("name,fn,ref,specs", CASES, ids=[c[0] for c in CASES])
def test_forward_and_gradient(name, fn, ref, specs):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    arrays = make_inputs(rng, specs)
    params = [param(a) for a in arrays]
    y = fn(*params)
    expected = ref(*arrays)
    got = tensor.to_numpy(y)
    assert got.shape == np.shape(expected)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)

    R = rng.standard_normal(got.shape)
    grads = autograd.gradients(y, tensor.Tensor(data=R, requires_grad=False))
    assert set(grads) == set(params)
    autograd.training = False
    for p, _a, num in zip(params, arrays, numeric_grads(fn, arrays, R)):
        g = grads[p]
        assert g.shape == p.shape and g.dtype == tensor.float64
        np.testing.assert_allclose(tensor.to_numpy(g), num, rtol=RTOL, atol=ATOL)


def _half_tolerance(expected):
    # float16 keeps ~3 decimal digits; errors grow with the values' scale and through chains of ops.
    scale = max(1.0, float(np.max(np.abs(expected))) if np.size(expected) else 1.0)
    return dict(rtol=3e-2, atol=3e-2 * scale)


@pytest.mark.parametrize("name,fn,ref,specs", CASES, ids=[c[0] for c in CASES])
def test_float16_forward_and_gradient_follow_float64(name, fn, ref, specs):
    # The same inputs (rounded to half first) through the float16 graph and the float64 one: every operator
    # runs in float16 end to end, gradients included, and stays within half precision of the exact result.
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    arrays = [a.astype(np.float16).astype(np.float64) for a in make_inputs(rng, specs)]
    halves = [tensor.Tensor(data=a.astype(np.float16), requires_grad=True, stores_grad=True) for a in arrays]
    doubles = [param(a) for a in arrays]
    y16, y64 = fn(*halves), fn(*doubles)
    assert y16.dtype == (tensor.float64 if name.startswith("cast") else tensor.float16)  # cast: to float64
    expected = tensor.to_numpy(y64)
    np.testing.assert_allclose(tensor.to_numpy(y16).astype(np.float64), expected, **_half_tolerance(expected))
    R = np.asarray(rng.standard_normal(expected.shape)).astype(np.float16)
    g16 = autograd.gradients(y16, tensor.Tensor(data=R.astype(tensor.to_numpy(y16).dtype), requires_grad=False))
    g64 = autograd.gradients(y64, tensor.Tensor(data=R.astype(np.float64), requires_grad=False))
    for h, d in zip(halves, doubles):
        assert g16[h].dtype == tensor.float16
        want = tensor.to_numpy(g64[d])
        np.testing.assert_allclose(tensor.to_numpy(g16[h]).astype(np.float64), want, **_half_tolerance(want))
