"""SINGA's in-place operators on the raw C++ tensor (``t.data += d.data``, ``t.data /= 2``), bound in
csrc/bindings/bind_tensor.cpp: they write into the left tensor's memory (no new tensor, views see it), respect
overlapping views, broadcast the right side, and refuse bad input with a clear Python exception."""
import numpy as np
import pytest

from singa_lite import _core

OPS = {"+=": np.add, "-=": np.subtract, "*=": np.multiply, "/=": np.true_divide}


def raw(a):
    """A raw tensor holding a copy of a (from_buffer alone would share a's memory)."""
    return _core.Tensor.from_buffer(np.array(a, copy=True))


def host(t):
    return np.array(t, copy=True)


def apply(t, symbol, other):
    if symbol == "+=":
        t += other
    elif symbol == "-=":
        t -= other
    elif symbol == "*=":
        t *= other
    else:
        t /= other
    return t


def test_bound_in_the_extension():
    for name in ("__iadd__", "__isub__", "__imul__", "__itruediv__"):
        assert name in _core.Tensor.__dict__
        assert "SINGA's raw tensor" in _core.Tensor.__dict__[name].__doc__


# Integer /= is left out: its rounding is the core's div kernel's, tested with that kernel.
CASES = [(s, d) for s in OPS for d in (np.float32, np.float64, np.int32) if not (s == "/=" and d == np.int32)]


@pytest.mark.parametrize("symbol,dtype", CASES)
def test_tensor_and_number_in_place(symbol, dtype):
    rng = np.random.default_rng(0)
    a = rng.integers(1, 9, (3, 4)).astype(dtype)
    b = rng.integers(1, 9, (3, 4)).astype(dtype)
    t = raw(a)
    keep, ptr, view = t, t.data_ptr, t.slice(0, 1, 2)
    t = apply(t, symbol, raw(b))
    assert t is keep and t.data_ptr == ptr  # the same object and memory
    np.testing.assert_allclose(host(t), OPS[symbol](a, b).astype(dtype), rtol=1e-6)
    np.testing.assert_allclose(host(view), host(t)[1:2])  # a view of the storage sees the new values
    for number in (2, 2.0, np.float32(2.0), np.int64(2)):
        before = host(t)
        t = apply(t, symbol, number)
        assert t is keep
        np.testing.assert_allclose(host(t), OPS[symbol](before, 2).astype(dtype), rtol=1e-6)
    assert t.data_ptr == ptr


def test_right_side_broadcasts_to_the_left():
    t = raw(np.ones((2, 3), np.float32))
    t += raw(np.array([1.0, 2.0, 3.0], np.float32))
    t *= raw(np.array([[2.0], [3.0]], np.float32))
    np.testing.assert_array_equal(host(t), [[4, 6, 8], [6, 9, 12]])


def test_strided_left_side_writes_through():
    base = raw(np.arange(6, dtype=np.float32).reshape(2, 3))
    tr = base.transpose([1, 0])  # (3, 2), not contiguous
    tr -= raw(np.full((3, 2), 1.0, np.float32))
    np.testing.assert_array_equal(host(base), np.arange(6).reshape(2, 3) - 1)


def test_overlapping_views_read_the_old_values():
    a = np.arange(8, dtype=np.float64)
    t = raw(a)
    left, right = t.slice(0, 1, 8), t.slice(0, 0, 7)
    left += right  # numpy's meaning: as if the right side were copied first
    expect = a.copy()
    expect[1:] += a[:-1].copy()
    np.testing.assert_array_equal(host(t), expect)
    same = raw(np.array([1.0, 2.0], np.float32))
    same += same
    np.testing.assert_array_equal(host(same), [2.0, 4.0])


def test_bad_right_sides_are_refused_clearly():
    t = raw(np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match=r"\+=.*float64.*AsType"):
        t += raw(np.zeros((2, 3), np.float64))
    with pytest.raises(ValueError, match=r"-=.*\(4, 3\).*does not broadcast.*\(2, 3\)"):
        t -= raw(np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match="does not broadcast"):
        t *= raw(np.zeros((2, 2, 3), np.float32))
    with pytest.raises(TypeError, match=r"/=.*a raw tensor .* or a number, got str"):
        t /= "2"
    with pytest.raises(TypeError, match="got bool"):
        t += True
    with pytest.raises(TypeError, match="got ndarray"):
        t += np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(host(t), np.zeros((2, 3)))  # nothing was written


def test_python_tensor_on_the_right_gets_a_hint():
    from singa_lite import tensor
    w = tensor.from_numpy(np.ones((2, 2), np.float32))
    d = tensor.from_numpy(np.ones((2, 2), np.float32))
    with pytest.raises(TypeError, match=r"pass its \.data"):
        w.data += d
    w.data += d.data
    np.testing.assert_array_equal(tensor.to_numpy(w), np.full((2, 2), 2.0))


def test_int_tensor_refuses_a_fraction_and_bool_tensor_arithmetic():
    t = raw(np.ones(3, np.int32))
    with pytest.raises(TypeError, match="not an integer"):
        t += 1.5
    b = raw(np.ones(3, np.bool_))
    with pytest.raises(TypeError, match="bool"):
        b += b


def test_broadcast_view_on_the_left_is_refused():
    t = raw(np.ones(3, np.float32)).broadcast_to([2, 3])
    with pytest.raises(ValueError, match="broadcast view"):
        t += 1.0


def test_one_element_raw_tensor_converts_with_float():
    # SINGA's root operator reads dy with float(dy) (examples/model_selection: dx.data *= float(dy))
    assert float(raw(np.array([2.5], np.float32))) == 2.5
    assert float(raw(np.array([[7]], np.int64))) == 7.0
    t = raw(np.ones(3, np.float32))
    t *= float(raw(np.array([3.0], np.float64)))
    np.testing.assert_array_equal(host(t), [3.0, 3.0, 3.0])
    with pytest.raises(TypeError, match=r"one-element.*\(2, 2\) \(4 elements\)"):
        float(raw(np.zeros((2, 2), np.float32)))
