"""Element-wise ops of the C++ core against numpy: binary (tensor-tensor and tensor-scalar), unary,
clip, axpy_, fill_, arange; dtypes, broadcasting edge cases, non-contiguous inputs, out= and in-place."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from singa_lite import _core
from core_testutil import (ALL, CPU, DT, FLOATS, INTS, LAYOUTS, NP_TO_DT, NUMERIC, assert_close, assert_same, ids,
                           make, rand, tensor, to_np, with_specials)

# ---------------------------------------------------------------- references

ARITH = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "relu_grad"]
COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]
BINARY = ARITH + COMPARE

_NP_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "pow": np.power, "maximum": np.maximum,
              "minimum": np.minimum, "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
              "gt": np.greater, "ge": np.greater_equal}


def np_binary(name, a, b):
    """numpy's result; integer division is floor division (numpy's //), as the core documents."""
    with np.errstate(all="ignore"):
        if name == "relu_grad":  # ReLU's backward: sign(a) * b (for bools, a and b)
            a, b = np.asarray(a), np.asarray(b)
            return a & b if a.dtype == np.bool_ else (np.sign(a) * b).astype(np.result_type(a, b))
        if name == "div":
            return np.floor_divide(a, b) if np.asarray(a).dtype.kind == "i" else np.divide(a, b)
        return _NP_BINARY[name](a, b)


# float pow goes through std::pow / numpy's pow: both faithful, not necessarily the same last bit.
POW_RTOL = {np.dtype(np.float16): 1e-3, np.dtype(np.float32): 2e-6, np.dtype(np.float64): 1e-14}


def check_binary_result(name, got, expected):
    if name == "pow" and expected.dtype.kind == "f":
        assert_close(got, expected, rtol=POW_RTOL[expected.dtype])
    else:
        assert_same(got, expected)


