"""bfloat16 tensors in the C++ core against a numpy reference: conversions bit for bit (round to nearest even
from float32 and, once, from float64; inf and nan kept; subnormals), element-wise ops, matmul and reductions
computed in float32 and rounded once, and the numpy / DLPack interop (numpy has no bfloat16: values read out
as float32, exactly)."""
from __future__ import annotations

import numpy as np
import pytest

from singa_lite import _core, tensor

BF16 = _core.DType.bfloat16


def bf16_round(x) -> np.ndarray:
    """x (any float array) rounded once to the nearest bfloat16 (ties to even), as float64. bfloat16 has an
    8-bit significand and float32's exponent range: normal from 2^-126, subnormal steps of 2^-133."""
    x = np.asarray(x, np.float64)
    out = x.copy()
    finite = np.isfinite(x) & (x != 0)
    _, e = np.frexp(x[finite])                        # x = m 2^e, 0.5 <= |m| < 1
    q = np.maximum(e - 8, -133).astype(np.float64)    # the value of the last significand bit
    out[finite] = np.rint(x[finite] * 2.0 ** -q) * 2.0 ** q
    out[np.abs(out) > 3.3895313892515355e38] = np.inf * np.sign(out[np.abs(out) > 3.3895313892515355e38])
    return out


def bits_of(t: _core.Tensor) -> np.ndarray:
    """The 16-bit patterns of a bfloat16 tensor (the top halves of its exact float32 values)."""
    return (np.asarray(t.cast(_core.DType.float32)).view(np.uint32) >> 16).astype(np.uint16)


def from_f32_bits(bits) -> _core.Tensor:
    return _core.Tensor.from_buffer(np.asarray(bits, np.uint32).view(np.float32))


def bf16(x) -> _core.Tensor:
    """A bfloat16 tensor of x's values (rounded once from float64)."""
    return _core.Tensor.from_buffer(np.ascontiguousarray(x, np.float64)).cast(BF16)


def values(t: _core.Tensor) -> np.ndarray:
    return np.asarray(t.cast(_core.DType.float64))


# ---------------------------------------------------------------- conversions
def test_dtype_enum_keeps_old_codes_and_names():
    assert [int(d) for d in (_core.DType.float16, _core.DType.float32, _core.DType.float64, _core.DType.int32,
                             _core.DType.int64, _core.DType.bool)] == [0, 1, 2, 3, 4, 5]
    assert int(BF16) == 6 and BF16.itemsize == 2 and BF16.is_floating
    assert tensor.bfloat16 == BF16 and tensor.to_dtype("bfloat16") == BF16


def test_float32_to_bfloat16_rounds_to_nearest_even_bit_for_bit():
    rng = np.random.default_rng(0)
    hi = rng.integers(0, 0x7F7F, 4000).astype(np.uint32)
    # Exact ties (low half 0x8000: even and odd upper halves), just above and below ties, random low bits.
    low = np.concatenate([np.full(1000, 0x8000), np.full(1000, 0x8001), np.full(1000, 0x7FFF),
                          rng.integers(0, 0x10000, 1000)]).astype(np.uint32)
    bits = (hi << 16) | low
    bits = np.concatenate([bits, bits | 0x80000000])  # both signs
    f32 = bits.view(np.float32)
    got = bits_of(from_f32_bits(bits).cast(BF16))
    want = (bf16_round(f32).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(got, want)
    # A tie rounds to the even neighbour: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7.
    np.testing.assert_array_equal(bits_of(bf16([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8])), [0x3F80, 0x3F82])


def test_inf_nan_overflow_and_subnormals():
    x = np.array([np.inf, -np.inf, np.nan, 3.3895313892515355e38, 3.4e38, -3.4e38, 0.0, -0.0,
                  2.0 ** -133, 2.0 ** -134, 3 * 2.0 ** -134, 2.0 ** -126 - 2.0 ** -133, 1e-45], np.float64)
    t = _core.Tensor.from_buffer(x.astype(np.float32)).cast(BF16)
    got = values(t)
    assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2])
    assert got[3] == 3.3895313892515355e38            # the largest bfloat16 stays
    assert got[4] == np.inf and got[5] == -np.inf     # past it (by more than half an ulp): inf
    assert got[6] == 0 and not np.signbit(got[6]) and got[7] == 0 and np.signbit(got[7])
    assert got[8] == 2.0 ** -133                      # the smallest subnormal
    assert got[9] == 0                                # half of it: a tie, to even (zero)
    assert got[10] == 2.0 ** -132                     # 1.5 of it: a tie, to even (2)
    assert got[11] == 2.0 ** -126 - 2.0 ** -133       # the largest subnormal
    assert got[12] == 0                               # float32's smallest subnormal is far below bfloat16's
    # nan stays nan whatever its payload, and quiet (a signalling float32 nan gets the quiet bit)
    nans = from_f32_bits([0x7F800001, 0xFFC00000, 0x7FBFFFFF]).cast(BF16)
    b = bits_of(nans)
    assert ((b & 0x7F80) == 0x7F80).all() and ((b & 0x0040) != 0).all()
    assert np.isnan(values(nans)).all()


