"""The sparse-exchange ops behind DistOpt's sparsification: select_significant, take, index_add_."""
import math

import numpy as np
import pytest

from singa_lite import _core


def t(a):
    return _core.Tensor.from_buffer(np.ascontiguousarray(a))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_threshold_mode_keeps_every_large_magnitude_in_order(dtype):
    x = np.random.default_rng(0).standard_normal(1000).astype(dtype)
    got = np.asarray(_core.select_significant(t(x), 1.0, False))
    np.testing.assert_array_equal(got, np.flatnonzero(np.abs(x.astype(np.float64)) >= 1.0))
    assert got.dtype == np.int64


@pytest.mark.parametrize("spars", [0.001, 0.05, 0.5, 0.999, 1.0])
def test_top_k_is_exactly_the_largest_magnitudes(spars):
    x = np.random.default_rng(1).permutation(np.arange(1, 2001)).astype(np.float32)  # distinct magnitudes
    x[::3] *= -1
    k = math.ceil(spars * x.size)
    got = np.asarray(_core.select_significant(t(x), spars, True))
    assert got.size == k and np.all(np.diff(got) > 0)  # ascending
    np.testing.assert_array_equal(np.sort(got), np.sort(np.argsort(-np.abs(x), kind="stable")[:k]))


def test_top_k_compares_floats_not_truncated_values():
    # SINGA's comparator truncated to integers, so 0.9 and 0.1 tied; here 0.9 wins
    x = np.array([0.1, 0.9, 0.5, -0.95], np.float32)
    np.testing.assert_array_equal(np.asarray(_core.select_significant(t(x), 0.5, True)), [1, 3])


def test_nan_is_always_selected():
    x = np.array([5.0, np.nan, 1.0, 2.0], np.float32)
    np.testing.assert_array_equal(np.asarray(_core.select_significant(t(x), 0.25, True)), [1])
    np.testing.assert_array_equal(np.asarray(_core.select_significant(t(x), 3.0, False)), [0, 1])


def test_select_errors():
    x = t(np.ones(4, np.float32))
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        _core.select_significant(x, 1.5, True)
    with pytest.raises(ValueError, match=">= 0"):
        _core.select_significant(x, -1.0, False)
    with pytest.raises(ValueError, match="finite"):
        _core.select_significant(x, float("nan"), False)
    with pytest.raises(TypeError, match="floating"):
        _core.select_significant(t(np.ones(4, np.int32)), 0.5, True)
    with pytest.raises(ValueError, match="1-D"):
        _core.select_significant(t(np.ones((2, 2), np.float32)), 0.5, True)


def test_take_and_index_add_round_trip():
    x = np.random.default_rng(2).standard_normal(50).astype(np.float32)
    idx = np.array([3, 7, 0, 49], np.int64)
    vals = _core.take(t(x), t(idx))
    np.testing.assert_array_equal(np.asarray(vals), x[idx])
    dense = t(np.ones(50, np.float32))
    _core.index_add_(dense, t(idx), vals)
    want = np.ones(50, np.float32)
    want[idx] += x[idx]
    np.testing.assert_array_equal(np.asarray(dense), want)


def test_indices_out_of_range_never_write():
    dense = t(np.zeros(5, np.float32))
    with pytest.raises(IndexError, match=r"\[0, 5\)"):
        _core.index_add_(dense, t(np.array([1, 5], np.int64)), t(np.ones(2, np.float32)))
    with pytest.raises(IndexError):
        _core.take(dense, t(np.array([-1], np.int64)))
    with pytest.raises(ValueError, match="2 indices but 3 values"):
        _core.index_add_(dense, t(np.array([1, 2], np.int64)), t(np.ones(3, np.float32)))
    with pytest.raises(TypeError, match="int64"):
        _core.take(dense, t(np.array([1], np.int32)))
    np.testing.assert_array_equal(np.asarray(dense), np.zeros(5))


def test_top_k_ties_go_to_the_lower_index_and_zeros_have_no_sign():
    # A gradient with more zeros than k (dead ReLUs): the cut falls among equal magnitudes. The lower index wins,
    # -0.0 and 0.0 being the same magnitude, which is what the GPU's stable radix sort gives (cuda/sparse.cu), so
    # both devices send the same entries. nth_element alone left the choice among ties to its partitioning.
    rng = np.random.default_rng(3)
    x = np.zeros(4000, np.float32)
    x[rng.choice(4000, 2000, replace=False)] = -0.0
    big = rng.choice(4000, 40, replace=False)
    x[big] = rng.uniform(1, 2, 40).astype(np.float32) * rng.choice([-1, 1], 40)
    k = 1000
    got = np.asarray(_core.select_significant(t(x), k / x.size, True))
    zeros = np.setdiff1d(np.arange(x.size), big)
    np.testing.assert_array_equal(got, np.sort(np.concatenate([big, zeros[:k - big.size]])))
    # the same rule among equal non-zero magnitudes of both signs
    y = np.array([2.0, -1.0, 1.0, -2.0, 1.0, -1.0, 0.5], np.float32)
    np.testing.assert_array_equal(np.asarray(_core.select_significant(t(y), 4 / 7, True)), [0, 1, 2, 3])