def binary_operands(rng, name, shape_a, shape_b, dtype):
    """Random operands valid for the op: small integers (no overflow), non-negative integer exponents,
    and for floats a sprinkling of 0, -0, inf, -inf and nan."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        a = with_specials(rng, rand(rng, shape_a, dtype))
        b = with_specials(rng, rand(rng, shape_b, dtype))
        if name in ("eq", "ne", "le", "ge") and a.size and b.size:  # make some elements equal
            bb = np.broadcast_to(b, np.broadcast_shapes(a.shape, b.shape))
            if bb.shape == a.shape:
                mask = rng.random(a.shape) < 0.3
                a = np.where(mask, bb, a).astype(dtype)
        return a, b
    if dtype.kind == "b":
        return rand(rng, shape_a, dtype), rand(rng, shape_b, dtype)
    if name == "pow":
        return rand(rng, shape_a, dtype, -5, 6), rand(rng, shape_b, dtype, 0, 7)
    return rand(rng, shape_a, dtype, -9, 10), rand(rng, shape_b, dtype, -9, 10)  # includes 0 divisors


# ---------------------------------------------------------------- binary, tensor-tensor

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", NUMERIC, ids=ids(NUMERIC))
@pytest.mark.parametrize("name", BINARY)
def test_binary_dtypes_and_layouts(name, dtype, layout):
    rng = np.random.default_rng(1)
    a, b = binary_operands(rng, name, (3, 4, 5), (3, 4, 5), dtype)
    ta, tb = make(a, layout), make(b, layout)
    got = getattr(_core, name)(ta, tb)
    assert got.is_contiguous()
    check_binary_result(name, got, np_binary(name, a, b))
    # the inputs are untouched
    assert_same(ta, a)
    assert_same(tb, b)


@pytest.mark.parametrize("name", BINARY)
def test_binary_mixed_layouts(name):
    rng = np.random.default_rng(2)
    a, b = binary_operands(rng, name, (4, 6), (4, 6), np.float32)
    for la in LAYOUTS:
        for lb in LAYOUTS:
            check_binary_result(name, getattr(_core, name)(make(a, la), make(b, lb)), np_binary(name, a, b))


BROADCAST_PAIRS = [
    ((), ()),
    ((), (3,)),
    ((4,), ()),
    ((1,), (5,)),
    ((4, 1), (1, 5)),
    ((2, 3, 4), (4,)),
    ((4,), (2, 3, 4)),
    ((2, 1, 4), (3, 1)),
    ((1, 1, 1), (2, 3)),
    ((5, 1, 1), (1,)),
    ((2, 1, 3, 1), (1, 4, 1, 5)),
    ((0,), (1,)),
    ((0,), ()),
    ((1,), (0,)),
    ((0, 3), (3,)),
    ((2, 0, 3), (1, 1, 3)),
    ((3, 0), (3, 1)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16], ids=ids([np.float32, np.int64, np.float16]))
@pytest.mark.parametrize("shapes", BROADCAST_PAIRS, ids=str)
@pytest.mark.parametrize("name", BINARY)
def test_binary_broadcasting(name, shapes, dtype):
    rng = np.random.default_rng(3)
    a, b = binary_operands(rng, name, shapes[0], shapes[1], dtype)
    got = getattr(_core, name)(tensor(a), tensor(b))
    check_binary_result(name, got, np_binary(name, a, b))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_binary_broadcast_with_noncontiguous(layout):
    rng = np.random.default_rng(4)
    a = rand(rng, (3, 1, 5), np.float64)
    b = rand(rng, (4, 1), np.float64)
    assert_same(_core.sub(make(a, layout), make(b, layout)), a - b)
    assert_same(_core.sub(make(b, layout), make(a, layout)), b - a)


def test_binary_broadcast_views_as_inputs():
    rng = np.random.default_rng(5)
    row = rand(rng, (1, 5), np.float32)
    col = rand(rng, (4, 1), np.float32)
    tr = tensor(row).broadcast_to((4, 5))
    tc = tensor(col).broadcast_to((4, 5))
    assert tr.strides == (0, 1) and tc.strides == (1, 0)
    assert_same(_core.mul(tr, tc), row * col)
    assert_same(_core.maximum(tr, tensor(col)), np.maximum(row, col))
    # a broadcast 0-d value
    s = tensor(np.float32(2.5)).broadcast_to((4, 5))
    assert s.strides == (0, 0)
    assert_same(_core.add(s, tc), np.float32(2.5) + col * np.ones((4, 5), np.float32))


@pytest.mark.parametrize("name", COMPARE)
def test_comparisons_on_bool(name):
    rng = np.random.default_rng(6)
    a, b = rand(rng, (7, 3), np.bool_), rand(rng, (3,), np.bool_)
    assert_same(getattr(_core, name)(tensor(a), tensor(b)), np_binary(name, a, b))


def test_binary_special_values_exact():
    nan, inf = np.nan, np.inf
    a = np.array([nan, 1.0, nan, inf, -inf, 0.0, -0.0, 3.0], np.float32)
    b = np.array([1.0, nan, nan, -inf, -inf, -0.0, 0.0, 3.0], np.float32)
    for name in BINARY:
        check_binary_result(name, getattr(_core, name)(tensor(a), tensor(b)), np_binary(name, a, b))


@pytest.mark.parametrize("dtype", INTS, ids=ids(INTS))
def test_integer_division_floors_and_edge_cases(dtype):
    info = np.iinfo(dtype)
    a = np.array([7, -7, 7, -7, 0, 5, -5, info.min, info.min, info.max, 3], dtype)
    b = np.array([2, 2, -2, -2, 3, 0, 0, -1, 1, -1, 7], dtype)
    assert_same(_core.div(tensor(a), tensor(b)), np_binary("div", a, b))


@pytest.mark.parametrize("dtype", INTS, ids=ids(INTS))
def test_integer_pow(dtype):
    a = np.array([2, -3, 0, 1, -1, 5, 0, 7], dtype)
    b = np.array([10, 3, 0, 9, 7, 0, 5, 2], dtype)
    assert_same(_core.pow(tensor(a), tensor(b)), np.power(a, b))
    big = np.array([3, -3, 7], dtype)  # overflow wraps, as numpy
    exps = np.array([41, 41, 40], dtype)
    assert_same(_core.pow(tensor(big), tensor(exps)), np.power(big, exps))


@pytest.mark.parametrize("dtype", INTS, ids=ids(INTS))
def test_integer_pow_rejects_negative_exponents(dtype):
    a = np.array([2, 3], dtype)
    with pytest.raises(ValueError, match="pow: integers to negative integer powers"):
        _core.pow(tensor(a), tensor(np.array([1, -1], dtype)))
    with pytest.raises(ValueError, match="pow: integers to negative"):
        _core.pow_scalar(tensor(a), -2.0)
    with pytest.raises(ValueError, match="pow: integers to negative"):
        _core.pow_scalar(tensor(np.array([1, -1], dtype)), 2.0, scalar_first=True)
    assert_same(_core.pow_scalar(tensor(a), 2.0, scalar_first=True), np.power(dtype(2), a))


@pytest.mark.parametrize("dtype", INTS, ids=ids(INTS))
def test_integer_neg_abs_of_min_wrap_like_numpy(dtype):
    a = np.array([np.iinfo(dtype).min, -1, 0, 1], dtype)
    with np.errstate(over="ignore"):
        assert_same(_core.neg(tensor(a)), np.negative(a))
        assert_same(_core.abs(tensor(a)), np.abs(a))


@pytest.mark.parametrize("dtype", INTS, ids=ids(INTS))
def test_integer_add_sub_mul_square_axpy_wrap_like_numpy(dtype):
    # Found by UBSan (tools/sanitize.sh): these overflowed in the signed type (undefined behaviour); they now
    # wrap in the unsigned type, which gives numpy's bits.
    info = np.iinfo(dtype)
    a = np.array([info.max, info.min, info.max, info.min, 3], dtype)
    b = np.array([1, -1, info.max, info.min, 4], dtype)
    with np.errstate(over="ignore"):
        assert_same(_core.add(tensor(a), tensor(b)), a + b)
        assert_same(_core.sub(tensor(a), tensor(-b)), a - (-b))
        assert_same(_core.mul(tensor(a), tensor(b)), a * b)
        assert_same(_core.square(tensor(a)), a * a)
        y = a.copy()
        _core.axpy_(3.0, tensor(b), y_t := tensor(y))
        assert_same(y_t, a + dtype(3) * b)


def test_binary_large_parallel():
    # Big enough for the OpenMP split (chunks of whole 64-element blocks); odd sizes leave a ragged tail.
    rng = np.random.default_rng(7)
    a = rand(rng, (301, 1001), np.float32)
    b = rand(rng, (1001,), np.float32)
    assert_same(_core.add(tensor(a), tensor(b)), a + b)
    assert_same(_core.mul(make(a, "transposed"), tensor(b)), a * b)
    assert_same(_core.lt(make(a, "reversed"), tensor(b)), a < b)


# ---------------------------------------------------------------- out= and in place

@pytest.mark.parametrize("name", BINARY)
def test_binary_out_fresh(name):
    rng = np.random.default_rng(8)
    a, b = binary_operands(rng, name, (3, 4), (4,), np.float64)
    expected = np_binary(name, a, b)
    out = tensor(np.zeros((3, 4), expected.dtype))
    r = getattr(_core, name)(tensor(a), tensor(b), out=out)
    assert r.shares_storage(out) and r.data_ptr == out.data_ptr
    check_binary_result(name, out, expected)


@pytest.mark.parametrize("name", ARITH)
def test_binary_in_place_out_is_lhs(name):
    rng = np.random.default_rng(9)
    a, b = binary_operands(rng, name, (5, 6), (6,), np.float32)
    ta = tensor(a)
    r = getattr(_core, name)(ta, tensor(b), out=ta)
    assert r.shares_storage(ta)
    check_binary_result(name, ta, np_binary(name, a, b))


@pytest.mark.parametrize("name", ARITH)
def test_binary_in_place_out_is_rhs(name):
    rng = np.random.default_rng(10)
    a, b = binary_operands(rng, name, (6,), (5, 6), np.float32)
    tb = tensor(b)
    getattr(_core, name)(tensor(a), tb, out=tb)
    check_binary_result(name, tb, np_binary(name, a, b))


@pytest.mark.parametrize("name", ["add", "sub", "maximum"])
def test_binary_in_place_both_operands_same(name):
    rng = np.random.default_rng(11)
    a = rand(rng, (4, 5), np.float32)
    ta = tensor(a)
    getattr(_core, name)(ta, ta, out=ta)
    assert_same(ta, np_binary(name, a, a))


@pytest.mark.parametrize("name", ["sub", "div", "pow"])
def test_binary_out_overlapping_transposed_input(name):
    # out is the transpose of an input: they share memory but not element positions, so the op must not
    # read elements it has already overwritten.
    rng = np.random.default_rng(12)
    a = rand(rng, (6, 6), np.float64, 0.5, 3)
    b = rand(rng, (6, 6), np.float64, 0.5, 3)
    ta = tensor(a)
    out = ta.transpose([])
    getattr(_core, name)(ta, tensor(b), out=out)
    check_binary_result(name, out, np_binary(name, a, b))
    check_binary_result(name, ta, np_binary(name, a, b).T)


def test_binary_out_shifted_overlap():
    base = np.arange(10, dtype=np.float32)
    t = tensor(base)
    src = t.slice(0, 0, 9, 1)  # elements 0..8
    dst = t.slice(0, 1, 10, 1)  # elements 1..9
    _core.add(src, tensor(np.ones(9, np.float32)), out=dst)
    assert_same(t, np.concatenate([[0], np.arange(9) + 1]).astype(np.float32))
    # and in the other direction
    t = tensor(base)
    _core.mul(t.slice(0, 1, 10, 1), tensor(np.float32(2)), out=t.slice(0, 0, 9, 1))
    assert_same(t, np.concatenate([np.arange(1, 10) * 2, [9]]).astype(np.float32))


def test_binary_out_noncontiguous():
    rng = np.random.default_rng(13)
    a, b = rand(rng, (3, 4), np.float32), rand(rng, (3, 4), np.float32)
    base = np.full((4, 3), np.nan, np.float32)
    out = tensor(base).transpose([])
    _core.mul(tensor(a), tensor(b), out=out)
    assert_same(out, a * b)
    strided = np.full((3, 9), -1.0, np.float32)
    tout = tensor(strided)
    _core.add(tensor(a), tensor(b), out=tout.slice(1, 8, 0, -2))  # columns 8, 6, 4, 2
    res = to_np(tout)
    assert_same(res[:, 8:0:-2], a + b)
    assert (res[:, [0, 1, 3, 5, 7]] == -1).all()


def test_binary_out_of_comparison_is_bool():
    a = np.array([1.0, 2.0, 3.0], np.float32)
    out = tensor(np.zeros(3, np.bool_))
    _core.lt(tensor(a), tensor(np.float32(2)), out=out)
    assert_same(out, a < 2)
    with pytest.raises(TypeError, match="lt: out has dtype float32, expected bool"):
        _core.lt(tensor(a), tensor(a), out=tensor(a))


def test_binary_out_errors():
    a = tensor(np.ones((3, 4), np.float32))
    with pytest.raises(ValueError, match=r"add: out has shape \(4, 3\), expected \(3, 4\)"):
        _core.add(a, a, out=tensor(np.zeros((4, 3), np.float32)))
    with pytest.raises(ValueError, match="mul: out has shape"):
        _core.mul(a, tensor(np.ones((2, 1, 4), np.float32)), out=a)  # result (2, 3, 4) does not fit a
    with pytest.raises(TypeError, match="sub: out has dtype float64, expected float32"):
        _core.sub(a, a, out=tensor(np.zeros((3, 4), np.float64)))


# ---------------------------------------------------------------- binary, tensor-scalar

def scalar_operands(rng, name, dtype, scalar_first):
    dtype = np.dtype(dtype)
    shape = (4, 5)
    if dtype.kind == "f":
        a = with_specials(rng, rand(rng, shape, dtype))
        s = float(np.float32(rng.uniform(-3, 3)))  # float32-exact, so float16 rounding happens once
        if name in ("eq", "ne", "le", "ge"):
            a.reshape(-1)[::3] = s
        return a, s
    if dtype.kind == "b":
        return rand(rng, shape, dtype), 1.0
    if name == "pow":
        if scalar_first:
            return rand(rng, shape, dtype, 0, 8), -3.0
        return rand(rng, shape, dtype, -6, 7), 3.0
    return rand(rng, shape, dtype, -9, 10), float(rng.integers(-5, 6) or 3)


@pytest.mark.parametrize("scalar_first", [False, True], ids=["tensor_first", "scalar_first"])
@pytest.mark.parametrize("dtype", NUMERIC, ids=ids(NUMERIC))
@pytest.mark.parametrize("name", BINARY)
def test_binary_scalar(name, dtype, scalar_first):
    rng = np.random.default_rng(20)
    a, s = scalar_operands(rng, name, dtype, scalar_first)
    sv = np.asarray(s, dtype=a.dtype)  # numpy: the Python scalar takes the array's dtype
    expected = np_binary(name, sv, a) if scalar_first else np_binary(name, a, sv)
    for layout in ("contiguous", "reversed", "strided"):
        got = getattr(_core, name + "_scalar")(make(a, layout), s, scalar_first)
        check_binary_result(name, got, expected)


@pytest.mark.parametrize("name", COMPARE)
def test_binary_scalar_on_bool(name):
    a = np.array([True, False, True])
    for s in (0.0, 1.0):
        for first in (False, True):
            sv = np.asarray(s, dtype=np.bool_)
            expected = np_binary(name, sv, a) if first else np_binary(name, a, sv)
            assert_same(getattr(_core, name + "_scalar")(tensor(a), s, first), expected)


def test_binary_scalar_keyword_and_default():
    a = np.array([1.0, 2.0, 4.0], np.float32)
    assert_same(_core.sub_scalar(tensor(a), 1.0), a - 1)
    assert_same(_core.sub_scalar(tensor(a), s=1.0, scalar_first=True), 1 - a)
    assert_same(_core.div_scalar(a=tensor(a), s=2.0, scalar_first=True), 2 / a)


def test_binary_scalar_float16_scalar_takes_tensor_dtype():
    # The scalar takes the tensor's dtype first (ops.h; numpy does the same): 0.500244140625 rounds to 0.5 in
    # float16, and 1024 + 0.5 is a tie that rounds to even, 1024. Kept at float32, the sum would round to 1025.
    a = np.array([1024.0, 2048.0, 1.0], np.float16)
    s = 0.500244140625
    assert_same(_core.add_scalar(tensor(a), s), a + np.float16(s))
    assert_same(_core.add_scalar(tensor(a), s, True), np.float16(s) + a)
    assert_same(_core.gt_scalar(tensor(np.array([0.5, 0.5002], np.float16)), s),
                np.array([0.5, 0.5002], np.float16) > np.float16(s))


def test_binary_scalar_special_values():
    a = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan], np.float64)
    for s in (0.0, -0.0, np.inf, -np.inf, np.nan, 2.0):
        for name in BINARY:
            for first in (False, True):
                expected = np_binary(name, s, a) if first else np_binary(name, a, s)
                check_binary_result(name, getattr(_core, name + "_scalar")(tensor(a), s, first), expected)


def test_binary_scalar_empty_and_0d():
    assert_same(_core.mul_scalar(tensor(np.zeros((0, 3), np.float32)), 2.0), np.zeros((0, 3), np.float32))
    assert_same(_core.add_scalar(tensor(np.float64(1.5)), 2.0, True), np.float64(3.5))
    assert_same(_core.lt_scalar(tensor(np.int32(3)), 4.0), np.bool_(True))


def test_binary_scalar_out_and_in_place():
    rng = np.random.default_rng(21)
    a = rand(rng, (3, 5), np.float32)
    ta = tensor(a)
    r = _core.mul_scalar(ta, 3.0, out=ta)
    assert r.shares_storage(ta)
    assert_same(ta, a * np.float32(3))
    # in place through a transposed view of itself (partial overlap)
    sq = rand(rng, (4, 4), np.float32)
    t = tensor(sq)
    _core.sub_scalar(t, 1.0, True, out=t.transpose([]))
    assert_same(t, (1 - sq).T)
    out = tensor(np.zeros((3, 5), np.bool_))
    _core.ge_scalar(tensor(a), 0.0, out=out)
    assert_same(out, a >= 0)
    with pytest.raises(TypeError, match="ge: out has dtype float32, expected bool"):
        _core.ge_scalar(tensor(a), 0.0, out=tensor(a))
    with pytest.raises(ValueError, match="add: out has shape"):
        _core.add_scalar(tensor(a), 1.0, out=tensor(np.zeros((5, 3), np.float32)))


@pytest.mark.parametrize("dtype", INTS, ids=ids(INTS))
def test_binary_scalar_int_rejects_non_integers(dtype):
    t = tensor(np.arange(4, dtype=dtype))
    for s in (0.5, -2.25, np.inf, np.nan):
        for name in ("add", "mul", "div", "eq", "lt"):
            with pytest.raises(TypeError, match=f"^{name}: "):
                getattr(_core, name + "_scalar")(t, s)


@pytest.mark.parametrize("dtype", INTS, ids=ids(INTS))
def test_binary_scalar_int_rejects_out_of_range(dtype):
    # ops.h: the scalar must be representable in the tensor's dtype (a C++ cast would be undefined otherwise)
    t = tensor(np.arange(4, dtype=dtype))
    too_big = 2.0 ** (np.iinfo(dtype).bits - 1)
    for s in (too_big, -too_big * 2, 1e300):
        with pytest.raises(TypeError, match="^add: "):
            _core.add_scalar(t, s)
    # the extremes themselves are fine
    lo = float(np.iinfo(dtype).min)
    assert_same(_core.eq_scalar(tensor(np.array([np.iinfo(dtype).min, 0], dtype)), lo), np.array([True, False]))


# ---------------------------------------------------------------- unary

UNARY_ANY = ["neg", "abs", "sign", "square", "relu"]
UNARY_FLOAT_EXACT = ["sqrt", "reciprocal", "floor", "ceil", "round"]
UNARY_FLOAT_APPROX = ["exp", "log", "tanh", "sigmoid", "sin", "cos", "log1p", "expm1", "erf", "softplus"]
UNARY = UNARY_ANY + UNARY_FLOAT_EXACT + UNARY_FLOAT_APPROX

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x):
    with np.errstate(all="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


_NP_UNARY = {
    "neg": np.negative, "abs": np.abs, "sign": np.sign, "square": np.square,
    "relu": lambda x: np.where(x > 0, x, np.where(np.isnan(x), x, np.zeros_like(x))),
    "sqrt": np.sqrt, "reciprocal": lambda x: np.divide(np.ones_like(x), x), "floor": np.floor, "ceil": np.ceil,
    "round": np.round, "exp": np.exp, "log": np.log, "tanh": np.tanh, "sigmoid": _sigmoid, "sin": np.sin,
    "cos": np.cos, "log1p": np.log1p, "expm1": np.expm1, "erf": _erf, "softplus": lambda x: np.logaddexp(0.0, x),
}


def np_unary(name, x):
    """Exact ops in x's dtype (numpy rounds float16 results once, as the core does); transcendental ones
    computed in float64 and rounded to x's dtype."""
    with np.errstate(all="ignore"):
        if name in UNARY_FLOAT_APPROX:
            return _NP_UNARY[name](x.astype(np.float64)).astype(x.dtype)
        return _NP_UNARY[name](x).astype(x.dtype)


