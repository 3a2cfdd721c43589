"""dtype conversions of the C++ core against numpy: cast between every pair of dtypes, copy_ with casting and
broadcasting, and the float16 conversions bit for bit (round to nearest even, inf and nan kept, subnormals)."""
from __future__ import annotations

import numpy as np
import pytest

from singa_lite import _core
from core_testutil import ALL, LAYOUTS, NP_TO_DT, assert_same, ids, make, tensor, to_np


def cast_source(rng, src, dst):
    """Values of dtype src that have a defined conversion to dst (no nan / inf / out-of-range into integers)."""
    src, dst = np.dtype(src), np.dtype(dst)
    if src.kind == "b":
        return rng.random((5, 7)) < 0.5
    if src.kind == "i":
        x = rng.integers(-1000, 1000, (5, 7)).astype(src)
        if src == np.int64 and dst.kind != "i":
            x[0, :4] = [2**53 + 1, -(2**62) - 3, 70000, 65519]  # rounding into floats, overflow to inf in float16
        if src == np.int64 and dst == np.int32:
            x[0, :2] = [2**40 + 5, -(2**35) - 1]  # keeps the low 32 bits, as numpy
        x.reshape(-1)[-3:] = 0
        return x
    x = rng.uniform(-1000, 1000, (5, 7))
    x.reshape(-1)[:6] = [0.0, -0.0, 0.5, -0.5, 1.5, -2.999]
    x = x.astype(src)
    if dst.kind in "fb":
        x.reshape(-1)[6:9] = [np.inf, -np.inf, np.nan]
    return x


PAIRS = [(s, d) for s in ALL for d in ALL]


@pytest.mark.parametrize("src,dst", PAIRS, ids=[f"{np.dtype(s).name}->{np.dtype(d).name}" for s, d in PAIRS])
def test_cast_all_pairs(src, dst):
    rng = np.random.default_rng(1)
    x = cast_source(rng, src, dst)
    with np.errstate(all="ignore"):
        expected = x.astype(dst)
    for layout in LAYOUTS:
        t = make(x, layout)
        got = t.cast(NP_TO_DT[np.dtype(dst)])
        assert got.dtype == NP_TO_DT[np.dtype(dst)] and tuple(got.shape) == x.shape
        assert_same(got, expected)
        # copy_ into a fresh tensor of the other dtype does the same
        out = tensor(np.zeros(x.shape, dst))
        _core.copy_(out, t)
        assert_same(out, to_np(got))


def test_float64_to_float16_rounds_once_at_double_rounding_traps():
    # Doubles just above a half-way point between two halves: rounding to float32 first lands exactly on
    # the tie and then rounds to even, one ulp off. A single correct rounding (numpy's) goes up.
    halves = np.arange(0x3C00, 0x3C00 + 2000, dtype=np.uint16).view(np.float16).astype(np.float64)
    ulp = np.spacing(halves.astype(np.float16)).astype(np.float64)
    traps = np.concatenate([halves + ulp / 2 + 2.0 ** -40, halves + ulp / 2 - 2.0 ** -40,
                            -(halves + ulp / 2 + 2.0 ** -40)])
    assert (traps.astype(np.float32).astype(np.float16) != traps.astype(np.float16)).any(), "the trap is real"
    assert_same(tensor(traps).cast(NP_TO_DT[np.dtype(np.float16)]), traps.astype(np.float16))


def test_float64_to_float16_is_exact_for_float32_values():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(10_000) * 100).astype(np.float32).astype(np.float64)
    assert_same(tensor(x).cast(NP_TO_DT[np.dtype(np.float16)]), x.astype(np.float16))


@pytest.mark.parametrize("dst", ALL, ids=ids(ALL))
def test_copy_broadcasts_and_casts(dst):
    rng = np.random.default_rng(3)
    src = rng.integers(-5, 5, (4,)).astype(np.int32)
    for dst_layout in LAYOUTS:
        d = make(np.zeros((3, 4), dst), dst_layout)
        _core.copy_(d, tensor(src))
        assert_same(d, np.broadcast_to(src, (3, 4)).astype(dst))
        _core.copy_(d, tensor(np.float64(1.0)))  # a 0-d source fills
        assert_same(d, np.ones((3, 4), dst))
        col = rng.uniform(-3, 3, (3, 1))
        _core.copy_(d, make(col, "strided"))
        assert_same(d, np.broadcast_to(col, (3, 4)).astype(dst))
    _core.copy_(tensor(np.zeros((0, 4), dst)), tensor(src))  # nothing to copy
    z = tensor(np.zeros((), dst))
    _core.copy_(z, tensor(np.ones((), np.float32)))
    assert to_np(z) == 1
    with pytest.raises(ValueError, match="copy: source of shape"):  # a source never loses axes (as numpy.copyto)
        _core.copy_(z, tensor(np.ones((1, 1), np.float32)))


