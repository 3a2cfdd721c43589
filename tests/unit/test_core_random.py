"""Random fills of the C++ core: uniform_ / gaussian_ / bernoulli_ statistics, determinism after
manual_seed, fresh values on each draw, and values independent of the thread count and memory layout."""
from __future__ import annotations

import numpy as np
import pytest

from singa_lite import _core
from core_testutil import ALL, CPU, FLOATS, assert_same, ids, tensor, to_np

N = 200_000


def fresh(shape, dtype):
    return tensor(np.zeros(shape, dtype))


def draw(op, shape, dtype, *args):
    t = fresh(shape, dtype)
    getattr(_core, op)(t, *args)
    return to_np(t)


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("low,high", [(0.0, 1.0), (-3.0, 5.0), (2.0, 2.0)])
def test_uniform_statistics(dtype, low, high):
    _core.manual_seed(CPU, 1)
    x = draw("uniform_", (N,), dtype, low, high).astype(np.float64)
    assert x.min() >= low
    assert x.max() < high or low == high  # half-open even where rounding to float16 would reach high
    width = high - low
    if width == 0:
        assert (x == low).all()
        return
    assert abs(x.mean() - (low + high) / 2) < 5 * width / np.sqrt(12 * N)
    assert abs(x.var() - width ** 2 / 12) < 0.01 * width ** 2
    counts, _ = np.histogram(x, bins=10, range=(low, high))
    assert (np.abs(counts - N / 10) < 6 * np.sqrt(N / 10)).all(), counts
    assert len(np.unique(x)) > min(1000, N // 10)


def test_uniform_defaults_and_keywords():
    t = fresh((1000,), np.float32)
    _core.uniform_(t)
    x = to_np(t)
    assert 0 <= x.min() and x.max() < 1
    _core.uniform_(t=t, low=10.0, high=11.0)
    x = to_np(t)
    assert 10 <= x.min() and x.max() < 11


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("mean,std", [(0.0, 1.0), (3.0, 0.5)])
def test_gaussian_statistics(dtype, mean, std):
    _core.manual_seed(CPU, 2)
    x = draw("gaussian_", (N,), dtype, mean, std).astype(np.float64)
    assert np.isfinite(x).all()
    z = (x - mean) / std
    tol = 2e-3 if np.dtype(dtype) == np.float16 else 0.0  # float16 rounding of the values
    assert abs(z.mean()) < 5 / np.sqrt(N) + tol
    assert abs(z.std() - 1) < 0.01
    assert abs(np.mean(np.abs(z) < 1) - 0.6827) < 0.006
    assert abs(np.mean(np.abs(z) < 2) - 0.9545) < 0.004
    assert abs(np.mean(z ** 3)) < 0.05  # skewness
    assert abs(np.mean(z ** 4) - 3) < 0.1  # kurtosis
    # Box-Muller pairs: even and odd elements (cos and sin halves) are both standard normal
    assert abs(z[0::2].std() - 1) < 0.015 and abs(z[1::2].std() - 1) < 0.015


def test_gaussian_zero_std():
    x = draw("gaussian_", (100,), np.float64, 1.5, 0.0)
    assert (x == 1.5).all()


@pytest.mark.parametrize("dtype", ALL, ids=ids(ALL))
def test_bernoulli(dtype):
    _core.manual_seed(CPU, 3)
    for p in (0.0, 0.3, 0.5, 1.0):
        x = draw("bernoulli_", (N,), dtype, p)
        values = np.unique(x.astype(np.float64))
        assert set(values) <= {0.0, 1.0}
        m = x.astype(np.float64).mean()
        assert abs(m - p) < 5 * np.sqrt(p * (1 - p) / N) + 1e-12
    t = fresh((1000,), dtype)
    _core.bernoulli_(t)  # default p = 0.5
    assert 0.35 < to_np(t).astype(np.float64).mean() < 0.65


OPS = [("uniform_", (-1.0, 2.0)), ("gaussian_", (0.5, 2.0)), ("bernoulli_", (0.25,))]


@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("op,args", OPS, ids=[o for o, _ in OPS])
def test_seed_determinism_and_fresh_draws(op, args, dtype):
    _core.manual_seed(CPU, 1234)
    assert _core.current_seed(CPU) == 1234
    a1 = draw(op, (1001,), dtype, *args)
    a2 = draw(op, (1001,), dtype, *args)
    _core.manual_seed(CPU, 1234)
    b1 = draw(op, (1001,), dtype, *args)
    b2 = draw(op, (1001,), dtype, *args)
    assert_same(a1, b1)
    assert_same(a2, b2)
    assert not np.array_equal(a1, a2)  # consecutive draws differ
    _core.manual_seed(CPU, 1235)
    c1 = draw(op, (1001,), dtype, *args)
    assert not np.array_equal(a1, c1)  # another seed, other values
    # the seed is 64 bits wide: seeds differing only in the high word give other values too
    _core.manual_seed(CPU, 1234 + (1 << 40))
    assert _core.current_seed(CPU) == 1234 + (1 << 40)
    assert not np.array_equal(a1, draw(op, (1001,), dtype, *args))


# uniform_ and gaussian_ take floating tensors, bernoulli_ any dtype
THREAD_CASES = [(op, args, d) for op, args in OPS for d in (ALL if op == "bernoulli_" else FLOATS)]


@pytest.mark.parametrize("op,args,dtype", THREAD_CASES, ids=[f"{o}-{np.dtype(d).name}" for o, _, d in THREAD_CASES])
def test_independent_of_thread_count(op, args, dtype, restore_threads):
    n = 100_003  # big enough for several threads, odd so chunks end inside a counter's group of values
    results = []
    for threads in (1, 2, 1):
        _core.set_num_threads(threads)
        assert _core.get_num_threads() == threads
        _core.manual_seed(CPU, 99)
        first = draw(op, (n,), dtype, *args)
        second = draw(op, (7, 3), dtype, *args)
        results.append((first, second))
    for first, second in results[1:]:
        assert_same(first, results[0][0])
        assert_same(second, results[0][1])


@pytest.mark.parametrize("op,args", OPS, ids=[o for o, _ in OPS])
def test_noncontiguous_target(op, args):
    # A view gets the values a contiguous tensor of its shape would get, in its logical order, and the
    # elements outside the view are untouched.
    _core.manual_seed(CPU, 7)
    expected = draw(op, (5, 6), np.float32, *args)
    base = np.full((6, 5), -100.0, np.float32)
    tb = tensor(base)
    _core.manual_seed(CPU, 7)
    getattr(_core, op)(tb.transpose([]), *args)
    assert_same(to_np(tb).T, expected)
    big = np.full((5, 13), -100.0, np.float32)
    tbig = tensor(big)
    _core.manual_seed(CPU, 7)
    getattr(_core, op)(tbig.slice(1, 12, -100, -2), *args)  # columns 12, 10, ..., 2, 0
    got = to_np(tbig)
    _core.manual_seed(CPU, 7)
    assert_same(got[:, 12::-2], draw(op, (5, 7), np.float32, *args))
    assert (got[:, 11::-2] == -100).all()


def test_empty_and_0d():
    for op, args in OPS:
        getattr(_core, op)(fresh((0, 4), np.float32), *args)
        t = fresh((), np.float64)
        getattr(_core, op)(t, *args)
        assert to_np(t).shape == ()


def test_random_errors():
    f = fresh((3,), np.float32)
    i = fresh((3,), np.int32)
    with pytest.raises(ValueError, match="uniform: expected finite low <= high"):
        _core.uniform_(f, 2.0, 1.0)
    with pytest.raises(ValueError, match="uniform: expected finite"):
        _core.uniform_(f, 0.0, np.inf)
    with pytest.raises(TypeError, match="uniform: expected a floating dtype"):
        _core.uniform_(i, 0.0, 1.0)
    with pytest.raises(ValueError, match="gaussian: expected finite mean and std >= 0"):
        _core.gaussian_(f, 0.0, -1.0)
    with pytest.raises(ValueError, match="gaussian: expected finite mean"):
        _core.gaussian_(f, np.nan, 1.0)
    with pytest.raises(TypeError, match="gaussian: expected a floating dtype"):
        _core.gaussian_(tensor(np.zeros(3, np.int64)), 0.0, 1.0)
    with pytest.raises(ValueError, match=r"bernoulli: p must lie in \[0, 1\]"):
        _core.bernoulli_(f, 1.5)
    with pytest.raises(ValueError, match="bernoulli: p must lie"):
        _core.bernoulli_(f, np.nan)
    with pytest.raises(ValueError, match="set_num_threads: expected n >= 1"):
        _core.set_num_threads(0)


def test_uniform_float16_never_returns_high():
    # 1024 values map [0, 1) onto float16: without care, rounding reaches 1.0 for about 1 in 4000 draws.
    _core.manual_seed(CPU, 3)
    x = draw("uniform_", (1_000_000,), np.float16, 0.0, 1.0)
    assert x.max() < 1.0 and x.max() == np.float16(1.0) - np.spacing(np.float16(0.5))


@pytest.mark.parametrize("n", [3, 64, 65, 130, 100_003])
@pytest.mark.parametrize("p", [0.0, 0.1234567, 0.5, 0.9, 1.0])
def test_bernoulli_float32_blocks_equal_the_element_loop(n, p, restore_threads):
    # float32 draws run Philox on 16 counters at once (cpu/bernoulli_fast.cpp); float16 keeps the element-by-element
    # loop on the same u24 words: the two must agree element for element, tails and second draws (offsets)
    # included, on any thread count.
    for threads in (1, 2):
        _core.set_num_threads(threads)
        got = []
        for dtype in (np.float32, np.float16):
            _core.manual_seed(CPU, 7)
            draw("bernoulli_", (n,), dtype, p)  # the second draw starts at a later counter
            got.append(draw("bernoulli_", (n,), dtype, p).astype(np.float32))
        np.testing.assert_array_equal(got[0], got[1])