APPROX_TOL = {np.dtype(np.float16): (2e-3, 1e-4), np.dtype(np.float32): (2e-6, 1e-6),
              np.dtype(np.float64): (1e-14, 1e-15)}


def check_unary_result(name, got, x):
    expected = np_unary(name, x)
    if name in UNARY_FLOAT_APPROX:
        rtol, atol = APPROX_TOL[x.dtype]
        assert_close(got, expected, rtol, atol)
    else:
        assert_same(got, expected)
        if x.dtype.kind == "f":  # exact ops also get the sign of zero right
            g = to_np(got) if isinstance(got, _core.Tensor) else got
            keep = ~np.isnan(expected)
            np.testing.assert_array_equal(np.signbit(g[keep]), np.signbit(expected[keep]))


def unary_input(rng, name, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "i":
        return rand(rng, shape, dtype, -100, 100)
    x = rand(rng, shape, dtype, -6, 6)
    if name in ("round", "floor", "ceil") and x.size:  # exact halves: round-half-to-even
        x.reshape(-1)[::4] = (rng.integers(-8, 8, x.reshape(-1)[::4].shape) + 0.5).astype(dtype)
    return with_specials(rng, x)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("name", UNARY)
def test_unary_float(name, dtype, layout):
    rng = np.random.default_rng(30)
    x = unary_input(rng, name, (4, 5, 6), dtype)
    got = getattr(_core, name)(make(x, layout))
    check_unary_result(name, got, x)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", INTS, ids=ids(INTS))
@pytest.mark.parametrize("name", UNARY_ANY)
def test_unary_int(name, dtype, layout):
    rng = np.random.default_rng(31)
    x = unary_input(rng, name, (5, 7), dtype)
    got = getattr(_core, name)(make(x, layout))
    check_unary_result(name, got, x)


@pytest.mark.parametrize("name", UNARY)
def test_unary_signed_zeros_and_specials(name):
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-30, -1e-30, 0.5, -0.5, 1.5, -2.5, 88.0, -88.0,
                  1e300, -1e300], np.float64)
    for dtype in FLOATS:
        with np.errstate(all="ignore"):
            xd = x.astype(dtype)
        check_unary_result(name, getattr(_core, name)(tensor(xd)), xd)


