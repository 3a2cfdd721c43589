"""singa_wrap, SINGA's low-level module: the C++ tensor's SINGA names, the free functions, dtype constants and the
operation handles, each checked against numpy (written from SINGA's documented behaviour, not from its tests)."""
import numpy as np
import pytest

from singa_lite import _core, device, tensor
from singa_lite import singa_wrap as sw
from singa_lite.singa_wrap import handles as wh

rng = np.random.default_rng(0)


def ct(a, dtype=None):
    """A raw (C++) tensor holding a copy of a."""
    a = np.asarray(a, dtype=dtype if dtype is not None else np.asarray(a).dtype)
    return tensor.from_numpy(a).data


def npy(t):
    return np.array(t, copy=True)


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------- the C++ tensor's SINGA names
def test_shape_is_a_tuple_that_can_be_called():
    t = ct(np.zeros((2, 3, 4), np.float32))
    assert t.shape == (2, 3, 4) and isinstance(t.shape, tuple)
    assert t.shape() == (2, 3, 4) and t.shape()[1] == 3 and t.shape(2) == 4
    assert hash(t.shape) == hash((2, 3, 4))
    with pytest.raises(IndexError):
        t.shape(3)


def test_device_can_be_called_and_gives_the_same_device():
    t = ct(np.zeros(2, np.float32))
    assert t.device() == t.device == _core.Device("cpu")
    assert tensor.Tensor(data=t).device == device.get_default_device()


def test_sizes_and_dtype():
    t = ct(np.zeros((2, 5), np.float64))
    assert (t.nDim(), t.Size(), t.MemSize(), t.initialized()) == (2, 10, 80, True)
    assert t.data_type() == sw.kDouble
    assert ct(np.zeros(1, np.int32)).data_type() == sw.kInt


def test_dtype_constants_are_our_dtypes():
    assert (sw.kFloat32, sw.kFloat16, sw.kInt, sw.kDouble) == (tensor.float32, tensor.float16, tensor.int32,
                                                               tensor.float64)
    assert [sw.SizeOf(d) for d in (sw.kFloat32, sw.kFloat16, sw.kInt, sw.kDouble)] == [4, 2, 4, 8]
    with pytest.raises(TypeError, match="dtype constant"):
        sw.SizeOf("float32")
    for name in ("kChar", "kUChar"):
        with pytest.raises(AttributeError, match="use kInt"):
            getattr(sw, name)
    with pytest.raises(AttributeError):
        sw.kNoSuchThing  # noqa: B018


def test_singa_constructor_order_shape_device_dtype():
    for dev in (device.get_default_device(), "cpu", _core.Device("cpu")):
        t = sw.Tensor([2, 3], dev, sw.kInt)
        assert t.shape == (2, 3) and t.data_type() == sw.kInt and t.device() == _core.Device("cpu")
    assert sw.Tensor([4]).data_type() == sw.kFloat32  # the default, as SINGA's
    with pytest.raises(TypeError):
        sw.Tensor([2], "cpu", "float32")
    with pytest.raises(ValueError):
        sw.Tensor([2], "tpu:0")


def test_get_values_in_row_major_order_from_views():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = ct(a).transpose([1, 0])  # a strided view
    np.testing.assert_array_equal(t.GetFloatValue(t.Size()), a.T.reshape(-1))
    np.testing.assert_array_equal(t.GetFloatValue(5), a.T.reshape(-1)[:5])
    assert t.GetIntValue(12).dtype == np.int32 and t.GetHalfFloatValue(12).dtype == np.float16
    np.testing.assert_array_equal(ct(np.array([1.7, -2.7], np.float32)).GetIntValue(2), [1, -2])
    with pytest.raises(IndexError, match="at most"):
        t.GetFloatValue(13)
    with pytest.raises(IndexError):
        t.GetFloatValue(-1)