def test_float64_to_bfloat16_rounds_once():
    # Doubles just above / below a halfway point: rounding to float32 first would land on the tie and round
    # to even, one ulp off; a single rounding goes the right way.
    base = np.arange(0x3F80, 0x3F80 + 500, dtype=np.uint32)
    b = (base << 16).view(np.float32).astype(np.float64)
    ulp = 2.0 ** (np.frexp(b)[1] - 8)
    traps = np.concatenate([b + ulp / 2 + 2.0 ** -40, b + ulp / 2 - 2.0 ** -40, -(b + ulp / 2 + 2.0 ** -40)])
    twice = bf16_round(traps.astype(np.float32))
    once = bf16_round(traps)
    assert (twice != once).any(), "the trap is real"
    np.testing.assert_array_equal(values(bf16(traps)), once)


@pytest.mark.parametrize("dst", ["float16", "float32", "float64", "int32", "int64", "bool"])
def test_cast_from_bfloat16_to_every_dtype(dst):
    x = bf16_round([0.0, -1.5, 2.75, 1000.0, -77.0, 0.333, 300.0])
    got = bf16(x).cast(getattr(_core.DType, dst))
    np.testing.assert_array_equal(np.asarray(got), x.astype(np.float32).astype(dst))
    back = got.cast(BF16)  # and back again: every one of these values is exact in bfloat16 (or a bool)
    np.testing.assert_array_equal(values(back), bf16_round(x.astype(np.float32).astype(dst).astype(np.float64)))


# ---------------------------------------------------------------- kernels: float32 compute, one rounding
@pytest.fixture
def ab():
    rng = np.random.default_rng(3)
    a = bf16_round(rng.uniform(-4, 4, (37, 29)))
    b = bf16_round(rng.uniform(0.5, 4, (37, 29)))
    return a, b


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "minimum"])
def test_binary_ops_round_once(ab, op):
    a, b = ab
    want = bf16_round(getattr(np, {"add": "add", "sub": "subtract", "mul": "multiply", "div": "divide"}.get(op, op))(
        a.astype(np.float32), b.astype(np.float32)))
    got = getattr(_core, op)(bf16(a), bf16(b))
    assert got.dtype == BF16
    np.testing.assert_array_equal(values(got), want)


def test_scalar_op_takes_the_tensor_dtype_first(ab):
    a, _ = ab
    # The scalar 0.1 is rounded to bfloat16 (0.10009765625) before the add, as numpy does with its dtypes.
    got = _core.add_scalar(bf16(a), 0.1)
    want = bf16_round(a.astype(np.float32) + np.float32(bf16_round([0.1])[0]))
    np.testing.assert_array_equal(values(got), want)


@pytest.mark.parametrize("op", ["exp", "tanh", "sigmoid", "sqrt", "relu", "abs", "neg", "square", "log"])
def test_unary_ops_within_one_bfloat16_ulp(ab, op):
    _, b = ab  # positive: valid for log and sqrt
    x = np.concatenate([b, -b[:5]]) if op not in ("sqrt", "log") else b
    f32 = x.astype(np.float32)
    ref = {"sigmoid": lambda v: 1 / (1 + np.exp(-v)), "relu": lambda v: np.maximum(v, 0),
           "neg": np.negative}.get(op, getattr(np, op, None))(f32.astype(np.float64))
    want = bf16_round(ref)
    got = values(getattr(_core, op)(bf16(x)))
    # float32 libm/SIMD results may differ from the exact value in the last float32 bit, which can move the
    # bfloat16 rounding by one step; exact ops must match exactly.
    ulp = 2.0 ** (np.frexp(np.abs(want) + 1e-30)[1] - 8)
    tol = 0 if op in ("relu", "abs", "neg", "square", "sqrt") else 1
    assert (np.abs(got - want) <= tol * ulp).all(), np.max(np.abs(got - want) / ulp)