@pytest.mark.parametrize("name", UNARY)
def test_unary_empty_and_0d(name):
    check_unary_result(name, getattr(_core, name)(tensor(np.zeros((2, 0), np.float32))), np.zeros((2, 0), np.float32))
    x = np.float32(0.75) * np.ones((), np.float32)
    check_unary_result(name, getattr(_core, name)(tensor(x)), x)


@pytest.mark.parametrize("name", UNARY)
def test_unary_out_and_in_place(name):
    rng = np.random.default_rng(32)
    x = rand(rng, (3, 4), np.float64, 0.1, 3)
    t = tensor(x)
    r = getattr(_core, name)(t, out=t)
    assert r.shares_storage(t)
    check_unary_result(name, t, x)
    out = tensor(np.zeros((4, 3), np.float64)).transpose([])
    getattr(_core, name)(tensor(x), out=out)
    check_unary_result(name, out, x)
    with pytest.raises(ValueError, match=f"{name}: out has shape"):
        getattr(_core, name)(tensor(x), out=tensor(np.zeros((4, 3), np.float64)))
    with pytest.raises(TypeError, match=f"{name}: out has dtype float32, expected float64"):
        getattr(_core, name)(tensor(x), out=tensor(np.zeros((3, 4), np.float32)))


def test_unary_in_place_through_overlapping_view():
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    t = tensor(x)
    _core.neg(t, out=t.transpose([]))
    assert_same(t, -x.T)


