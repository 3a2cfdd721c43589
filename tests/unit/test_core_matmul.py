"""matmul of the C++ core against numpy: 2-D, 1-D promotions, batches with broadcast batch axes, transposed
and other non-contiguous operands, empty dimensions (K = 0, M or N = 0), every numeric dtype, out=."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from singa_lite import _core
from core_testutil import FLOATS, LAYOUTS, NUMERIC, assert_same, ids, make, rand, tensor, to_np

# Float results may differ from a float64 product by rounding in the accumulation (bounded through |a| @ |b|)
# and, for float16, by the final rounding to float16.
TOL = {np.dtype(np.float16): (1e-3, 1e-5), np.dtype(np.float32): (1e-6, 1e-5), np.dtype(np.float64): (1e-15, 1e-13)}


def check_matmul(got, a, b):
    dtype = a.dtype
    if dtype.kind == "i":
        assert_same(got, np.matmul(a, b))
        return
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
    scale = np.matmul(np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))
    expected = exact.astype(dtype)
    g = to_np(got)
    assert g.shape == expected.shape and g.dtype == expected.dtype, (g.shape, expected.shape, g.dtype)
    rtol, factor = TOL[dtype]
    err = np.abs(g.astype(np.float64) - exact)
    bound = rtol * np.abs(exact) + factor * scale + 1e-30
    assert (err <= bound).all(), f"max excess {np.max(err - bound)}"


def operands(rng, sa, sb, dtype):
    if np.dtype(dtype).kind == "i":
        return rand(rng, sa, dtype, -9, 10), rand(rng, sb, dtype, -9, 10)
    return rand(rng, sa, dtype, -1, 1), rand(rng, sb, dtype, -1, 1)


SHAPES = [
    ((3, 4), (4, 5)),
    ((1, 1), (1, 1)),
    ((7, 1), (1, 9)),  # K = 1
    ((1, 8), (8, 1)),
    ((5, 8), (8, 1)),
    ((1, 8), (8, 6)),
    ((33, 65), (65, 17)),
    # 1-D promotions
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((4,), (2, 4, 5)),
    ((2, 3, 4), (4,)),
    # batches, broadcast batch axes
    ((2, 3, 4), (2, 4, 5)),
    ((3, 4), (2, 4, 5)),
    ((2, 3, 4), (4, 5)),
    ((2, 1, 3, 4), (5, 4, 2)),
    ((1, 3, 4), (6, 4, 5)),
    ((6, 1, 3, 4), (1, 2, 4, 5)),
    # empty dimensions
    ((3, 0), (0, 4)),  # K = 0: zeros
    ((0, 4), (4, 5)),
    ((3, 4), (4, 0)),
    ((0, 3, 4), (4, 5)),
    ((2, 3, 0), (2, 0, 5)),
    ((0,), (0,)),
    ((0,), (0, 3)),
]


@pytest.mark.parametrize("dtype", NUMERIC, ids=ids(NUMERIC))
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_matmul_shapes(shapes, dtype):
    rng = np.random.default_rng(1)
    a, b = operands(rng, shapes[0], shapes[1], dtype)
    got = _core.matmul(tensor(a), tensor(b))
    assert tuple(got.shape) == np.matmul(a, b).shape
    check_matmul(got, a, b)


@pytest.mark.parametrize("dtype", NUMERIC, ids=ids(NUMERIC))
@pytest.mark.parametrize("layout_b", LAYOUTS)
@pytest.mark.parametrize("layout_a", LAYOUTS)
def test_matmul_layouts(layout_a, layout_b, dtype):
    rng = np.random.default_rng(2)
    for sa, sb in [((6, 5), (5, 7)), ((2, 6, 5), (2, 5, 7)), ((3, 1, 4, 5), (2, 5, 3)), ((5,), (5, 3)), ((6, 5), (5,))]:
        a, b = operands(rng, sa, sb, dtype)
        check_matmul(_core.matmul(make(a, layout_a), make(b, layout_b)), a, b)


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
def test_matmul_transposed_views(dtype):
    # Transposed operands (strides (1, M)) go to GEMM as a transposition flag; also slices of transposes with a
    # leading dimension larger than the matrix, and batches of transposes.
    rng = np.random.default_rng(3)
    base_a = rand(rng, (9, 12), dtype, -1, 1)  # a = base_a.T[:7] : (7, 9), strides (1, 12)
    base_b = rand(rng, (10, 9), dtype, -1, 1)  # b = base_b.T : (9, 10)
    ta = tensor(base_a).transpose([]).slice(0, 0, 7, 1)
    tb = tensor(base_b).transpose([])
    assert ta.strides == (1, 12) and tb.strides == (1, 9)
    a, b = base_a.T[:7], base_b.T
    check_matmul(_core.matmul(ta, tb), a, b)
    check_matmul(_core.matmul(tb.transpose([]), ta.transpose([])), b.T, a.T)
    bb = rand(rng, (3, 5, 4), dtype, -1, 1)
    tbb = tensor(bb).transpose([0, 2, 1])  # (3, 4, 5)
    check_matmul(_core.matmul(tbb, tensor(bb)), bb.transpose(0, 2, 1), bb)
    check_matmul(_core.matmul(tensor(bb), tbb), bb, bb.transpose(0, 2, 1))


@pytest.mark.parametrize("dtype", NUMERIC, ids=ids(NUMERIC))
def test_matmul_single_row_and_column_views(dtype):
    rng = np.random.default_rng(4)
    base = rand(rng, (6, 12), dtype, -5, 5)
    t = tensor(base)
    row = t.slice(0, 2, 3, 1).slice(1, 0, 12, 3)  # (1, 4), strides (12, 3)
    col = t.slice(1, 5, 6, 1).slice(0, 0, 4, 1)  # (4, 1), strides (12, 1)
    strided = t.slice(1, 0, 12, 3).slice(0, 0, 4, 1)  # (4, 4), strides (12, 3)
    r, c, s = base[2:3, 0:12:3], base[0:4, 5:6], base[0:4, 0:12:3]
    check_matmul(_core.matmul(row, col), r, c)
    check_matmul(_core.matmul(col, row), c, r)
    check_matmul(_core.matmul(row, strided), r, s)
    check_matmul(_core.matmul(strided, col), s, c)
    check_matmul(_core.matmul(strided.transpose([]), strided), s.T, s)


@pytest.mark.parametrize("dtype", NUMERIC, ids=ids(NUMERIC))
def test_matmul_broadcast_views(dtype):
    rng = np.random.default_rng(5)
    row = rand(rng, (1, 6), dtype, -5, 5)
    col = rand(rng, (6, 1), dtype, -5, 5)
    a = tensor(row).broadcast_to((4, 6))  # strides (0, 1)
    b = tensor(col).broadcast_to((6, 3))  # strides (1, 0)
    check_matmul(_core.matmul(a, b), np.broadcast_to(row, (4, 6)), np.broadcast_to(col, (6, 3)))
    m = rand(rng, (6, 3), dtype, -5, 5)
    batch = tensor(m).broadcast_to((5, 6, 3))  # a batch axis of stride 0
    check_matmul(_core.matmul(a, batch), np.broadcast_to(row, (4, 6)), np.broadcast_to(m, (5, 6, 3)))


def test_matmul_float16_accumulates_in_float32():
    # 2048 + 1 + 1 + ... would stay at 2048 with a float16 accumulator.
    a = np.ones((1, 4096), np.float16)
    b = np.ones((4096, 1), np.float16)
    assert_same(_core.matmul(tensor(a), tensor(b)), np.full((1, 1), 4096, np.float16))


def test_matmul_large(restore_threads):
    rng = np.random.default_rng(6)
    a, b = operands(rng, (130, 257), (257, 96), np.float32)
    for n in (2, 1):
        _core.set_num_threads(n)
        check_matmul(_core.matmul(tensor(a), tensor(b)), a, b)
    ai, bi = operands(rng, (40, 70), (70, 30), np.int64)
    check_matmul(_core.matmul(make(ai, "reversed"), make(bi, "transposed")), ai, bi)


# Thin products, the GEMMs of a small convolution (LeNet's first layer: 20 x 25 weights against 64 * 576 columns),
# are cut into pieces OpenBLAS computes without packing (csrc/cpu/matmul.cpp); when the output is too small to
# share, K is cut and the partial products are summed. The pieces depend on the shape only, so one and two
# threads give the same bits, for plain and transposed operands alike.
THIN = [((20, 25), (25, 36864)), ((36864, 25), (25, 20)), ((25, 36864), (36864, 20)), ((20, 36864), (36864, 25))]


@pytest.mark.parametrize("shapes", THIN, ids=lambda s: "x".join(map(str, s[0])) + "@" + "x".join(map(str, s[1])))
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_matmul_thin_products_cut_into_pieces(shapes, dtype, layout, restore_threads):
    a, b = operands(np.random.default_rng(8), *shapes, dtype)
    results = []
    for n in (1, 2):
        _core.set_num_threads(n)
        got = _core.matmul(make(a, layout), make(b, layout))
        check_matmul(got, a, b)
        results.append(to_np(got))
    assert np.array_equal(results[0], results[1])


def test_matmul_out():
    rng = np.random.default_rng(7)
    a, b = operands(rng, (2, 3, 4), (4, 5), np.float64)
    out = tensor(np.zeros((2, 3, 5)))
    r = _core.matmul(tensor(a), tensor(b), out=out)
    assert r.shares_storage(out)
    check_matmul(out, a, b)
    tout = tensor(np.zeros((5, 3))).transpose([])  # a non-contiguous out
    _core.matmul(tensor(a[0]), tensor(b), out=tout)
    check_matmul(tout, a[0], b)
    # out aliasing an input
    sq = rand(rng, (4, 4), np.float64)
    t = tensor(sq)
    _core.matmul(t, t, out=t)
    check_matmul(t, sq, sq)
    v = rand(rng, (4,), np.float64)
    o = tensor(np.zeros(()))
    _core.matmul(tensor(v), tensor(v), out=o)
    check_matmul(o, v, v)
    with pytest.raises(ValueError, match=r"matmul: out has shape \(3, 5\), expected \(2, 3, 5\)"):
        _core.matmul(tensor(a), tensor(b), out=tensor(np.zeros((3, 5))))
    with pytest.raises(TypeError, match="matmul: out has dtype float32, expected float64"):
        _core.matmul(tensor(a), tensor(b), out=tensor(np.zeros((2, 3, 5), np.float32)))


def test_matmul_errors():
    f = tensor(np.ones((3, 4), np.float32))
    with pytest.raises(ValueError, match=r"matmul: inner dimensions differ: \(3, 4\) @ \(3, 4\)"):
        _core.matmul(f, f)
    with pytest.raises(ValueError, match="matmul: inner dimensions differ"):
        _core.matmul(tensor(np.ones(3, np.float32)), tensor(np.ones(4, np.float32)))
    with pytest.raises(ValueError, match="matmul: operands must have at least 1 dimension"):
        _core.matmul(tensor(np.float32(1)), f)
    with pytest.raises(ValueError, match="matmul: shapes .* do not broadcast"):
        _core.matmul(tensor(np.ones((2, 3, 4), np.float32)), tensor(np.ones((3, 4, 5), np.float32)))
    with pytest.raises(TypeError, match="matmul: dtypes differ"):
        _core.matmul(f, tensor(np.ones((4, 2), np.float64)))
    with pytest.raises(TypeError, match="matmul: not defined for bool"):
        _core.matmul(tensor(np.ones((2, 2), np.bool_)), tensor(np.ones((2, 2), np.bool_)))


@settings(max_examples=50, deadline=None)
@given(m=st.integers(0, 6), k=st.integers(0, 6), n=st.integers(0, 6),
       batch_a=st.lists(st.integers(1, 3), max_size=2), batch_b=st.lists(st.integers(1, 3), max_size=2),
       vec_a=st.booleans(), vec_b=st.booleans(), dtype=st.sampled_from([np.float32, np.float64, np.int32]),
       la=st.sampled_from(LAYOUTS), lb=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**32 - 1))
def test_property_matmul(m, k, n, batch_a, batch_b, vec_a, vec_b, dtype, la, lb, seed):
    # make the batch shapes broadcast: where both have an axis, one of the two is 1 or they agree
    ba, bb = list(batch_a), list(batch_b)
    for i in range(1, min(len(ba), len(bb)) + 1):
        if ba[-i] != bb[-i] and 1 not in (ba[-i], bb[-i]):
            bb[-i] = 1
    sa = (k,) if vec_a else tuple(ba) + (m, k)
    sb = (k,) if vec_b else tuple(bb) + (k, n)
    rng = np.random.default_rng(seed)
    a, b = operands(rng, sa, sb, dtype)
    got = _core.matmul(make(a, la), make(b, lb))
    assert tuple(got.shape) == np.matmul(a, b).shape
    check_matmul(got, a, b)
