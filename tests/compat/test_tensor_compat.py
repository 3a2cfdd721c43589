"""SINGA's tensor behaviour that singa_lite follows (see singa_lite/tensor/).

Written from SINGA's documented behaviour; each test fails without the compatibility piece it names.
"""
import numpy as np
import pytest

from singa_lite import tensor
from singa_lite.tensor import Tensor


def t_of(a):
    return tensor.from_numpy(np.asarray(a))


# ---------------------------------------------------------------- mixed int / float arithmetic
@pytest.mark.parametrize("np_dtype", [np.int32, np.int64])
def test_int_tensor_with_float_scalar_computes_in_float32(np_dtype):
    a = np.array([[1, 2, 3], [4, 5, 6]], np_dtype)
    t = t_of(a)
    for r, expected in ((t + 0.25, a + 0.25), (t - 0.5, a - 0.5), (t * 1.5, a * 1.5), (t / 4.0, a / 4.0),
                        (0.5 + t, 0.5 + a), (10.0 - t, 10.0 - a), (2.5 * t, 2.5 * a), (3.0 / t, 3.0 / a),
                        (t + np.float64(0.5), a + 0.5)):
        assert r.dtype == tensor.float32
        np.testing.assert_allclose(tensor.to_numpy(r), expected, rtol=1e-6)
    np.testing.assert_array_equal(tensor.to_numpy(t < 2.5), a < 2.5)
    np.testing.assert_array_equal(tensor.to_numpy(t >= 4.5), a >= 4.5)


def test_int_tensor_with_int_scalar_stays_integer():
    t = t_of(np.array([1, 2, 3], np.int32))
    r = t + 2
    assert r.dtype == tensor.int32
    np.testing.assert_array_equal(tensor.to_numpy(r), [3, 4, 5])


def test_int_tensor_with_float_tensor_computes_in_the_float_dtype():
    i = t_of(np.array([1, 2, 3], np.int32))
    f = t_of(np.array([0.5, 0.5, 0.5], np.float32))
    for r in (i + f, f + i):
        assert r.dtype == tensor.float32
        np.testing.assert_allclose(tensor.to_numpy(r), [1.5, 2.5, 3.5])
    np.testing.assert_allclose(tensor.to_numpy(i * f), [0.5, 1.0, 1.5])


def test_in_place_float_into_int_tensor_is_refused():
    t = t_of(np.array([1, 2], np.int32))
    with pytest.raises(TypeError, match="not an integer"):
        t += 0.5


@pytest.mark.parametrize("op,expected", [(lambda x: 1 + x, 2.0), (lambda x: 1 - x, 0.0), (lambda x: 2 * x, 2.0),
                                         (lambda x: 2 / x, 2.0)])
def test_reflected_scalar_operators(op, expected):
    x = Tensor((3,))
    x.set_value(1)
    y = op(x)
    assert y.dtype == tensor.float32 and y.shape == (3,)
    assert tensor.average(y) == expected
    np.testing.assert_array_equal(tensor.to_numpy(y), np.full(3, expected, np.float32))


def test_python2_division_names():
    x = t_of(np.array([2.0, 4.0], np.float32))
    np.testing.assert_allclose(tensor.to_numpy(x.__div__(2)), [1.0, 2.0])
    np.testing.assert_allclose(tensor.to_numpy(x.__rdiv__(8)), [4.0, 2.0])