def test_unary_large_parallel():
    rng = np.random.default_rng(33)
    x = rand(rng, (257, 1031), np.float32)
    check_unary_result("exp", _core.exp(make(x, "transposed")), x)
    check_unary_result("abs", _core.abs(make(x, "strided")), x)


@pytest.mark.parametrize("name", UNARY_FLOAT_EXACT + UNARY_FLOAT_APPROX)
@pytest.mark.parametrize("dtype", INTS, ids=ids(INTS))
def test_unary_float_only_rejects_ints(name, dtype):
    with pytest.raises(TypeError, match=f"^{name}: expected a floating dtype"):
        getattr(_core, name)(tensor(np.arange(3, dtype=dtype)))


@pytest.mark.parametrize("name", UNARY)
def test_unary_rejects_bool(name):
    with pytest.raises(TypeError, match=f"^{name}: "):
        getattr(_core, name)(tensor(np.array([True, False])))


# ---------------------------------------------------------------- clip

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", NUMERIC, ids=ids(NUMERIC))
def test_clip(dtype, layout):
    rng = np.random.default_rng(40)
    x = rand(rng, (4, 5, 3), dtype, -10, 10)
    if np.dtype(dtype).kind == "f":
        x = with_specials(rng, x)
        bounds = [(-2.5, 3.25), (None, 1.5), (-1.5, None), (None, None), (2.0, 2.0), (-np.inf, np.inf)]
    else:
        bounds = [(-3.0, 4.0), (None, 1.0), (-2.0, None), (None, None), (5.0, 5.0), (-np.inf, np.inf)]
    for lo, hi in bounds:
        got = _core.clip(make(x, layout), lo, hi)
        # a None bound leaves that side open; nan passes through (as numpy.clip)
        l = -np.inf if lo is None else lo
        h = np.inf if hi is None else hi
        expected = np.where(x < l, l, np.where(x > h, h, x)).astype(x.dtype)
        assert_same(got, expected)


