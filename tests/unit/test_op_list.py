"""The one list of element-wise ops (csrc/ops/elementwise_ops.h) as _core exports it: every listed op is bound,
names are unique, and each unary op's domain is what its front-end enforces."""
import numpy as np
import pytest

from singa_lite import _core, tensor


def test_binary_ops_are_bound_with_scalar_forms():
    names = _core.binary_ops()
    assert len(names) == len(set(names)) and "add" in names and "ge" in names
    for name in names:
        assert callable(getattr(_core, name)) and callable(getattr(_core, name + "_scalar"))


@pytest.mark.parametrize("name,domain", _core.unary_ops())
def test_unary_domain_is_enforced(name, domain):
    fn = getattr(_core, name)
    ints = tensor.from_numpy(np.array([1, 2, 3], np.int32)).data
    floats = tensor.from_numpy(np.array([0.25, 0.5, 1.0], np.float32)).data
    assert fn(floats).dtype == floats.dtype
    if domain == "numeric":
        assert fn(ints).dtype == ints.dtype
    else:
        assert domain == "floating"
        with pytest.raises(TypeError, match=name):
            fn(ints)


def test_unary_names_unique_and_disjoint_from_binary():
    unary = [n for n, _ in _core.unary_ops()]
    assert len(unary) == len(set(unary))
    assert not set(unary) & set(_core.binary_ops())
