"""singa_lite.initializer: SINGA's parameter initialisers (fan rules and distributions from SINGA's docs)."""
import math
import warnings

import numpy as np
import pytest

from singa_lite import initializer, tensor
from singa_lite.tensor import Tensor

SHAPES = [(400, 900), (300, 50, 8), (30, 50, 4, 8)]


def fans(shape):
    if len(shape) == 2:
        return shape[0], shape[1]
    field = int(np.prod(shape[2:]))
    return shape[1] * field, shape[0] * field


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name,scale,mode", [("he_uniform", 2.0, "in"), ("lecun_uniform", 1.0, "in"),
                                             ("glorot_uniform", 1.0, "avg")])
def test_uniform_initialisers(name, scale, mode, shape):
    fan_in, fan_out = fans(shape)
    n = fan_in if mode == "in" else (fan_in + fan_out) / 2
    limit = math.sqrt(3 * scale / n)
    t = Tensor(shape)
    assert getattr(initializer, name)(t) is t
    a = tensor.to_numpy(t)
    assert a.min() >= -limit and a.max() <= limit
    assert a.max() == pytest.approx(limit, rel=0.05) and a.min() == pytest.approx(-limit, rel=0.05)
    assert abs(a.mean()) < limit / 10


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name,scale,mode", [("he_normal", 2.0, "in"), ("lecun_normal", 1.0, "in"),
                                             ("glorot_normal", 1.0, "avg")])
def test_normal_initialisers(name, scale, mode, shape):
    fan_in, fan_out = fans(shape)
    n = fan_in if mode == "in" else (fan_in + fan_out) / 2
    std = math.sqrt(scale / n)
    t = Tensor(shape)
    getattr(initializer, name)(t)
    a = tensor.to_numpy(t)
    assert a.std() == pytest.approx(std, rel=0.05)
    assert abs(a.mean()) < std / 10


def test_fans_for_other_shapes():
    assert initializer._compute_fans((3, 3, 16, 32), "channels_last") == (3 * 3 * 16, 3 * 3 * 32)
    assert initializer._compute_fans((64,)) == (8.0, 8.0)
    with pytest.raises(ValueError, match="data_format"):
        initializer._compute_fans((2, 3, 4), "nchw")


def test_eye_and_orthogonal():
    t = Tensor((3, 5))
    initializer.eye(t)
    np.testing.assert_array_equal(tensor.to_numpy(t), np.eye(3, 5))
    for shape in [(6, 4), (4, 6)]:
        q = tensor.to_numpy(initializer.orthogonal(Tensor(shape), gain=2.0)).astype(np.float64)
        small = min(shape)
        gram = q.T @ q if shape[0] > shape[1] else q @ q.T
        np.testing.assert_allclose(gram, 4.0 * np.eye(small), atol=1e-5)
    with pytest.raises(ValueError, match="2-D"):
        initializer.eye(Tensor((2, 3, 4)))


def test_bad_input_is_a_clear_error():
    with pytest.raises(TypeError, match="Tensor"):
        initializer.he_uniform(np.zeros((3, 3)))
    with pytest.raises(TypeError, match="floating"):
        initializer.he_normal(Tensor((3, 3), dtype=tensor.int32))


def test_deprecated_forms_warn_and_fill():
    t = Tensor((200, 300))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        initializer.xavier(t)
        a = tensor.to_numpy(t)
        assert abs(a).max() <= math.sqrt(6 / 500) and a.std() > 0
        initializer.glorot(t)
        assert tensor.to_numpy(t).std() == pytest.approx(math.sqrt(2 / 500), rel=0.05)
        initializer.msra(t)
        assert tensor.to_numpy(t).std() == pytest.approx(math.sqrt(2 / 200), rel=0.05)
        initializer.gaussian(t, fan_in=200, fan_out=300)
        assert tensor.to_numpy(t).std() == pytest.approx(math.sqrt(4 / 500), rel=0.05)
    assert sum(issubclass(w.category, DeprecationWarning) for w in caught) == 4
    with pytest.raises(ValueError, match="fan_in or fan_out"), pytest.warns(DeprecationWarning):
        initializer.gaussian(t)