def test_clip_keywords_out_and_in_place():
    x = np.array([[-3.0, 0.5, 7.0], [np.nan, -np.inf, np.inf]], np.float32)
    t = tensor(x)
    assert_same(_core.clip(t, min=0.0), np.clip(x, 0, None))
    assert_same(_core.clip(t, max=1.0), np.clip(x, None, 1))
    _core.clip(t, -1.0, 1.0, out=t)
    assert_same(t, np.clip(x, -1, 1))
    out = tensor(np.zeros((3, 2), np.float32)).transpose([])
    _core.clip(tensor(x), -2.0, 2.0, out=out)
    assert_same(out, np.clip(x, -2, 2))
    assert_same(_core.clip(tensor(np.float16(5.0) * np.ones((), np.float16)), 0.0, 1.0), np.float16(1.0))
    assert_same(_core.clip(tensor(np.zeros((0, 2), np.float64)), 0.0, 1.0), np.zeros((0, 2)))


def test_clip_int64_extremes_without_bounds():
    # An open bound must not clip anything, even values near the ends of int64.
    info = np.iinfo(np.int64)
    x = np.array([info.min, info.min + 1, -1, 0, info.max - 1, info.max], np.int64)
    assert_same(_core.clip(tensor(x), 0.0, None), np.clip(x, 0, None))
    assert_same(_core.clip(tensor(x), None, 0.0), np.clip(x, None, 0))
    assert_same(_core.clip(tensor(x), None, None), x)
    assert_same(_core.clip(tensor(x), -np.inf, np.inf), x)
    x32 = np.array([np.iinfo(np.int32).min, np.iinfo(np.int32).max], np.int32)
    assert_same(_core.clip(tensor(x32), None, None), x32)
    assert_same(_core.clip(tensor(x32), -1e30, 1e30), x32)