def test_floor_division():
    a = np.array([-3.5, -1.0, 2.5, 7.0], np.float32)
    t = t_of(a)
    np.testing.assert_array_equal(tensor.to_numpy(t // 2), a // 2)
    np.testing.assert_array_equal(tensor.to_numpy(10 // t_of(np.array([3.0, -3.0], np.float32))), [3.0, -4.0])
    i = t_of(np.array([-3, 3, 7], np.int32))
    r = i // 2
    assert r.dtype == tensor.int32
    np.testing.assert_array_equal(tensor.to_numpy(r), [-2, 1, 3])


# ---------------------------------------------------------------- comparisons
def test_equality_with_a_number_is_element_wise():
    t = Tensor((2, 3))
    t += 3.45
    for r, expected in ((t == 3.45, 1), (t != 3.45, 0), (t == 1.0, 0), (t < 3.45, 0), (t <= 3.45, 1),
                        (t > 3.45, 0), (t >= 3.45, 1), (tensor.eq(t, 3.45), 1)):
        assert isinstance(r, Tensor) and r.shape == (2, 3)
        assert tensor.to_numpy(r)[0, 0] == expected
    a = np.array([1.0, 2.0, 3.0], np.float32)
    np.testing.assert_array_equal(tensor.to_numpy(t_of(a) == np.array([1.0, 0.0, 3.0], np.float32)),
                                  [True, False, True])


def test_equality_between_tensors_stays_identity():
    a, b = t_of(np.ones(3, np.float32)), t_of(np.ones(3, np.float32))
    assert (a == a) is True and (a == b) is False and (a != b) is True
    assert (a == None) is False and (a != None) is True  # noqa: E711 - what is tested
    assert b in [a, b] and [a, b].index(b) == 1
    assert {a: 1, b: 2}[b] == 2


# ---------------------------------------------------------------- reductions
def test_average_without_axis_is_a_float():
    x = Tensor((1000,))
    x.gaussian(1, 0.01)
    avg = tensor.average(x)
    assert isinstance(avg, float) and not isinstance(avg, Tensor)
    assert avg == pytest.approx(float(tensor.to_numpy(x).mean()), rel=1e-6)
    assert round(avg, 1) == 1.0
    assert avg.item() == avg  # numpy.float64: code that called .item() on a 0-d result keeps working
    assert isinstance(tensor.average(t_of(np.ones((2, 3), np.float32))), float)


def test_average_with_axis_and_mean_are_tensors():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    r = tensor.average(t_of(a), 1)
    assert isinstance(r, Tensor)
    np.testing.assert_allclose(tensor.to_numpy(r), a.mean(1))
    m = tensor.mean(t_of(a))
    assert isinstance(m, Tensor) and m.shape == ()
    assert isinstance(tensor.average(t_of(a), keepdims=True), Tensor)


def test_sum_without_axis_is_a_tensor():
    # SINGA returns a tensor here (its scripts call to_numpy on it); ours is 0-d rather than SINGA's (1, 1).
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = tensor.sum(t_of(a))
    assert isinstance(s, Tensor) and s.shape == ()
    assert tensor.to_numpy(s) == 15.0


# ---------------------------------------------------------------- copies and layout
def test_copy_shares_memory_deepcopy_does_not():
    t = Tensor((2, 3))
    t += 1.23
    tc, tdc = t.copy(), t.deepcopy()
    t += 1.23
    assert tensor.to_numpy(tc)[0, 0] == pytest.approx(2.46)
    assert tensor.to_numpy(tdc)[0, 0] == pytest.approx(1.23)
    tc.set_value(7)
    assert tensor.to_numpy(t)[1, 2] == 7
    tt = t_of(np.arange(6, dtype=np.float32).reshape(2, 3)).transpose()
    np.testing.assert_array_equal(tensor.to_numpy(tt.copy()), tensor.to_numpy(tt))
    assert tt.copy().data.shares_storage(tt.data)


def test_is_transpose():
    t = Tensor((2, 3))
    assert not t.is_transpose()
    assert t.transpose().is_transpose() and t.T().is_transpose()
    assert not t.transpose().contiguous().is_transpose()
    assert not Tensor((4,)).is_transpose()
    assert not Tensor((3, 1)).transpose().is_transpose(), "a size-1 axis does not make a transpose"
    assert t_of(np.zeros((2, 3, 4), np.float32)).transpose((0, 2, 1)).is_transpose()


def test_is_empty_and_is_dummy():
    assert Tensor().is_empty() and not Tensor((2,)).is_empty()
    assert Tensor((2,)).is_dummy() and not Tensor((2,), name="w").is_dummy()


def test_copy_from_tensor_and_numpy():
    t = Tensor((2, 3))
    t.copy_from(t_of(np.full((2, 3), 4.0, np.float32)))
    assert (tensor.to_numpy(t) == 4).all()
    t.copy_from(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(tensor.to_numpy(t), np.arange(6).reshape(2, 3))
    t.copy_from(np.array([9.0, 9.0], np.float32), offset=4)
    assert tensor.to_numpy(t).reshape(-1).tolist() == [0, 1, 2, 3, 9, 9]
    with pytest.raises(ValueError, match="Tensor or a numpy array"):
        t.copy_from([1, 2, 3, 4, 5, 6])


def test_module_copy_from_numpy_fills_a_c_tensor():
    t = Tensor((2, 2))
    tensor.copy_from_numpy(t.data, np.array([[1, 2], [3, 4]], np.float32))
    np.testing.assert_array_equal(tensor.to_numpy(t), [[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="3 elements"):
        tensor.copy_from_numpy(t.data, np.ones(3, np.float32))


# ---------------------------------------------------------------- row / column updates
@pytest.mark.parametrize("name,fn", [("add_column", lambda m, v: m + v[:, None]),
                                     ("mult_column", lambda m, v: m * v[:, None]),
                                     ("div_column", lambda m, v: m / v[:, None]),
                                     ("add_row", lambda m, v: m + v[None, :]),
                                     ("mult_row", lambda m, v: m * v[None, :]),
                                     ("div_row", lambda m, v: m / v[None, :])])
def test_row_and_column_methods_work_in_place(name, fn):
    m = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    v = np.array([2.0, 4.0], np.float32) if "column" in name else np.array([2.0, 4.0, 8.0], np.float32)
    t = t_of(m)
    getattr(t, name)(t_of(v))
    np.testing.assert_allclose(tensor.to_numpy(t), fn(m, v), rtol=1e-6)
    with pytest.raises(ValueError, match="elements, expected"):
        getattr(t, name)(t_of(np.ones(5, np.float32)))


# ---------------------------------------------------------------- round
def test_round_is_element_wise():
    a = np.array([0.5, 1.5, 2.26, -1.55], np.float32)
    t = t_of(a)
    np.testing.assert_array_equal(tensor.to_numpy(round(t)), np.round(a))
    np.testing.assert_allclose(tensor.to_numpy(round(t, 1)), np.round(a, 1), rtol=1e-6)
    i = t_of(np.array([1234, -1250], np.int32))
    assert tensor.to_numpy(round(i)).tolist() == [1234, -1250]
    r = round(i, -2)
    assert r.dtype == tensor.int32 and tensor.to_numpy(r).tolist() == [1200, -1200]


# ---------------------------------------------------------------- module names
def test_placeholder_ctensor_and_call_singa_func():
    x = tensor.PlaceHolder((2, 3))
    assert isinstance(x, Tensor) and x.shape == (2, 3)
    assert tensor.CTensor is type(x.data)
    from singa_lite import _core

    y = tensor._call_singa_func(_core.exp, t_of(np.zeros(2, np.float32)).data)
    assert isinstance(y, Tensor) and tensor.to_numpy(y).tolist() == [1.0, 1.0]
    with pytest.raises(TypeError, match="expected a C\\+\\+ tensor"):
        tensor._call_singa_func(lambda: 3)


def test_matmul_and_mult_take_a_bool_mask():
    p = np.array([[0.2, 0.8], [0.9, 0.1]], np.float32)
    w = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    mask = tensor.gt(t_of(p), 0.5)
    assert mask.dtype == tensor.bool_
    expected = (p > 0.5).astype(np.float32) @ w
    np.testing.assert_allclose(tensor.to_numpy(tensor.mult(mask, t_of(w))), expected)
    np.testing.assert_allclose(tensor.to_numpy(tensor.matmul(mask, t_of(w))), expected)


@pytest.mark.parametrize("fill", [lambda t, ip: t.gaussian(0, 1, inplace=ip), lambda t, ip: t.uniform(0, 1, inplace=ip),
                                  lambda t, ip: t.bernoulli(1.0, inplace=ip)])
def test_random_fills_inplace_flag(fill):
    t = Tensor((50,))
    assert fill(t, True) is t and tensor.to_numpy(t).any()
    z = Tensor((50,))
    r = fill(z, False)
    assert r is not z and r.shape == (50,) and tensor.to_numpy(r).any()
    assert not tensor.to_numpy(z).any(), "inplace=False leaves the tensor as it was"


def test_module_functions_take_singas_argument_order_and_names():
    from singa_lite import device

    dev = device.get_default_device()
    z, o = tensor.zeros((2, 3), dev), tensor.ones((2,), dev)  # SINGA: the device is the second argument
    assert z.device is dev and not tensor.to_numpy(z).any() and z.dtype == tensor.float32
    assert tensor.to_numpy(o).tolist() == [1.0, 1.0]
    assert tensor.zeros((2,), dtype=tensor.int32).dtype == tensor.int32
    t = t_of(np.arange(6, dtype=np.float32))
    assert tensor.reshape(tensor=t, shape=(2, 3)).shape == (2, 3)
    assert tensor.contiguous(tensor=t.reshape((2, 3)).transpose()).is_contiguous()


def test_as_type_int_and_float_names_mean_int32_and_float32():
    t = t_of(np.array([1.7, -2.2], np.float32))
    i = t.as_type("int")
    assert i.dtype == tensor.int32 and tensor.to_numpy(i).tolist() == [1, -2]
    assert i.as_type("float").dtype == tensor.float32
    assert Tensor((2,)).to_type("int").dtype == tensor.int32


def test_T_reverses_the_axes_of_any_tensor():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(tensor.to_numpy(t_of(a).T()), a.T)
    np.testing.assert_array_equal(tensor.to_numpy(t_of(a[0]).T()), a[0].T)
    assert t_of(a[0, 0]).T().shape == (4,)


def test_constructor_converts_numpy_data_to_an_explicit_dtype():
    a = np.array([1.5, 2.5])  # float64
    assert Tensor(data=a).dtype == tensor.float64, "without dtype the array keeps its own"
    t = Tensor(data=a, dtype=tensor.float32)
    assert t.dtype == tensor.float32 and tensor.to_numpy(t).tolist() == [1.5, 2.5]
    assert Tensor(data=np.array([1, 2], np.int64), dtype="float").dtype == tensor.float32
    assert Tensor((2,)).dtype == tensor.float32 and Tensor((2,), None, tensor.float16).dtype == tensor.float16