def test_matmul_in_bfloat16():
    rng = np.random.default_rng(5)
    a = bf16_round(rng.standard_normal((2, 33, 65)))
    b = bf16_round(rng.standard_normal((2, 65, 17)))
    got = _core.matmul(bf16(a), bf16(b))
    assert got.dtype == BF16 and tuple(got.shape) == (2, 33, 17)
    exact = a @ b
    want = bf16_round(exact.astype(np.float32))
    ulp = 2.0 ** (np.frexp(np.abs(exact) + 1e-30)[1] - 8)
    # float32 accumulation order differs from numpy's: at most one bfloat16 step from the rounded product.
    assert (np.abs(values(got) - want) <= ulp).all()
    # transposed views (unit row stride) are read correctly too
    at = bf16(np.swapaxes(a, 1, 2).copy()).transpose([0, 2, 1])
    assert (np.abs(values(_core.matmul(at, bf16(b))) - want) <= ulp).all()
    with pytest.raises(TypeError):
        _core.matmul(bf16(a), _core.Tensor.from_buffer(b.astype(np.float32)))


def test_reductions_accumulate_in_float32():
    rng = np.random.default_rng(7)
    x = bf16_round(rng.uniform(0, 1, (64, 300)))
    t = bf16(x)
    # 19200 values near 0.5: a bfloat16 accumulator would stall at 256 (adding 0.5 to it is a tie to even);
    # float32 accumulation reaches the sum.
    total = values(_core.sum(t, None, False)).reshape(-1)[0]
    assert abs(total - x.sum()) <= 2.0 ** (np.frexp(x.sum())[1] - 8)
    rows = values(_core.sum(t, [1], False))
    ulp = 2.0 ** (np.frexp(x.sum(1))[1] - 8)
    assert (np.abs(rows - bf16_round(x.sum(1))) <= ulp).all()
    np.testing.assert_array_equal(values(_core.max(t, [0], False)), x.max(0))
    np.testing.assert_array_equal(values(_core.min(t, [1], False)), x.min(1))
    m = values(_core.mean(t, [1], False))
    assert (np.abs(m - bf16_round(x.mean(1))) <= 2.0 ** (np.frexp(x.mean(1))[1] - 8)).all()


def test_random_fills_bfloat16():
    t = tensor.Tensor((4000,), dtype=tensor.bfloat16).uniform(0.0, 1.0)
    v = values(t.data)
    assert v.min() >= 0.0 and v.max() < 1.0 and 0.4 < v.mean() < 0.6
    np.testing.assert_array_equal(bf16_round(v), v)


# ---------------------------------------------------------------- interop
def test_numpy_interop_reads_float32_and_rounds_on_the_way_in():
    x = np.array([[1 / 3, -2.5e-3], [65504.0, 7.0]])
    t = tensor.Tensor(data=x, dtype=tensor.bfloat16)
    assert t.dtype == tensor.bfloat16
    out = tensor.to_numpy(t)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, bf16_round(x).astype(np.float32))
    assert np.asarray(t).dtype == np.float32
    # numpy operands of a bfloat16 tensor take its dtype
    s = t + np.ones((2, 2))
    assert s.dtype == tensor.bfloat16
    np.testing.assert_array_equal(tensor.to_numpy(s), bf16_round(bf16_round(x) + 1).astype(np.float32))
    # the raw C++ tensor has no buffer view: a clear error (pybind11's BufferError, caused by ours) says how
    # to read it
    with pytest.raises(BufferError) as err:
        memoryview(t.data)
    assert "float32" in str(err.value.__cause__ or err.value.__context__)
    assert t.as_type(tensor.float32).dtype == tensor.float32


def test_dlpack_carries_bfloat16():
    x = bf16_round([1.5, -2.0, 3.25])
    t = bf16(x)
    back = _core.Tensor.from_dlpack(t)
    assert back.dtype == BF16 and back.data_ptr == t.data_ptr  # the same memory, no copy
    np.testing.assert_array_equal(values(back), x)


def test_host_side_operators_take_bfloat16():
    # Operators computed on the host (gather, ...) read bfloat16 as float32 and round their results back.
    from singa_lite import autograd

    x = tensor.Tensor(data=np.arange(6.0).reshape(2, 3) / 3, dtype=tensor.bfloat16)
    y = autograd.gather(x, 1, [0, 2])
    assert y.dtype == tensor.bfloat16
    np.testing.assert_array_equal(tensor.to_numpy(y), bf16_round(np.arange(6.0).reshape(2, 3) / 3)[:, [0, 2]])