def test_clip_errors():
    with pytest.raises(ValueError, match="clip: min 2 is greater than max 1"):
        _core.clip(tensor(np.ones(3, np.float32)), 2.0, 1.0)
    with pytest.raises(TypeError, match="^clip: "):
        _core.clip(tensor(np.array([True])), 0.0, 1.0)
    with pytest.raises(TypeError, match="^clip: "):  # a bound that is not an integer, for an int tensor
        _core.clip(tensor(np.arange(4, dtype=np.int32)), 1.5, 2.0)
    with pytest.raises(TypeError, match="^clip: "):
        _core.clip(tensor(np.arange(4, dtype=np.int64)), None, 2.5)
    with pytest.raises(ValueError, match="clip: out has shape"):
        _core.clip(tensor(np.ones(3, np.float32)), 0.0, 1.0, out=tensor(np.ones(4, np.float32)))


# ---------------------------------------------------------------- axpy_

@pytest.mark.parametrize("dtype", NUMERIC, ids=ids(NUMERIC))
def test_axpy(dtype):
    rng = np.random.default_rng(50)
    dtype = np.dtype(dtype)
    alpha = -1.5 if dtype.kind == "f" else -3.0
    for xs, ys in [((4, 5), (4, 5)), ((5,), (4, 5)), ((), (3,)), ((1, 5), (2, 4, 5)), ((0,), (0,)), ((), ())]:
        x, y = rand(rng, xs, dtype), rand(rng, ys, dtype)
        for layout in ("contiguous", "transposed", "reversed"):
            ty = make(y, layout)
            _core.axpy_(alpha, make(x, layout), ty)
            if dtype.kind == "f":
                expected = y.astype(np.float64) + alpha * x.astype(np.float64)
            else:
                expected = y + dtype.type(alpha) * x
            if dtype == np.float16:
                assert_close(ty, expected.astype(dtype), rtol=1e-3, atol=1e-3)
            elif dtype.kind == "f":
                assert_close(ty, expected.astype(dtype), rtol=1e-6 if dtype == np.float32 else 1e-15, atol=1e-6)
            else:
                assert_same(ty, expected.astype(dtype))


def test_axpy_aliasing():
    rng = np.random.default_rng(51)
    y = rand(rng, (4, 4), np.float64)
    t = tensor(y)
    _core.axpy_(2.0, t, t)  # x is y: y = 3 y
    assert_same(t, y * 3)
    t = tensor(y)
    _core.axpy_(1.0, t.transpose([]), t)  # partial overlap: y + y.T with the original values
    assert_same(t, y + y.T)
    v = np.arange(8, dtype=np.float64)
    t = tensor(v)
    _core.axpy_(1.0, t.slice(0, 0, 7, 1), t.slice(0, 1, 8, 1))
    assert_same(t, np.concatenate([[0.0], v[1:] + v[:-1]]))


def test_axpy_errors():
    f = tensor(np.ones((3,), np.float32))
    with pytest.raises(TypeError, match="axpy: dtypes differ"):
        _core.axpy_(1.0, f, tensor(np.ones((3,), np.float64)))
    with pytest.raises(ValueError, match="axpy: "):  # x must broadcast to y's shape, not the other way round
        _core.axpy_(1.0, f, tensor(np.ones((1,), np.float32)))
    with pytest.raises(ValueError, match="axpy: shapes"):
        _core.axpy_(1.0, f, tensor(np.ones((4,), np.float32)))
    with pytest.raises(TypeError, match="axpy: "):
        _core.axpy_(1.0, tensor(np.array([True])), tensor(np.array([False])))
    with pytest.raises(TypeError, match="axpy: "):  # a non-integer alpha with an int tensor
        _core.axpy_(0.5, tensor(np.arange(3, dtype=np.int32)), tensor(np.arange(3, dtype=np.int32)))


# ---------------------------------------------------------------- fill_ and arange

@pytest.mark.parametrize("dtype", ALL, ids=ids(ALL))
def test_fill(dtype):
    dtype = np.dtype(dtype)
    value = {"f": -2.5, "i": -7.0, "b": 1.0}[dtype.kind]
    a = np.zeros((4, 6), dtype)
    t = tensor(a)
    _core.fill_(t, value)
    assert_same(t, np.full((4, 6), value, dtype))
    # through a view: only the view's elements change
    base = np.zeros((4, 6), dtype)
    tb = tensor(base)
    _core.fill_(tb.slice(1, 5, 0, -2), value)  # columns 5, 3 and 1
    expected = np.zeros((4, 6), dtype)
    expected[:, 5:0:-2] = value
    assert_same(tb, expected)
    _core.fill_(tb.select(0, 2), 0.0)
    expected[2] = 0
    assert_same(tb, expected)
    z = tensor(np.zeros((), dtype))
    _core.fill_(z, value)
    assert_same(z, np.asarray(value, dtype))
    _core.fill_(tensor(np.zeros((0, 3), dtype)), value)  # nothing to do, no error


