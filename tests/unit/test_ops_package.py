"""The operator package singa_lite.ops: one place per operator, one namespace, and the old module paths
(singa_lite.functional, operators, nn_ops, ops_math, ops_shape, ops_loss) still giving their names."""
import importlib
import inspect
import sys
import warnings

import pytest

from singa_lite import autograd, engine, ops
from singa_lite.ops import activation, common, elementwise, linalg, loss, nn, reduce, shapes, transformer

MODULES = (activation, common, elementwise, linalg, loss, nn, reduce, shapes, transformer)


def test_every_name_is_exported_by_exactly_one_module_and_the_package_has_them_all():
    seen = {}
    for m in MODULES:
        for name in m.__all__:
            assert name not in seen, f"{name} is exported by {seen[name]} and {m.__name__}"
            seen[name] = m.__name__
            assert getattr(ops, name) is getattr(m, name), name
    assert sorted(seen) == ops.__all__


def test_every_exported_operator_is_an_engine_operator_defined_in_the_package():
    classes = [getattr(ops, n) for n in ops.__all__ if inspect.isclass(getattr(ops, n))]
    assert len(classes) > 80
    for cls in classes:
        assert issubclass(cls, engine.Operator), cls
        assert cls.__module__.startswith("singa_lite.ops."), cls


def test_autograd_gives_the_same_objects():
    for name in ops.__all__:
        assert getattr(autograd, name) is getattr(ops, name), name


# A few names of each old module, among them the ones that went to a module other than the one it maps to.
OLD_NAMES = {
    "singa_lite.functional": ["conv2d", "relu", "gemm", "softmax_cross_entropy", "_and", "axis_helper"],
    "singa_lite.operators": ["add", "matmul", "reshape", "reduce_sum", "relu", "dropout", "softmax", "_slice"],
    "singa_lite.ops_math": ["sin", "prelu", "selu", "cossim", "less", "_xor", "max", "where", "add_all"],
    "singa_lite.ops_shape": ["squeeze", "gather", "onehot", "gemm", "embedding", "axis_helper", "ctensor2numpy"],
    "singa_lite.nn_ops": ["conv2d", "_Conv2d", "_BatchNorm2d", "max_pool2d", "pooling_2d", "globalaveragepool"],
    "singa_lite.ops_loss": ["mse_loss", "softmax_cross_entropy", "_targets", "RankingLoss"],
}


@pytest.mark.parametrize("old", sorted(OLD_NAMES))
def test_an_old_module_path_still_gives_its_names(old):
    sys.modules.pop(old, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = importlib.import_module(old)
    for name in OLD_NAMES[old]:
        assert getattr(module, name) is getattr(ops, name), (old, name)


def test_the_shared_helpers_compute_what_the_operators_need():
    from singa_lite import _core, tensor
    import numpy as np

    dx = _core.Tensor.from_buffer(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    np.testing.assert_array_equal(np.asarray(common.reduce_to(dx, (3, 1))),
                                  np.arange(24, dtype=np.float32).reshape(2, 3, 4).sum(axis=(0, 2))[:, None])
    assert common.norm_axis(-1, 3) == 2 and common.norm_axis(1, 3) == 1
    like = tensor.Tensor(data=dx)
    c = common.operand(2.5, like)
    assert c.shape == () and c.dtype == like.dtype and not c.requires_grad
    with pytest.raises(TypeError, match="expected a Tensor or a number"):
        common.operand("2", like)
    p = np.asarray(common.raw_softmax(dx, 2))
    np.testing.assert_allclose(p.sum(axis=2), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(common.raw_log_softmax(dx, 2)), np.log(p), rtol=1e-5, atol=1e-6)