def test_copy_overlapping():
    x = np.arange(10, dtype=np.float32)
    t = tensor(x)
    _core.copy_(t.slice(0, 1, 10, 1), t.slice(0, 0, 9, 1))  # memmove semantics
    assert_same(t, np.concatenate([[0], np.arange(9)]).astype(np.float32))
    m = np.arange(16, dtype=np.float64).reshape(4, 4)
    tm = tensor(m)
    _core.copy_(tm, tm.transpose([]))  # in-place transpose
    assert_same(tm, m.T)
    tr = tensor(x)
    _core.copy_(tr, tr.slice(0, 9, -(1 << 62), -1))  # in-place reversal
    assert_same(tr, x[::-1])
    same = tensor(x)
    _core.copy_(same, same)
    assert_same(same, x)


def test_copy_errors():
    d = tensor(np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match=r"copy: shapes \(5,\) and \(3, 4\) do not broadcast"):
        _core.copy_(d, tensor(np.zeros(5, np.float32)))
    with pytest.raises(ValueError, match=r"copy: source of shape \(2, 3, 4\) does not broadcast to the destination"):
        _core.copy_(d, tensor(np.zeros((2, 3, 4), np.float32)))
    with pytest.raises(ValueError,
                       match=r"copy: source of shape \(3, 4\) does not broadcast to the destination's shape \(3, 1\)"):
        _core.copy_(tensor(np.zeros((3, 1), np.float32)), d)


# ---------------------------------------------------------------- float16 bit for bit

F16 = NP_TO_DT[np.dtype(np.float16)]
F32 = NP_TO_DT[np.dtype(np.float32)]
F64 = NP_TO_DT[np.dtype(np.float64)]


def all_halves():
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


def to_half_bits(values_f32):
    return to_np(tensor(values_f32).cast(F16)).view(np.uint16)


def check_half_bits(values_f32):
    """float32 -> float16 through the core equals numpy's conversion bit for bit; a nan stays a nan of the
    same sign."""
    got = to_half_bits(values_f32)
    with np.errstate(all="ignore"):
        expected = values_f32.astype(np.float16).view(np.uint16)
    nan = np.isnan(values_f32)
    bad = np.flatnonzero((got != expected) & ~nan)
    assert bad.size == 0, [(float(values_f32[i]), hex(values_f32.view(np.uint32)[i]), hex(got[i]), hex(expected[i]))
                           for i in bad[:10]]
    g = got[nan]
    assert ((g & 0x7C00) == 0x7C00).all() and ((g & 0x3FF) != 0).all()  # nan
    assert ((g >> 15) == (values_f32[nan].view(np.uint32) >> 31)).all()  # sign kept


def test_all_halves_widen_exactly():
    h = all_halves()
    nan = np.isnan(h)
    f = to_np(tensor(h).cast(F32))
    assert (f.view(np.uint32)[~nan] == h[~nan].astype(np.float32).view(np.uint32)).all()
    # nan keeps its sign and payload
    fb = f.view(np.uint32)[nan]
    hb = h.view(np.uint16)[nan].astype(np.uint32)
    assert np.isnan(f[nan]).all()
    assert ((fb >> 31) == (hb >> 15)).all() and (((fb >> 13) & 0x3FF) == (hb & 0x3FF)).all()
    d = to_np(tensor(h).cast(F64))
    assert (d.view(np.uint64)[~nan] == h[~nan].astype(np.float64).view(np.uint64)).all()
    assert np.isnan(d[nan]).all()


def test_all_halves_round_trip():
    h = all_halves()
    nan = np.isnan(h)
    back = to_np(tensor(h).cast(F32).cast(F16)).view(np.uint16)
    hb = h.view(np.uint16)
    assert (back[~nan] == hb[~nan]).all()
    # nan stays nan with its sign and top payload bits (made quiet)
    assert ((back[nan] & 0x7C00) == 0x7C00).all()
    assert ((back[nan] & 0x8000) == (hb[nan] & 0x8000)).all()
    assert ((back[nan] & 0x3FF) == ((hb[nan] & 0x3FF) | 0x200)).all()
    back64 = to_np(tensor(h).cast(F64).cast(F16)).view(np.uint16)
    assert (back64[~nan] == hb[~nan]).all()
    # and through the element-wise ops, which compute float16 in float32
    same = to_np(_core.mul_scalar(tensor(h), 1.0)).view(np.uint16)
    assert (same[~nan] == hb[~nan]).all()