def test_copy_data_from_host():
    t = sw.Tensor([2, 3])
    t.CopyFloatDataFromHostPtr([1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(npy(t), [[1, 2, 3], [4, 5, 6]])
    t.CopyFloatDataFromHostPtr(np.array([9, 8], np.float64), 4)  # at an offset, cast to the tensor's float32
    np.testing.assert_array_equal(npy(t).reshape(-1), [1, 2, 3, 4, 9, 8])
    i = sw.Tensor([3], "cpu", sw.kInt)
    i.CopyIntDataFromHostPtr(np.array([4, 5, 6]))
    np.testing.assert_array_equal(npy(i), [4, 5, 6])
    h = sw.Tensor([2], "cpu", sw.kFloat16)
    h.CopyHalfFloatDataFromHostPtr([0.5, 1.5])
    np.testing.assert_array_equal(npy(h), np.array([0.5, 1.5], np.float16))
    with pytest.raises(TypeError, match="CopyIntDataFromHostPtr"):
        t.CopyIntDataFromHostPtr([1, 2])
    with pytest.raises(IndexError, match="do not fit"):
        t.CopyFloatDataFromHostPtr([1, 2, 3], 4)
    with pytest.raises(ValueError, match="non-contiguous"):
        t.transpose([1, 0]).CopyFloatDataFromHostPtr([1])
    with pytest.raises(TypeError, match="None"):
        t.CopyFloatDataFromHostPtr(None)


def test_copy_data_same_size():
    dst = ct(np.zeros((2, 3), np.float32))
    dst.CopyData(ct(np.arange(6, dtype=np.float32).reshape(3, 2)))  # element by element, any shape
    np.testing.assert_array_equal(npy(dst), np.arange(6).reshape(2, 3))
    with pytest.raises(ValueError, match="elements"):
        dst.CopyData(ct(np.zeros(5, np.float32)))
    with pytest.raises(TypeError, match="AsType"):
        dst.CopyData(ct(np.zeros(6, np.int32)))


def test_as_type_copies_and_to_type_converts_in_place():
    a = np.array([-2.7, 0.4, 3.9], np.float32)
    t = ct(a)
    i = t.AsType(sw.kInt)
    assert i.data_type() == sw.kInt
    np.testing.assert_array_equal(npy(i), a.astype(np.int32))  # truncation toward zero, as a C cast
    same = t.AsType(sw.kFloat32)
    same.SetFloatValue(7)
    np.testing.assert_array_equal(npy(t), a)  # AsType to the same dtype is still a copy
    np.testing.assert_array_equal(npy(same), [7, 7, 7])
    assert t.ToType(sw.kDouble) is t and t.data_type() == sw.kDouble
    np.testing.assert_allclose(npy(t), a)


def test_to_device_to_host_reset_like_clone():
    t = ct(np.ones((2, 2), np.float32))
    t.ToDevice(device.get_default_device())
    t.ToDevice("cpu")
    t.ToHost()
    assert t.device() == _core.Device("cpu")
    c = t.Clone()
    c.SetFloatValue(3)
    np.testing.assert_array_equal(npy(t), np.ones((2, 2)))
    t.ResetLike(ct(np.ones((3,), np.int32)))
    assert t.shape == (3,) and t.data_type() == sw.kInt
    np.testing.assert_array_equal(npy(t), [0, 0, 0])


def test_repeat_as_numpy():
    a = randn(2, 3)
    t = ct(a)
    np.testing.assert_array_equal(npy(t.Repeat([2])), np.repeat(a, 2))  # no axis: flattened
    np.testing.assert_array_equal(npy(t.Repeat([2], 9999)), np.repeat(a, 2))  # SINGA's Noaxis
    np.testing.assert_array_equal(npy(t.Repeat([3], 1)), np.repeat(a, 3, axis=1))
    np.testing.assert_array_equal(npy(t.Repeat([1, 0, 2], -1)), np.repeat(a, [1, 0, 2], axis=1))
    np.testing.assert_array_equal(npy(t.transpose([1, 0]).Repeat([2], 0)), np.repeat(a.T, 2, axis=0))
    assert t.Repeat([0, 0], 0).shape == (0, 3)
    with pytest.raises(ValueError, match="2 counts for an axis of size 3"):
        t.Repeat([1, 2], 1)
    with pytest.raises(ValueError, match=">= 0"):
        t.Repeat([-1])
    with pytest.raises(IndexError, match="out of range"):
        t.Repeat([2], 2)


def test_norms_are_divided_by_the_size():
    a = randn(3, 4)
    t = ct(a)
    assert t.L1() == pytest.approx(np.abs(a).sum() / a.size, rel=1e-6)
    assert t.L2() == pytest.approx(np.sqrt((a.astype(np.float64) ** 2).sum()) / a.size, rel=1e-6)


# ---------------------------------------------------------------- free functions
UNARY = [("Abs", np.abs), ("Ceil", np.ceil), ("Floor", np.floor), ("Exp", np.exp), ("ReLU", lambda x: np.maximum(x, 0)),
         ("Sigmoid", lambda x: 1 / (1 + np.exp(-x))), ("Sign", np.sign), ("Square", np.square), ("Sin", np.sin),
         ("Cos", np.cos), ("Tanh", np.tanh), ("Tan", np.tan), ("Sinh", np.sinh), ("Cosh", np.cosh)]


@pytest.mark.parametrize("name,ref", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, ref):
    a = randn(3, 5) * 2
    np.testing.assert_allclose(npy(getattr(sw, name)(ct(a))), ref(a), rtol=1e-5, atol=1e-6)


def test_log_sqrt_erf():
    a = np.abs(randn(7)) + 0.1
    np.testing.assert_allclose(npy(sw.Log(ct(a))), np.log(a), rtol=1e-6)
    np.testing.assert_allclose(npy(sw.Sqrt(ct(a))), np.sqrt(a), rtol=1e-6)
    from math import erf
    np.testing.assert_allclose(npy(sw.Erf(ct(a - 1))), [erf(v) for v in a - 1], rtol=1e-5, atol=1e-6)


def test_inverse_hyperbolic():
    a = np.array([-30.0, -2.0, -1e-4, 0.0, 3e-5, 0.5, 4.0, 1e3], np.float32)
    np.testing.assert_allclose(npy(sw.Asinh(ct(a))), np.arcsinh(a), rtol=1e-5)
    b = np.array([1.0, 1.5, 10.0, 1e4], np.float32)
    np.testing.assert_allclose(npy(sw.Acosh(ct(b))), np.arccosh(b), rtol=1e-5, atol=1e-6)
    c = np.array([-0.99, -0.5, -1e-5, 0.0, 2e-4, 0.9], np.float32)
    np.testing.assert_allclose(npy(sw.Atanh(ct(c))), np.arctanh(c), rtol=1e-5)


def test_round_and_round_half_even():
    q = np.array([0.1, 0.5, 0.9, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, -2.6, 4.0, -0.2], np.float32)
    np.testing.assert_array_equal(npy(sw.RoundE(ct(q))), np.round(q))  # numpy rounds halves to even
    np.testing.assert_array_equal(npy(sw.Round(ct(q))), np.sign(q) * np.floor(np.abs(q) + 0.5))  # away from 0
    np.testing.assert_array_equal(npy(sw.RoundE(ct(np.array([3, -4], np.int32)))), [3, -4])


BINARY = [("Pow", np.power), ("__add__", np.add), ("__sub__", np.subtract), ("__mul__", np.multiply),
          ("__div__", np.divide)]


@pytest.mark.parametrize("name,ref", BINARY, ids=[b[0] for b in BINARY])
@pytest.mark.parametrize("s1,s2", [((2, 3), (2, 3)), ((3, 1, 2), (3, 1, 1)), ((4, 5), (2, 3, 4, 5)), ((6,), (1,))])
def test_binary_broadcasts(name, ref, s1, s2):
    a, b = np.abs(randn(*s1)) + 0.5, randn(*s2)
    np.testing.assert_allclose(npy(getattr(sw, name)(ct(a), ct(b))), ref(a, b), rtol=1e-5)


def test_binary_on_transposed_views():
    a, b = randn(1, 5, 1, 3), randn(3, 1, 1, 4)
    r = sw.__add__(ct(a).transpose([3, 2, 1, 0]), ct(b).transpose([1, 0, 2, 3]))
    np.testing.assert_allclose(npy(r), a.transpose(3, 2, 1, 0) + b.transpose(1, 0, 2, 3))


def test_comparisons_give_zero_or_one_in_the_input_dtype():
    a, b = np.array([1, 2, 3], np.float32), np.array([2, 2, 2], np.float32)
    for name, ref in (("__lt__", np.less), ("__le__", np.less_equal), ("__gt__", np.greater),
                      ("__ge__", np.greater_equal), ("__eq__", np.equal)):
        r = getattr(sw, name)(ct(a), ct(b))
        assert r.data_type() == sw.kFloat32
        np.testing.assert_array_equal(npy(r), ref(a, b).astype(np.float32))
    for name, ref in (("LTFloat", np.less), ("LEFloat", np.less_equal), ("GTFloat", np.greater),
                      ("GEFloat", np.greater_equal), ("EQFloat", np.equal)):
        np.testing.assert_array_equal(npy(getattr(sw, name)(ct(a), 2.0)), ref(a, 2.0).astype(np.float32))


def test_scalar_functions_and_with_ret():
    a = randn(2, 3)
    for name, ref in (("AddFloat", np.add), ("SubFloat", np.subtract), ("MultFloat", np.multiply),
                      ("DivFloat", np.divide)):
        np.testing.assert_allclose(npy(getattr(sw, name)(ct(a), 1.5)), ref(a, 1.5), rtol=1e-6)
    np.testing.assert_allclose(npy(sw.PowFloat(ct(np.abs(a)), 1.5)), np.abs(a) ** 1.5, rtol=1e-5)
    b = randn(2, 3)
    for name, ref in (("Add", np.add), ("Sub", np.subtract), ("EltwiseMult", np.multiply), ("Div", np.divide)):
        ret = ct(np.zeros((2, 3), np.float32))
        assert getattr(sw, name)(ct(a), ct(b), ret) is None
        np.testing.assert_allclose(npy(ret), ref(a, b), rtol=1e-6)
        getattr(sw, name)(ct(a), 2.0, ret)  # a number as rhs
        np.testing.assert_allclose(npy(ret), ref(a, 2.0), rtol=1e-6)
    for name, ref in (("AddFloatWithRet", np.add), ("SubFloatWithRet", np.subtract),
                      ("EltwiseMultFloatWithRet", np.multiply), ("DivFloatWithRet", np.divide)):
        ret = ct(np.zeros((2, 3), np.float32))
        getattr(sw, name)(ct(a), 0.5, ret)
        np.testing.assert_allclose(npy(ret), ref(a, 0.5), rtol=1e-6)
    ret = ct(np.zeros((2, 3), np.float32))
    sw.PowWithRet(ct(np.abs(a)), ct(b), ret)
    np.testing.assert_allclose(npy(ret), np.abs(a) ** b, rtol=1e-5)
    with pytest.raises(ValueError, match="allocate ret"):
        sw.Add(ct(a), ct(b), ct(np.zeros(6, np.float32)))


def test_reductions():
    a = randn(3, 4)
    np.testing.assert_allclose(npy(sw.Sum(ct(a), 0)), a.sum(0), rtol=1e-6)
    np.testing.assert_allclose(npy(sw.Sum(ct(a), 1)), a.sum(1), rtol=1e-6)
    np.testing.assert_allclose(npy(sw.Average(ct(a), 1)), a.mean(1), rtol=1e-6)
    s = sw.SumAll(ct(a))
    assert s.shape == (1,)
    np.testing.assert_allclose(npy(s), [a.sum()], rtol=1e-5)
    assert sw.SumAsFloat(ct(a)) == pytest.approx(float(a.sum()), rel=1e-5)
    with pytest.raises(IndexError, match="out of range"):
        sw.Sum(ct(a), 2)


def _softmax_rows(x, axis):
    """SINGA's SoftMax(x, axis): rows = prod(shape[:axis]), each normalised over the rest."""
    axis = axis % x.ndim
    m = x.reshape(int(np.prod(x.shape[:axis])), -1)
    e = np.exp(m - m.max(1, keepdims=True))
    return (e / e.sum(1, keepdims=True)).reshape(x.shape)


@pytest.mark.parametrize("shape,axis", [((2, 3), 1), ((2, 3), 0), ((2, 3, 4), 1), ((2, 3, 4), -1), ((2, 3, 4), -3)])
def test_softmax_over_the_trailing_axes(shape, axis):
    x = randn(*shape) + 100
    np.testing.assert_allclose(npy(sw.SoftMax(ct(x), axis)), _softmax_rows(x, axis), rtol=1e-5, atol=1e-7)


def test_softmax_default_axis_and_bad_axis():
    x, v = randn(3, 4, 2), randn(5)
    np.testing.assert_allclose(npy(sw.SoftMax(ct(x))), _softmax_rows(x, 1), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(npy(sw.SoftMax(ct(v))), _softmax_rows(v, 0), rtol=1e-5, atol=1e-7)
    with pytest.raises(IndexError, match="out of range"):
        sw.SoftMax(ct(v), 1)


def test_softmax_backward_and_relu_backward():
    x, dy = randn(2, 3, 4), randn(2, 3, 4)
    y = _softmax_rows(x, 1)
    rows_y, rows_d = y.reshape(2, 12), dy.reshape(2, 12)
    want = rows_y * (rows_d - (rows_d * rows_y).sum(1, keepdims=True))
    np.testing.assert_allclose(npy(sw.SoftMaxBackward(ct(dy), 1, ct(y))), want.reshape(x.shape), rtol=1e-5,
                               atol=1e-7)
    np.testing.assert_allclose(npy(sw.ReLUBackward(ct(dy), ct(x))), dy * (x > 0))


def test_cross_entropy():
    p = _softmax_rows(randn(4, 5), 1)
    labels = np.array([0, 3, 4, 1], np.int32)
    onehot = np.eye(5, dtype=np.float32)[labels]
    want = -np.log(p[np.arange(4), labels])
    np.testing.assert_allclose(npy(sw.CrossEntropyFwd(ct(p), ct(labels))), want, rtol=1e-5)
    np.testing.assert_allclose(npy(sw.CrossEntropyFwd(ct(p), ct(onehot))), want, rtol=1e-5)
    np.testing.assert_allclose(npy(sw.SoftmaxCrossEntropyBwd(ct(p), ct(labels))), p - onehot, rtol=1e-6)
    with pytest.raises(ValueError, match="one label per row"):
        sw.CrossEntropyFwd(ct(p), ct(np.zeros(3, np.int32)))


def test_blas():
    A, B, C = randn(3, 4), randn(4, 2), randn(3, 2)
    np.testing.assert_allclose(npy(sw.Mult(ct(A), ct(B))), A @ B, rtol=1e-5)
    ret = ct(np.zeros((3, 2), np.float32))
    sw.MultWithRet(ct(A), ct(B), ret)
    np.testing.assert_allclose(npy(ret), A @ B, rtol=1e-5)
    c = ct(C)
    sw.MultWithScale(2.0, ct(A), ct(B), 0.5, c)
    np.testing.assert_allclose(npy(c), 2 * A @ B + 0.5 * C, rtol=1e-5, atol=1e-6)
    y = ct(C)
    sw.Axpy(3.0, ct(B[:3]), y)
    np.testing.assert_allclose(npy(y), C + 3 * B[:3], rtol=1e-6)
    sw.Axpy(ct(np.array([-1.0], np.float32)), ct(C), y)  # a one-element tensor alpha
    np.testing.assert_allclose(npy(y), 3 * B[:3], rtol=1e-5, atol=1e-6)


def test_matrix_vector_ops():
    M, col, row = randn(3, 4), np.abs(randn(3)) + 1, np.abs(randn(4)) + 1
    cases = [("AddColumn", col, lambda m: m + col[:, None]), ("AddRow", row, lambda m: m + row),
             ("SubColumn", col, lambda m: m - col[:, None]), ("SubRow", row, lambda m: m - row),
             ("MultColumn", col, lambda m: m * col[:, None]), ("MultRow", row, lambda m: m * row),
             ("DivColumn", col, lambda m: m / col[:, None]), ("DivRow", row, lambda m: m / row)]
    for name, v, ref in cases:
        m = ct(M)
        getattr(sw, name)(ct(v), m)
        np.testing.assert_allclose(npy(m), ref(M), rtol=1e-6, err_msg=name)
    m = ct(M)
    sw.AddColumnWithScale(2.0, 0.5, ct(col), m)
    np.testing.assert_allclose(npy(m), 0.5 * M + 2 * col[:, None], rtol=1e-6)
    m = ct(M)
    sw.AddRowWithScale(2.0, 0.5, ct(row), m)
    np.testing.assert_allclose(npy(m), 0.5 * M + 2 * row, rtol=1e-6)
    v = ct(np.zeros(3, np.float32))
    sw.SumColumns(ct(M), v)
    np.testing.assert_allclose(npy(v), M.sum(1), rtol=1e-6)
    v = ct(np.zeros(4, np.float32))
    sw.SumRows(ct(M), v)
    np.testing.assert_allclose(npy(v), M.sum(0), rtol=1e-6)
    with pytest.raises(ValueError, match="rows"):
        sw.AddColumn(ct(row), ct(M))


def test_shapes_concat_slice_copy():
    a = randn(2, 3, 4)
    np.testing.assert_array_equal(npy(sw.Reshape(ct(a), [4, 6])), a.reshape(4, 6))
    np.testing.assert_array_equal(npy(sw.Transpose(ct(a), [2, 0, 1])), a.transpose(2, 0, 1))
    np.testing.assert_array_equal(npy(sw.DefaultTranspose(ct(a))), a.T)
    view = ct(a).transpose([1, 0, 2])
    assert not view.is_contiguous() and sw.Contiguous(view).is_contiguous()
    vec = sw.VecTensor()
    vec.append(ct(a))
    vec.append(ct(a[:, :1]))
    assert len(vec) == 2
    np.testing.assert_array_equal(npy(sw.ConcatOn(vec, 1)), np.concatenate([a, a[:, :1]], 1))
    with pytest.raises(TypeError, match="singa_wrap.Tensor"):
        vec.append(a)
    s = sw.SliceOn(ct(a), 1, 3, 2)
    np.testing.assert_array_equal(npy(s), a[:, :, 1:3])
    assert s.is_contiguous()
    dst = ct(np.zeros(10, np.float32))
    sw.CopyDataToFrom(dst, ct(np.arange(5, dtype=np.float32)), 3, 1, 4)  # num, src_offset, dst_offset
    np.testing.assert_array_equal(npy(dst), [0, 0, 0, 0, 1, 2, 3, 0, 0, 0])
    with pytest.raises(IndexError, match="outside"):
        sw.CopyDataToFrom(dst, ct(np.arange(5, dtype=np.float32)), 3, 3, 0)


def test_random_fills():
    t = sw.Tensor([20000])
    sw.Gaussian(1.0, 2.0, t)
    v = npy(t)
    assert abs(v.mean() - 1.0) < 0.06 and abs(v.std() - 2.0) < 0.06
    sw.Uniform(-1.0, 3.0, t)
    v = npy(t)
    assert v.min() >= -1.0 and v.max() <= 3.0 and abs(v.mean() - 1.0) < 0.05
    sw.Bernoulli(0.25, t)
    v = npy(t)
    assert set(np.unique(v)) <= {0.0, 1.0} and abs(v.mean() - 0.25) < 0.02


def test_python_tensor_instead_of_raw_says_to_pass_data():
    with pytest.raises(TypeError, match="pass its .data"):
        sw.Abs(tensor.from_numpy(np.ones(2, np.float32)))
    with pytest.raises(TypeError, match="number"):
        sw.AddFloat(ct(np.ones(2, np.float32)), "1")


def test_product():
    assert sw.Product([2, 3, 4]) == 24 and sw.Product([2, 3, 4], 1) == 12 and sw.Product([2, 3, 4], 0, 2) == 6


# ---------------------------------------------------------------- handles
def _np_conv(x, W, b, stride, pad, groups):
    N, C, H, Wd = x.shape
    OC, Cg, kh, kw = W.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    oh, ow = (H + 2 * pad[0] - kh) // stride[0] + 1, (Wd + 2 * pad[1] - kw) // stride[1] + 1
    y = np.zeros((N, OC, oh, ow), np.float64)
    OCg = OC // groups
    for o in range(OC):
        g = o // OCg
        for i in range(oh):
            for j in range(ow):
                win = xp[:, g * Cg:(g + 1) * Cg, i * stride[0]:i * stride[0] + kh, j * stride[1]:j * stride[1] + kw]
                y[:, o, i, j] = (win * W[o]).sum(axis=(1, 2, 3)) + (b[o] if b is not None else 0)
    return y


@pytest.mark.parametrize("groups,stride,pad,bias", [(1, (1, 1), (0, 0), True), (2, (2, 1), (1, 2), True),
                                                    (1, (2, 2), (1, 1), False)])
def test_conv_forward_and_backward(groups, stride, pad, bias):
    x, W, b = randn(2, 4, 6, 5), randn(6, 4 // groups, 3, 2), randn(6)
    h = sw.ConvHandle(ct(x), [3, 2], list(stride), list(pad), 4, 6, bias, groups)
    assert (h.kernel_h, h.kernel_w, h.stride_h, h.pad_w, h.channels, h.num_filters, h.group, h.bias_term) == (
        3, 2, stride[0], pad[1], 4, 6, groups, bias)
    y = sw.CpuConvForward(ct(x), ct(W), ct(b), h)
    np.testing.assert_allclose(npy(y), _np_conv(x, W, b if bias else None, stride, pad, groups), rtol=1e-4,
                               atol=1e-5)
    # the backward is the adjoint of the forward: <dy, conv(x)> is linear in x and in W
    dy = randn(*y.shape)
    dx = npy(sw.CpuConvBackwardx(ct(dy), ct(W), ct(x), h))
    dW = npy(sw.CpuConvBackwardW(ct(dy), ct(x), ct(W), h))
    ex, eW = randn(*x.shape), randn(*W.shape)
    f = lambda xx, ww: (dy * _np_conv(xx, ww, None, stride, pad, groups)).sum()  # noqa: E731
    assert (dx * ex).sum() == pytest.approx(f(ex, W), rel=1e-4, abs=1e-4)
    assert (dW * eW).sum() == pytest.approx(f(x, eW), rel=1e-4, abs=1e-4)
    db = sw.CpuConvBackwardb(ct(dy), ct(b), h)
    np.testing.assert_allclose(npy(db), dy.sum(axis=(0, 2, 3)), rtol=1e-5, atol=1e-5)


def test_conv_handle_refuses_bad_arguments():
    x = ct(randn(1, 3, 5, 5))
    with pytest.raises(ValueError, match="in_channels"):
        sw.ConvHandle(x, [3, 3], [1, 1], [0, 0], 2, 4, True, 1)
    with pytest.raises(ValueError, match="groups"):
        sw.ConvHandle(x, [3, 3], [1, 1], [0, 0], 3, 4, True, 2)
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        sw.ConvHandle(ct(randn(3, 5, 5)), [3, 3], [1, 1], [0, 0], 3, 4, True, 1)
    h = sw.ConvHandle(x, [3, 3], [1, 1], [0, 0], 3, 4, True, 1)
    with pytest.raises(ValueError, match="W must have shape"):
        sw.CpuConvForward(x, ct(randn(4, 3, 2, 2)), ct(randn(4)), h)
    with pytest.raises(ValueError, match="b must have 4"):
        sw.CpuConvForward(x, ct(randn(4, 3, 3, 3)), ct(randn(3)), h)
    with pytest.raises(TypeError, match="ConvHandle"):
        sw.CpuConvForward(x, ct(randn(4, 3, 3, 3)), ct(randn(4)), sw.PoolingHandle(x, [2, 2], [1, 1], [0, 0]))
    with pytest.raises(ValueError, match="dy must have shape"):
        sw.CpuConvBackwardx(ct(randn(1, 4, 2, 2)), ct(randn(4, 3, 3, 3)), x, h)


def _np_pool(x, k, s, p, is_max):
    N, C, H, W = x.shape
    oh, ow = (H + 2 * p[0] - k[0]) // s[0] + 1, (W + 2 * p[1] - k[1]) // s[1] + 1
    y = np.zeros((N, C, oh, ow), np.float64)
    for i in range(oh):
        for j in range(ow):
            r0, c0 = i * s[0] - p[0], j * s[1] - p[1]
            win = x[:, :, max(r0, 0):min(r0 + k[0], H), max(c0, 0):min(c0 + k[1], W)]
            y[:, :, i, j] = win.max(axis=(2, 3)) if is_max else win.mean(axis=(2, 3))  # padding excluded
    return y


@pytest.mark.parametrize("is_max", [True, False])
@pytest.mark.parametrize("k,s,p", [([2, 2], [1, 1], [0, 0]), ([3, 2], [2, 2], [1, 1])])
def test_pooling(is_max, k, s, p):
    x = (rng.permutation(180).reshape(2, 3, 5, 6) * 0.1).astype(np.float32)  # values 0.1 apart: no near-ties
    h = sw.PoolingHandle(ct(x), k, s, p, is_max)
    assert (h.kernel_h, h.stride_w, h.pad_h, h.is_max_pooling) == (k[0], s[1], p[0], is_max)
    y = sw.CpuPoolingForward(h, ct(x))
    want = _np_pool(x, k, s, p, is_max)
    assert (h.pooled_height, h.pooled_width) == want.shape[2:]
    np.testing.assert_allclose(npy(y), want, rtol=1e-6, atol=1e-6)
    # backward: the adjoint of pooling (max pooling's is linear once the maxima are fixed)
    dy = randn(*y.shape)
    dx = npy(sw.CpuPoolingBackward(h, ct(dy), ct(x), y))
    if is_max:
        eps = 1e-3 * np.clip(randn(*x.shape), -3, 3)  # far below the gaps: every window keeps its maximum
        assert (dx * eps).sum() == pytest.approx((dy * (_np_pool(x + eps, k, s, p, True) - want)).sum(), rel=1e-2)
    else:
        e = randn(*x.shape)
        assert (dx * e).sum() == pytest.approx((dy * _np_pool(e, k, s, p, False)).sum(), rel=1e-4)
    with pytest.raises(ValueError, match="forward output's shape"):
        sw.CpuPoolingBackward(h, ct(randn(1, 1, 1, 1)), ct(x), y)


def _np_bn(x, scale, bias, eps=1e-5):
    axes = (0,) if x.ndim == 2 else (0, 2, 3)
    shape = (1, -1) if x.ndim == 2 else (1, -1, 1, 1)
    m, v = x.mean(axes, keepdims=True), x.var(axes, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * scale.reshape(shape) + bias.reshape(shape), m, v


@pytest.mark.parametrize("xshape,pshape", [((4, 3, 5, 2), (1, 3, 1, 1)), ((6, 3), (3,)), ((4, 3, 2, 2), (3,))])
def test_batchnorm_training_inference_backward(xshape, pshape):
    x, scale, bias = randn(*xshape) * 3 + 1, randn(*pshape), randn(*pshape)
    rm0, rv0 = randn(*pshape), np.abs(randn(*pshape)) + 0.5
    h = sw.BatchNormHandle(0.2, ct(x))
    assert h.factor == pytest.approx(0.2) and h.batchsize == xshape[0]
    rm, rv = ct(rm0), ct(rv0)
    y, mean, var = sw.CpuBatchNormForwardTraining(h, ct(x), ct(scale), ct(bias), rm, rv)
    y_np, m_np, v_np = _np_bn(x, scale, bias)
    np.testing.assert_allclose(npy(y), y_np, rtol=1e-4, atol=1e-5)
    assert mean.shape == pshape and var.shape == pshape  # the statistics in the running tensors' shape
    np.testing.assert_allclose(npy(mean).reshape(-1), m_np.reshape(-1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(npy(var).reshape(-1), v_np.reshape(-1), rtol=1e-5)
    M = x.size // xshape[1]
    np.testing.assert_allclose(npy(rm).reshape(-1), 0.8 * rm0.reshape(-1) + 0.2 * m_np.reshape(-1), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(npy(rv).reshape(-1), 0.8 * rv0.reshape(-1) + 0.2 * v_np.reshape(-1) * M / (M - 1),
                               rtol=1e-5)
    # inference: the affine map with the running statistics
    shape = (1, -1) if x.ndim == 2 else (1, -1, 1, 1)
    yi = sw.CpuBatchNormForwardInference(h, ct(x), ct(scale), ct(bias), ct(rm0), ct(rv0))
    want = (x - rm0.reshape(shape)) / np.sqrt(rv0.reshape(shape) + 1e-5) * scale.reshape(shape) + bias.reshape(shape)
    np.testing.assert_allclose(npy(yi), want, rtol=1e-4, atol=1e-5)
    # backward against a central difference of sum(dy * y) in float64
    dy = randn(*xshape)
    dx, ds, db = sw.CpuBatchNormBackwardx(h, y, ct(dy), ct(x), ct(scale), ct(bias), mean, var)
    assert ds.shape == pshape and db.shape == pshape
    x64, s64, b64 = x.astype(np.float64), scale.astype(np.float64), bias.astype(np.float64)
    e = rng.standard_normal(x.shape)
    f = lambda xx: (dy * _np_bn(xx, s64, b64)[0]).sum()  # noqa: E731
    num = (f(x64 + 1e-4 * e) - f(x64 - 1e-4 * e)) / 2e-4
    assert (npy(dx) * e).sum() == pytest.approx(num, rel=1e-3, abs=1e-3)
    xhat = (x64 - _np_bn(x64, s64, b64)[1]) / np.sqrt(_np_bn(x64, s64, b64)[2] + 1e-5)
    axes = (0,) if x.ndim == 2 else (0, 2, 3)
    np.testing.assert_allclose(npy(ds).reshape(-1), (dy * xhat).sum(axes), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(npy(db).reshape(-1), dy.sum(axes), rtol=1e-5, atol=1e-5)


def test_batchnorm_refuses_bad_arguments():
    x = ct(randn(4, 3, 2, 2))
    with pytest.raises(ValueError, match="momentum"):
        sw.BatchNormHandle(1.5, x)
    h = sw.BatchNormHandle(0.1, x)
    p = ct(randn(3))
    with pytest.raises(ValueError, match="scale must have 3 elements"):
        sw.CpuBatchNormForwardInference(h, x, ct(randn(2)), p, p, p)
    with pytest.raises(TypeError, match="float64"):
        sw.CpuBatchNormForwardInference(h, x, ct(randn(3).astype(np.float64)), p, p, p)
    with pytest.raises(ValueError, match="more than one value"):
        sw.CpuBatchNormForwardTraining(h, ct(randn(1, 3)), p, p, ct(randn(3)), ct(randn(3)))
    with pytest.raises(TypeError, match="BatchNormHandle"):
        sw.CpuBatchNormForwardInference(object(), x, p, p, p, p)


def test_cudnn_names_only_in_a_cuda_build_and_their_conventions():
    assert hasattr(sw, "GpuBatchNormForwardTraining") == sw.USE_CUDA
    assert hasattr(sw, "CudnnConvHandle") == sw.USE_CUDA
    # they compute on any device; the batch-norm training returns 1 / sqrt(var + eps) as cuDNN does
    x, scale, bias = randn(4, 2, 3, 3), randn(1, 2, 1, 1), randn(1, 2, 1, 1)
    h = wh.CudnnBatchNormHandle(0.1, ct(x))
    y, mean, inv_std = wh.GpuBatchNormForwardTraining(h, ct(x), ct(scale), ct(bias), ct(np.zeros((1, 2, 1, 1),
                                                      np.float32)), ct(np.ones((1, 2, 1, 1), np.float32)))
    _, m_np, v_np = _np_bn(x, scale, bias)
    np.testing.assert_allclose(npy(inv_std), 1 / np.sqrt(v_np + 1e-5), rtol=1e-5)
    dy = randn(*x.shape)
    gpu = wh.GpuBatchNormBackward(h, ct(dy), ct(x), ct(scale), mean, inv_std)
    _, _, var = sw.CpuBatchNormForwardTraining(h, ct(x), ct(scale), ct(bias), ct(np.zeros((1, 2, 1, 1), np.float32)),
                                               ct(np.ones((1, 2, 1, 1), np.float32)))
    cpu = sw.CpuBatchNormBackwardx(h, y, ct(dy), ct(x), ct(scale), ct(bias), mean, var)
    for g, c in zip(gpu, cpu):
        np.testing.assert_allclose(npy(g), npy(c), rtol=1e-5, atol=1e-6)
    ch = wh.CudnnConvHandle(ct(x), [2, 2], [1, 1], [0, 0], 2, 3, True, 1, prefer="fastest")
    W, b = randn(3, 2, 2, 2), randn(3)
    np.testing.assert_allclose(npy(wh.GpuConvForward(ct(x), ct(W), ct(b), ch)),
                               npy(sw.CpuConvForward(ct(x), ct(W), ct(b), ch)))


def test_python_tensor_accepts_relabelling_with_its_own_values_only():
    # SINGA's helpers set shape / device / dtype after assigning .data
    t = tensor.Tensor()
    t.data = ct(np.ones((2, 3), np.int32))
    t.shape = tuple(t.data.shape())
    t.device = t.data.device()
    t.dtype = t.data.data_type()
    assert t.shape == (2, 3) and t.dtype == tensor.int32
    with pytest.raises(ValueError, match="reshape"):
        t.shape = (3, 2)
    with pytest.raises(ValueError, match="as_type"):
        t.dtype = sw.kFloat32