def test_fill_special_values():
    t = tensor(np.zeros(3, np.float16))
    for v in (np.inf, -np.inf, 65504.0, 1e6, 6e-8):
        _core.fill_(t, v)
        with np.errstate(over="ignore"):
            assert_same(t, np.full(3, v, np.float16))
    _core.fill_(t, np.nan)
    assert np.isnan(to_np(t)).all()
    tb = tensor(np.zeros(2, np.bool_))
    _core.fill_(tb, 0.5)  # nonzero is true, as numpy's bool(0.5)
    assert_same(tb, np.array([True, True]))


def test_fill_errors():
    with pytest.raises(TypeError, match="fill: the value 1.5 is not an integer"):
        _core.fill_(tensor(np.zeros(3, np.int32)), 1.5)
    with pytest.raises(TypeError, match="^fill: "):
        _core.fill_(tensor(np.zeros(3, np.int64)), np.nan)
    with pytest.raises(TypeError, match="^fill: "):
        _core.fill_(tensor(np.zeros(3, np.int32)), 2.0 ** 31)


ARANGE_CASES = [(0, 10, 1), (0, 10, 3), (10, 0, -1), (5, -7, -3), (0, 0, 1), (3, 1, 1), (1, 3, -1), (-4, 4, 2)]
ARANGE_FLOAT_CASES = [(0.0, 1.0, 0.1), (-1.5, 2.25, 0.25), (2.0, -1.0, -0.3), (0.0, 1e-3, 1e-4), (1.0, 1.0, 0.5)]


@pytest.mark.parametrize("dtype", NUMERIC, ids=ids(NUMERIC))
def test_arange(dtype):
    dtype = np.dtype(dtype)
    cases = ARANGE_CASES + (ARANGE_FLOAT_CASES if dtype.kind == "f" else [])
    for start, stop, step in cases:
        got = _core.arange(start, stop, step, NP_TO_DT[dtype], CPU)
        # numpy's length, and values start + i * step in double, rounded to the dtype (numpy's own float arange
        # steps by (start + step) - start instead, which can differ in the last bit)
        n = len(np.arange(start, stop, step, dtype=np.float64))
        expected = (start + np.arange(n, dtype=np.float64) * step).astype(dtype)
        assert_same(got, expected)


def test_arange_large_parallel():
    got = _core.arange(0, 200_001, 1, DT.int64, CPU)
    assert_same(got, np.arange(200_001, dtype=np.int64))
    got = _core.arange(0.5, 100_000.5, 1.0, DT.float64, CPU)
    assert_same(got, np.arange(0.5, 100_000.5, 1.0))


def test_arange_errors():
    with pytest.raises(ValueError, match="arange: step cannot be zero"):
        _core.arange(0, 1, 0, DT.float32, CPU)
    with pytest.raises(ValueError, match="arange: start, stop and step must be finite"):
        _core.arange(0, np.inf, 1, DT.float32, CPU)
    with pytest.raises(TypeError, match="arange: bool"):
        _core.arange(0, 3, 1, DT.bool, CPU)


# ---------------------------------------------------------------- property tests

_shapes2 = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, min_side=0, max_side=4)


@settings(max_examples=50, deadline=None)
@given(shapes=_shapes2, name=st.sampled_from(BINARY), dtype=st.sampled_from([np.float32, np.int32, np.float16]),
       layout_a=st.sampled_from(LAYOUTS), layout_b=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**32 - 1))
def test_property_binary_broadcasting(shapes, name, dtype, layout_a, layout_b, seed):
    rng = np.random.default_rng(seed)
    sa, sb = shapes.input_shapes
    a, b = binary_operands(rng, name, sa, sb, dtype)
    got = getattr(_core, name)(make(a, layout_a), make(b, layout_b))
    expected = np_binary(name, a, b)
    assert tuple(got.shape) == shapes.result_shape == expected.shape
    check_binary_result(name, got, expected)


@settings(max_examples=50, deadline=None)
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, min_side=0, max_side=3),
       seed=st.integers(0, 2**32 - 1))
def test_property_non_broadcastable_raise(shapes, seed):
    sa, sb = shapes.input_shapes
    # make one dimension disagree (neither side 1), when there is a dimension to spoil
    n = min(len(sa), len(sb))
    if n == 0:
        return
    i = seed % n
    sa = list(sa)
    sb = list(sb)
    sa[len(sa) - 1 - i] = 2
    sb[len(sb) - 1 - i] = 3
    with pytest.raises(ValueError, match="add: shapes .* do not broadcast"):
        _core.add(tensor(np.zeros(sa, np.float32)), tensor(np.zeros(sb, np.float32)))


@pytest.mark.parametrize("name", ["exp", "tanh", "sigmoid"])
def test_float32_polynomial_ops_give_the_same_bits_on_every_code_path(name):
    # Contiguous float32 runs take a run-time chosen SIMD copy of the loop (AVX2 where the CPU has it),
    # strided views the baseline one; both must round identically, or results would depend on layout / CPU.
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.standard_normal(4099) * 4, rng.uniform(-110, 95, 4099)]).astype(np.float32)
    strided = np.zeros(2 * x.size, np.float32)
    strided[::2] = x
    f = getattr(_core, name)
    contiguous_result = np.asarray(f(tensor(x)))
    strided_result = np.asarray(f(tensor(strided).slice(0, 0, strided.size, 2)))
    np.testing.assert_array_equal(contiguous_result, strided_result)