def test_random_float32_to_half():
    rng = np.random.default_rng(4)
    bits = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32)
    check_half_bits(bits.view(np.float32))  # every exponent: normals, subnormals, overflow, inf, nan
    check_half_bits(rng.uniform(-70000, 70000, 100_000).astype(np.float32))
    check_half_bits((rng.standard_normal(100_000) * 10.0 ** rng.integers(-9, 5, 100_000)).astype(np.float32))


def test_half_ties_round_to_even():
    # the midpoint between every pair of neighbouring finite halves (exact in float32: halves have 11
    # significant bits), and the float32 values just above and below each midpoint
    bits = np.arange(0, 0x7BFF, dtype=np.uint16)  # 0 .. the largest finite half minus one ulp
    lo = bits.view(np.float16).astype(np.float64)
    hi = (bits + 1).view(np.float16).astype(np.float64)
    mid = ((lo + hi) / 2).astype(np.float32)
    assert (mid.astype(np.float64) == (lo + hi) / 2).all()
    mid = np.concatenate([mid, -mid])
    check_half_bits(mid)
    check_half_bits(np.nextafter(mid, np.float32(np.inf)))
    check_half_bits(np.nextafter(mid, np.float32(-np.inf)))
    # spot checks: ties go to the even neighbour
    vals = np.array([1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 2048 + 1, 2048 + 3, 2.0 ** -25, 3 * 2.0 ** -25], np.float32)
    assert to_half_bits(vals).view(np.float16).astype(np.float64).tolist() == [
        1.0, 1 + 2.0 ** -9, 2048.0, 2052.0, 0.0, 2.0 ** -23]


def test_half_overflow_boundary():
    v = np.float32(65504)
    near = [v]
    x = v
    for _ in range(300):  # every float32 from 65504 up past 65520
        x = np.nextafter(x, np.float32(np.inf))
        near.append(x)
    vals = np.array(near + [65519.996, 65520.0, 65520.004, 65535.0, 65536.0, 1e5, 3.4e38, np.inf], np.float32)
    vals = np.concatenate([vals, -vals])
    check_half_bits(vals)
    got = to_half_bits(np.array([65519.99, 65520.0, -65520.0], np.float32)).view(np.float16)
    assert got[0] == 65504 and np.isposinf(got[1]) and np.isneginf(got[2])


def test_half_subnormals():
    rng = np.random.default_rng(5)
    tiny = 2.0 ** -24
    vals = np.concatenate([
        rng.uniform(0, 2.0 ** -14, 50_000),  # the subnormal range
        (np.arange(0, 1024) + 0.5) * tiny,  # ties between subnormals (and 0)
        (np.arange(0, 1024) + 0.5) * tiny * (1 + 2.0 ** -20),
        (np.arange(0, 1024) + 0.5) * tiny * (1 - 2.0 ** -20),
        [2.0 ** -25, np.nextafter(np.float32(2.0 ** -25), np.float32(1)), 2.0 ** -26, 2.0 ** -14,
         2.0 ** -14 - tiny / 2, 1e-38, 1e-45, 0.0],
    ]).astype(np.float32)
    vals = np.concatenate([vals, -vals])
    check_half_bits(vals)
    got = to_half_bits(np.array([2.0 ** -25, -(2.0 ** -25), 1e-45], np.float32))
    assert got.tolist() == [0x0000, 0x8000, 0x0000]  # ties to even (zero), sign kept


def test_half_nan_and_inf_kept():
    vals = np.array([np.inf, -np.inf, np.nan, -np.nan], np.float32)
    nan_payloads = (np.array([0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0xFF800001, 0x7F802000], np.uint32)).view(np.float32)
    check_half_bits(np.concatenate([vals, nan_payloads]))
    got = to_half_bits(np.array([np.inf, -np.inf], np.float32))
    assert got.tolist() == [0x7C00, 0xFC00]
    # a signalling nan whose payload lies only in the low bits must not become inf
    assert (to_half_bits(np.array([0x7F800001], np.uint32).view(np.float32)) & 0x3FF != 0).all()
