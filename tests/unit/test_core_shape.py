"""Shape ops of the C++ core against numpy: concat, stack, split, split_sections (views), one_hot."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from singa_lite import _core
from core_testutil import ALL, CPU, DT, LAYOUTS, NP_TO_DT, assert_same, ids, make, rand, tensor, to_np


# ---------------------------------------------------------------- concat / stack

@pytest.mark.parametrize("dtype", ALL, ids=ids(ALL))
def test_concat(dtype):
    rng = np.random.default_rng(1)
    for shapes, axis in [([(2, 3), (4, 3)], 0), ([(2, 3), (2, 1), (2, 5)], 1), ([(2, 3), (2, 5)], -1),
                         ([(3, 0, 2), (3, 4, 2), (3, 0, 2)], 1), ([(0, 2), (0, 2)], 0), ([(5,)], 0),
                         ([(1, 2, 3), (2, 2, 3), (3, 2, 3)], -3), ([(2, 0), (2, 0)], 1)]:
        xs = [rand(rng, s, dtype) for s in shapes]
        for layout in LAYOUTS:
            got = _core.concat([make(x, layout) for x in xs], axis)
            assert_same(got, np.concatenate(xs, axis=axis))
            assert got.is_contiguous()


@pytest.mark.parametrize("dtype", ALL, ids=ids(ALL))
def test_stack(dtype):
    rng = np.random.default_rng(2)
    for shape in [(2, 3), (4,), (), (0, 2)]:
        xs = [rand(rng, shape, dtype) for _ in range(3)]
        for axis in range(-len(shape) - 1, len(shape) + 1):
            for layout in ("contiguous", "reversed"):
                got = _core.stack([make(x, layout) for x in xs], axis)
                assert_same(got, np.stack(xs, axis=axis))


def test_concat_stack_broadcast_view_inputs_and_keywords():
    row = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = tensor(row).broadcast_to((3, 4))
    assert_same(_core.concat(xs=[b, tensor(row)], axis=0), np.concatenate([np.broadcast_to(row, (3, 4)), row]))
    assert_same(_core.stack([b, b], axis=1), np.stack([np.broadcast_to(row, (3, 4))] * 2, axis=1))
    assert_same(_core.concat([tensor(row)]), row)  # the default axis is 0
    # the result is a copy
    t = tensor(row)
    assert not _core.concat([t]).shares_storage(t)


def test_concat_stack_errors():
    f = tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="concat: needs at least one tensor"):
        _core.concat([], 0)
    with pytest.raises(ValueError, match="stack: needs at least one tensor"):
        _core.stack([], 0)
    with pytest.raises(TypeError, match="concat: dtypes differ"):
        _core.concat([f, tensor(np.zeros((2, 3), np.float64))], 0)
    with pytest.raises(ValueError, match=r"concat: input 1 has shape \(2, 4\), which differs"):
        _core.concat([f, tensor(np.zeros((2, 4), np.float32))], 0)
    with pytest.raises(ValueError, match="concat: input 1 has 1 dimensions"):
        _core.concat([f, tensor(np.zeros((3,), np.float32))], 0)
    with pytest.raises(ValueError, match="concat: zero-dimensional"):
        _core.concat([tensor(np.float32(1))], 0)
    with pytest.raises(IndexError, match="concat: axis 2 is out of range"):
        _core.concat([f, f], 2)
    with pytest.raises(IndexError, match="concat: axis -3 is out of range"):
        _core.concat([f, f], -3)
    with pytest.raises(ValueError, match=r"stack: input 1 has shape \(3, 2\)"):
        _core.stack([f, tensor(np.zeros((3, 2), np.float32))], 0)
    with pytest.raises(IndexError, match="stack: axis 3 is out of range"):
        _core.stack([f, f], 3)
    with pytest.raises(TypeError, match="concat: dtypes differ"):  # stack's checks are concat's
        _core.stack([f, tensor(np.zeros((2, 3), np.int32))], 0)


# ---------------------------------------------------------------- split

def test_split_views_share_storage():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    t = tensor(x)
    parts = _core.split(t, [1, 0, 2, 3], 1)
    for p, e in zip(parts, np.split(x, [1, 1, 3], axis=1)):
        assert p.shares_storage(t)
        assert_same(p, e)
    # writing through a part changes the whole
    _core.fill_(parts[2], -1.0)
    x2 = x.copy()
    x2[:, 1:3] = -1
    assert_same(t, x2)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_split_noncontiguous(layout):
    rng = np.random.default_rng(3)
    x = rand(rng, (6, 4, 5), np.int64)
    t = make(x, layout)
    for axis, sizes in [(0, [2, 4]), (1, [1, 1, 2]), (-1, [5]), (2, [0, 5, 0]), (0, [1, 1, 1, 1, 1, 1])]:
        parts = _core.split(t, sizes, axis)
        cuts = np.cumsum(sizes)[:-1]
        for p, e in zip(parts, np.split(x, cuts, axis=axis)):
            assert p.shares_storage(t)
            assert_same(p, e)
    for sections, axis in [(3, 0), (2, 1), (1, 2), (5, -1), (6, 0)]:
        parts = _core.split_sections(t, sections, axis)
        assert len(parts) == sections
        for p, e in zip(parts, np.split(x, sections, axis=axis)):
            assert p.shares_storage(t)
            assert_same(p, e)


def test_split_empty_and_keywords():
    t = tensor(np.zeros((0, 3), np.float32))
    parts = _core.split_sections(t, 2, 0)
    assert [tuple(p.shape) for p in parts] == [(0, 3), (0, 3)]
    parts = _core.split(x=tensor(np.arange(6)), sizes=[2, 4])
    assert_same(parts[1], np.arange(2, 6))
    assert _core.split(tensor(np.zeros((0, 2))), [], 0) == []  # no sizes for an empty axis: no parts


def test_split_errors():
    t = tensor(np.zeros((4, 6), np.float32))
    with pytest.raises(ValueError, match=r"split: sizes \(1, 2\) add up to 3 but axis 1 has size 6"):
        _core.split(t, [1, 2], 1)
    with pytest.raises(ValueError, match="split: sizes must be >= 0"):
        _core.split(t, [7, -1], 1)
    with pytest.raises(ValueError, match="split: sizes .* add up to 0"):
        _core.split(t, [], 0)
    with pytest.raises(IndexError, match="split: axis 2 is out of range"):
        _core.split(t, [4], 2)
    with pytest.raises(ValueError, match="split: axis 1 of size 6 does not divide into 4 equal sections"):
        _core.split_sections(t, 4, 1)
    with pytest.raises(ValueError, match="split: the number of sections must be > 0"):
        _core.split_sections(t, 0, 0)
    with pytest.raises(IndexError, match="split: axis -3 is out of range"):
        _core.split_sections(t, 2, -3)


def test_sizes_whose_sum_overflows_are_refused():
    # Found by UBSan (tools/sanitize.sh): split's sum of sizes wrapped around, so sizes adding up to 2**64
    # matched an empty axis and three "parts" came back; concat of empty tensors with huge sizes overflowed.
    big = 2 ** 63 - 1
    with pytest.raises(ValueError, match=r"split: sizes .* add up to more than 2\*\*63 - 1"):
        _core.split(tensor(np.zeros(0, np.float32)), [big, big, 2], 0)
    empty = _core.Tensor([2 ** 62, 0], DT.float32, CPU)
    with pytest.raises(ValueError, match=r"concat: the sizes along axis 0 add up to more than 2\*\*63 - 1"):
        _core.concat([empty, empty], 0)
    assert _core.concat([empty, empty], 1).shape == (2 ** 62, 0)


# ---------------------------------------------------------------- one_hot

def np_one_hot(idx, depth, dtype):
    return (np.asarray(idx)[..., None] == np.arange(depth)).astype(dtype)


@pytest.mark.parametrize("out_dtype", ALL, ids=ids(ALL))
@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64], ids=["int32", "int64"])
def test_one_hot(idx_dtype, out_dtype):
    rng = np.random.default_rng(4)
    for shape in [(7,), (3, 4), (), (2, 0), (0,)]:
        idx = rng.integers(0, 5, shape).astype(idx_dtype)
        for layout in ("contiguous", "transposed", "reversed"):
            got = _core.one_hot(make(idx, layout), 5, NP_TO_DT[np.dtype(out_dtype)])
            assert_same(got, np_one_hot(idx, 5, out_dtype))


def test_one_hot_default_dtype_and_large():
    idx = np.random.default_rng(5).integers(0, 10, 100_000)
    got = _core.one_hot(tensor(idx), 10)
    assert got.dtype == DT.float32
    assert_same(got, np_one_hot(idx, 10, np.float32))
    assert_same(_core.one_hot(indices=tensor(np.array([0])), depth=1, dtype=DT.int64), np.ones((1, 1), np.int64))


def test_one_hot_errors():
    for bad in ([0, 3], [-1, 0], [2, 5]):
        with pytest.raises(IndexError, match=r"one_hot: indices must lie in \[0, 3\)"):
            _core.one_hot(tensor(np.array(bad, np.int64)), 3)
    with pytest.raises(IndexError, match="one_hot"):
        _core.one_hot(tensor(np.array(-1, np.int32)), 3)
    with pytest.raises(TypeError, match="one_hot: indices must be int32 or int64, got float32"):
        _core.one_hot(tensor(np.array([0.0], np.float32)), 3)
    with pytest.raises(TypeError, match="one_hot: indices must be int32 or int64, got bool"):
        _core.one_hot(tensor(np.array([True])), 3)
    with pytest.raises(ValueError, match="one_hot: depth must be > 0"):
        _core.one_hot(tensor(np.array([0])), 0)


@settings(max_examples=50, deadline=None)
@given(shapes=st.lists(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=3), min_size=1, max_size=4),
       data=st.data())
def test_property_concat_then_split_roundtrip(shapes, data):
    # concatenate tensors that agree outside one axis, then split them back
    ndim = len(shapes[0])
    axis = data.draw(st.integers(-ndim, ndim - 1))
    base = list(shapes[0])
    xs = []
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    for s in shapes:
        shp = list(base)
        shp[axis] = s[0]
        xs.append(rand(rng, shp, np.float32))
    layouts = [data.draw(st.sampled_from(LAYOUTS)) for _ in xs]
    got = _core.concat([make(x, lay) for x, lay in zip(xs, layouts)], axis)
    expected = np.concatenate(xs, axis=axis)
    assert_same(got, expected)
    parts = _core.split(got, [x.shape[axis] for x in xs], axis)
    for p, x in zip(parts, xs):
        assert_same(p, x)
        assert p.shares_storage(got)
    assert to_np(got).shape == expected.shape
