"""Reductions of the C++ core against numpy: sum / mean / max / min over any axes with keepdims, through
each kernel layout (contiguous inner runs, the leading-axes 'outer' path, the packed fallback, the
split-run parallel path), and argmax / argmin (ties and nan give the first index)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from singa_lite import _core
from core_testutil import (FLOATS, LAYOUTS, NUMERIC, assert_same, ids, make, rand, tensor,
                           to_np)

REDUCE = ["sum", "mean", "max", "min"]

# Floating sums are accumulated in float lanes (double across blocks), so they differ from numpy's pairwise
# sums by rounding: allowed is rtol * |result| + atol_factor * sum(|x|) over the reduced elements.
SUM_TOL = {np.dtype(np.float16): (1e-3, 1e-6), np.dtype(np.float32): (1e-6, 1e-5),
           np.dtype(np.float64): (1e-14, 1e-13)}


def _axis_arg(axes):
    return None if axes is None else tuple(axes)


def result_dtype(name, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.dtype(np.float32) if name == "mean" else np.dtype(np.int64)
    if name == "mean" and dtype.kind == "i":
        return np.dtype(np.float32)  # documented: integer means in float32
    return dtype


def np_reduce(name, x, axes, keepdims):
    ax = _axis_arg(axes)
    rd = result_dtype(name, x.dtype)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        if name in ("max", "min"):
            return getattr(np, name)(x.astype(rd), axis=ax, keepdims=keepdims)
        if rd.kind == "i":
            return np.sum(x.astype(rd), axis=ax, keepdims=keepdims, dtype=rd)
        f = np.sum if name == "sum" else np.mean
        return np.asarray(f(x.astype(np.float64), axis=ax, keepdims=keepdims)).astype(rd)


def check_reduce(name, got, x, axes, keepdims):
    expected = np_reduce(name, x, axes, keepdims)
    if name in ("max", "min") or expected.dtype.kind == "i":
        assert_same(got, expected)
        return
    ax = _axis_arg(axes)
    absx = np.abs(x.astype(np.float64))
    scale = np.sum(absx, axis=ax, keepdims=keepdims)
    if name == "mean":
        count = max(1, x.size // max(1, scale.size)) if x.size else 1
        scale = scale / count
    rtol, atol_factor = SUM_TOL[expected.dtype]
    got_np = to_np(got)
    assert got_np.shape == expected.shape and got_np.dtype == expected.dtype, (got_np.shape, expected.shape)
    with np.errstate(invalid="ignore"):  # inf - inf where both are inf
        err = np.abs(got_np.astype(np.float64) - expected.astype(np.float64))
    bound = rtol * np.abs(expected.astype(np.float64)) + atol_factor * scale + np.finfo(expected.dtype).tiny
    same_nan = np.isnan(got_np) == np.isnan(expected)
    assert same_nan.all(), (got_np, expected)
    ok = np.isnan(expected) | (err <= bound) | (got_np == expected)
    assert ok.all(), f"max error {np.nanmax(err - bound)} over the bound\n{got_np}\n{expected}"


def call(name, t, axes, keepdims):
    return getattr(_core, name)(t, None if axes is None else list(axes), keepdims)


# (shape, axes): trailing axes of a contiguous input take the inner path, leading ones the outer path,
# middle ones (and any non-contiguous input) the packed path.
CASES = [
    ((6, 7, 8), None),
    ((6, 7, 8), (2,)),
    ((6, 7, 8), (-1,)),
    ((6, 7, 8), (1, 2)),
    ((6, 7, 8), (0,)),
    ((6, 7, 8), (0, 1)),
    ((6, 7, 8), (-3, -2)),
    ((6, 7, 8), (1,)),
    ((6, 7, 8), (0, 2)),
    ((6, 7, 8), (2, 0)),
    ((6, 7, 8), (0, 1, 2)),
    ((6, 7, 8), ()),
    ((1, 7, 1, 8), (0, 2)),  # size-1 axes: still the outer path
    ((7, 1, 8), (1,)),
    ((5,), (0,)),
    ((5,), None),
    ((3, 33), (1,)),  # runs longer than the 16 lanes, with a tail
    ((33, 3), (0,)),
]


@pytest.mark.parametrize("keepdims", [False, True], ids=["", "keepdims"])
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", NUMERIC, ids=ids(NUMERIC))
@pytest.mark.parametrize("name", REDUCE)
def test_reduce(name, dtype, case, keepdims):
    shape, axes = case
    rng = np.random.default_rng(1)
    x = rand(rng, shape, dtype, -50, 50)
    check_reduce(name, call(name, tensor(x), axes, keepdims), x, axes, keepdims)


@pytest.mark.parametrize("layout", LAYOUTS[1:])
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("name", REDUCE)
def test_reduce_noncontiguous(name, case, layout):
    shape, axes = case
    rng = np.random.default_rng(2)
    for dtype in (np.float32, np.int64):
        x = rand(rng, shape, dtype, -50, 50)
        for keepdims in (False, True):
            check_reduce(name, call(name, make(x, layout), axes, keepdims), x, axes, keepdims)


@pytest.mark.parametrize("name", REDUCE)
def test_reduce_permuted_view_taking_the_inner_path(name):
    # A transposed view whose kept-then-reduced order is row-major: the kernel reads it in place.
    rng = np.random.default_rng(3)
    base = rand(rng, (6, 8, 7), np.float64)
    t = tensor(base).transpose([0, 2, 1])  # shape (6, 7, 8), axis 1 has stride 1
    x = base.transpose(0, 2, 1)
    for keepdims in (False, True):
        check_reduce(name, call(name, t, [1], keepdims), x, (1,), keepdims)
        check_reduce(name, call(name, t, [2], keepdims), x, (2,), keepdims)


@pytest.mark.parametrize("name", REDUCE)
def test_reduce_broadcast_view(name):
    rng = np.random.default_rng(4)
    row = rand(rng, (1, 9), np.float32)
    t = tensor(row).broadcast_to((5, 9))
    x = np.broadcast_to(row, (5, 9))
    for axes in (None, (0,), (1,)):
        check_reduce(name, call(name, t, axes, False), x, axes, False)


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("name", ["max", "min"])
def test_extremes_propagate_nan(name, dtype):
    rng = np.random.default_rng(5)
    x = rand(rng, (5, 37), dtype)
    x[1, 0] = np.nan  # the first element of a run (the lanes' seed)
    x[2, 20] = np.nan  # inside the 16-lane part
    x[3, 36] = np.nan  # in the tail
    for axes in (None, (1,), (0,), (-1,)):
        for layout in ("contiguous", "transposed"):
            check_reduce(name, call(name, make(x, layout), axes, True), x, axes, True)
    # infinities are ordinary values
    y = np.array([[-np.inf, 1.0], [np.inf, -2.0]], dtype)
    for axes in (None, (0,), (1,)):
        check_reduce(name, call(name, tensor(y), axes, False), y, axes, False)


@pytest.mark.parametrize("name", ["sum", "mean"])
@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
def test_sums_propagate_nan_and_inf(name, dtype):
    x = np.array([[1.0, np.nan, 2.0], [np.inf, 1.0, 3.0], [np.inf, -np.inf, 0.0]], dtype)
    for axes in (None, (0,), (1,)):
        check_reduce(name, call(name, tensor(x), axes, False), x, axes, False)


@pytest.mark.parametrize("name", ["sum", "mean"])
def test_reduce_bool(name):
    rng = np.random.default_rng(6)
    x = rand(rng, (4, 6), np.bool_)
    for axes in (None, (0,), (1,)):
        got = call(name, tensor(x), axes, False)
        check_reduce(name, got, x, axes, False)


def test_reduce_large_paths(restore_threads):
    # The split-run path (fewer outputs than threads, long runs), the outer path with threads over columns,
    # and the inner path with threads over outputs; each with two threads and with one.
    rng = np.random.default_rng(7)
    x = rand(rng, (100_003,), np.float32)
    m = rand(rng, (257, 509), np.float64)
    for n in (2, 1):
        _core.set_num_threads(n)
        for name in REDUCE:
            check_reduce(name, call(name, tensor(x), None, False), x, None, False)
            check_reduce(name, call(name, tensor(m), (0,), False), m, (0,), False)
            check_reduce(name, call(name, tensor(m), (1,), False), m, (1,), False)
            check_reduce(name, call(name, make(m, "transposed"), None, True), m, None, True)
    big = rand(rng, (2, 70_001), np.int64, -1000, 1000)
    _core.set_num_threads(2)
    check_reduce("sum", call("sum", tensor(big), (1,), False), big, (1,), False)
    for name in ("max", "min"):  # the split path of max / min: integers, and a nan in one block only
        check_reduce(name, call(name, tensor(big), (1,), False), big, (1,), False)
        for where in (0, 4095, 4096, 50_000, 100_002):
            y = x.copy()
            y[where] = np.nan
            for n in (2, 1):
                _core.set_num_threads(n)
                got = to_np(call(name, tensor(y), None, False))
                assert np.isnan(got), (name, where, n, got)


def test_float16_sum_accumulates_beyond_float16():
    # 4096 ones sum to 4096 exactly; a float16 accumulator would stop at 2048.
    x = np.ones(4096, np.float16)
    assert_same(_core.sum(tensor(x)), np.float16(4096))
    assert_same(_core.sum(tensor(x.reshape(64, 64)), [0]), np.full(64, 64, np.float16))
    assert_same(_core.mean(tensor(x)), np.float16(1))


def test_reduce_empty():
    z = np.zeros((0, 5), np.float32)
    t = tensor(z)
    assert_same(_core.sum(t, [0]), np.zeros(5, np.float32))
    assert_same(_core.sum(t), np.float32(0))
    assert_same(_core.sum(t, [0], True), np.zeros((1, 5), np.float32))
    assert np.isnan(to_np(_core.mean(t, [0]))).all() and to_np(_core.mean(t, [0])).shape == (5,)
    # reducing a non-empty axis of an empty tensor gives an empty result, also for max / min
    for name in REDUCE:
        got = call(name, t, (1,), False)
        assert tuple(got.shape) == (0,)
        got = call(name, t, (1,), True)
        assert tuple(got.shape) == (0, 1)
    assert_same(_core.sum(tensor(np.zeros((2, 0, 3), np.int32)), [1]), np.zeros((2, 3), np.int32))
    for name in ("max", "min"):
        with pytest.raises(ValueError, match=f"{name}: cannot reduce over the empty axis 0"):
            call(name, t, (0,), False)
        with pytest.raises(ValueError, match=f"^{name}: "):
            call(name, t, None, False)


def test_reduce_0d():
    x = np.float64(2.5) * np.ones((), np.float64)
    for name in REDUCE:
        assert_same(call(name, tensor(x), None, False), x)
        assert_same(call(name, tensor(x), None, True), x)
        assert_same(call(name, tensor(x), (), False), x)
        with pytest.raises(IndexError, match=f"{name}: axis 0 is out of range"):
            call(name, tensor(x), (0,), False)


@pytest.mark.parametrize("name", REDUCE)
def test_reduce_errors(name):
    t = tensor(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(IndexError, match=f"{name}: axis 3 is out of range for a tensor with 3 dimensions"):
        call(name, t, (3,), False)
    with pytest.raises(IndexError, match=f"{name}: axis -4 is out of range"):
        call(name, t, (0, -4), False)
    with pytest.raises(ValueError, match=f"{name}: axis -1 repeated"):
        call(name, t, (2, -1), False)


def test_reduce_keyword_names_and_output():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    r = _core.sum(x=tensor(x), axes=[1], keepdims=True)
    assert_same(r, x.sum(axis=1, keepdims=True))
    assert r.is_contiguous()
    # the result owns fresh memory
    t = tensor(x)
    assert not _core.max(t, [0]).shares_storage(t)


# ---------------------------------------------------------------- argmax / argmin

ARG = ["argmax", "argmin"]


def np_arg(name, x, axis, keepdims):
    return getattr(np, name)(x, axis=axis, keepdims=keepdims).astype(np.int64)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", NUMERIC, ids=ids(NUMERIC))
@pytest.mark.parametrize("name", ARG)
def test_arg_reduce(name, dtype, layout):
    rng = np.random.default_rng(10)
    x = rand(rng, (4, 5, 6), dtype, -3, 3)  # few distinct values: many ties
    t = make(x, layout)
    for axis in (None, 0, 1, 2, -1, -3):
        for keepdims in (False, True):
            assert_same(getattr(_core, name)(t, axis, keepdims), np_arg(name, x, axis, keepdims))


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("name", ARG)
def test_arg_reduce_nan_and_ties(name, dtype):
    x = np.array([[1.0, 3.0, 3.0, np.nan, 0.0, np.nan],
                  [np.nan, 5.0, 5.0, 5.0, -1.0, -1.0],
                  [2.0, 2.0, -np.inf, np.inf, np.inf, -np.inf],
                  [0.0, -0.0, 0.0, -0.0, 0.0, 0.0]], dtype)
    for axis in (None, 0, 1):
        assert_same(getattr(_core, name)(tensor(x), axis), np_arg(name, x, axis, False))
    assert _core.argmax(tensor(x)).shape == ()
    assert int(to_np(getattr(_core, name)(tensor(x)))) == 3  # the first nan in flat order


@pytest.mark.parametrize("name", ARG)
def test_arg_reduce_ties_first_index_long_rows(name):
    x = np.zeros((3, 1000), np.int32)
    x[0, [10, 500, 999]] = 7
    x[1, [999]] = -7
    x[2, [0, 999]] = 7
    for axis in (None, 1, 0):
        assert_same(getattr(_core, name)(tensor(x), axis), np_arg(name, x, axis, False))


@pytest.mark.parametrize("name", ARG)
def test_arg_reduce_shapes(name):
    x = np.float32(4) * np.ones((), np.float32)
    assert_same(getattr(_core, name)(tensor(x)), np.int64(0))
    assert_same(getattr(_core, name)(tensor(x), None, True), np.int64(0))
    with pytest.raises(IndexError, match=f"{name}: axis 0 is out of range"):
        getattr(_core, name)(tensor(x), 0)
    e = np.zeros((0, 3), np.float32)
    assert_same(getattr(_core, name)(tensor(e), 1), np.zeros((0,), np.int64))
    assert_same(getattr(_core, name)(tensor(e), 1, True), np.zeros((0, 1), np.int64))
    with pytest.raises(ValueError, match=f"{name}: axis 0 is empty"):
        getattr(_core, name)(tensor(e), 0)
    with pytest.raises(ValueError, match=f"{name}: the tensor is empty"):
        getattr(_core, name)(tensor(e))
    with pytest.raises(TypeError, match=f"{name}: not defined for bool"):
        getattr(_core, name)(tensor(np.array([True, False])))
    with pytest.raises(IndexError, match=f"{name}: axis -3 is out of range"):
        getattr(_core, name)(tensor(np.zeros((2, 2), np.float32)), -3)
    big = np.random.default_rng(11).standard_normal((300, 401)).astype(np.float32)  # parallel over rows
    assert_same(getattr(_core, name)(tensor(big), 1), np_arg(name, big, 1, False))
    assert_same(getattr(_core, name)(make(big, "transposed"), 0), np_arg(name, big, 0, False))


def test_arg_reduce_keywords():
    x = np.array([[1, 9, 3], [7, 2, 8]], np.int64)
    assert_same(_core.argmax(x=tensor(x), axis=1, keepdims=True), np.argmax(x, axis=1, keepdims=True))
    assert_same(_core.argmin(tensor(x), axis=0), np.argmin(x, axis=0))


# ---------------------------------------------------------------- property tests

@st.composite
def shape_and_axes(draw):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5))
    n = len(shape)
    mode = draw(st.sampled_from(["none", "subset"]))
    if mode == "none":
        return shape, None
    chosen = draw(st.lists(st.integers(0, max(n - 1, 0)), unique=True, max_size=n)) if n else []
    # each axis spelled positive or negative, in any order
    axes = [a - n if draw(st.booleans()) else a for a in chosen]
    axes = draw(st.permutations(axes)) if axes else axes
    return shape, tuple(axes)


@settings(max_examples=50, deadline=None)
@given(sa=shape_and_axes(), name=st.sampled_from(REDUCE), keepdims=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64, np.int32, np.float16]), layout=st.sampled_from(LAYOUTS),
       seed=st.integers(0, 2**32 - 1))
def test_property_reduce(sa, name, keepdims, dtype, layout, seed):
    shape, axes = sa
    rng = np.random.default_rng(seed)
    x = rand(rng, shape, dtype, -20, 20)
    t = make(x, layout)
    reduced = range(len(shape)) if axes is None else [a % len(shape) for a in axes]
    if name in ("max", "min") and any(shape[a] == 0 for a in reduced):
        with pytest.raises(ValueError, match=f"{name}: cannot reduce over the empty axis"):
            call(name, t, axes, keepdims)
        return
    check_reduce(name, call(name, t, axes, keepdims), x, axes, keepdims)


@settings(max_examples=50, deadline=None)
@given(shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=6), name=st.sampled_from(ARG),
       keepdims=st.booleans(), layout=st.sampled_from(LAYOUTS), data=st.data())
def test_property_arg_reduce(shape, name, keepdims, layout, data):
    axis = data.draw(st.none() | st.integers(-len(shape), len(shape) - 1))
    seed = data.draw(st.integers(0, 2**32 - 1))
    x = rand(np.random.default_rng(seed), shape, np.float32, -2, 2).round()  # ties
    if data.draw(st.booleans()):
        x.reshape(-1)[data.draw(st.integers(0, x.size - 1))] = np.nan
    assert_same(getattr(_core, name)(make(x, layout), axis, keepdims), np_arg(name, x, axis, keepdims))


def test_float_sums_are_bitwise_independent_of_thread_count(restore_threads):
    rng = np.random.default_rng(11)
    x = tensor(rng.standard_normal(3_000_001).astype(np.float32) * 1000)
    results = []
    for n in (1, 2):
        _core.set_num_threads(n)
        results.append((to_np(_core.sum(x)).tobytes(), to_np(_core.mean(x)).tobytes()))
    assert results[0] == results[1]
