"""The SINGA-compatible Python API: singa_lite.tensor and singa_lite.device."""
import pickle

import numpy as np
import pytest

import singa_lite
from singa_lite import device, tensor
from singa_lite.tensor import Tensor


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def t_of(a):
    return tensor.from_numpy(np.asarray(a))


# ---------------------------------------------------------------- construction and attributes
def test_constructor_follows_singa_positional_order():
    dev = device.get_default_device()
    t = Tensor((4, 1, 28, 28), dev, tensor.float32)
    assert t.shape == (4, 1, 28, 28)
    assert t.dtype == tensor.float32
    assert t.device is dev
    assert t.ndim() == 4 and t.size() == 4 * 28 * 28 and t.memsize() == 4 * 28 * 28 * 4
    assert not tensor.to_numpy(t).any(), "a new tensor is zero-filled"
    assert t.requires_grad and not t.stores_grad and t.creator is None and t.name is None
    ti = Tensor((3, 10), dev, tensor.int32)
    assert tensor.to_numpy(ti).dtype == np.int32


def test_constructor_from_numpy_copies(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    t = Tensor(data=a)
    a[0, 0] = 99
    assert tensor.to_numpy(t)[0, 0] != 99
    assert t.dtype == tensor.float32 and t.shape == (3, 4)


@pytest.mark.parametrize("np_dtype,expected", [
    (np.float16, tensor.float16), (np.float32, tensor.float32), (np.float64, tensor.float64),
    (np.int32, tensor.int32), (np.int64, tensor.int64), (np.bool_, tensor.bool_),
    (np.uint8, tensor.int32), (np.int16, tensor.int32)])
def test_from_numpy_dtypes(np_dtype, expected):
    a = np.arange(6).reshape(2, 3).astype(np_dtype)
    t = tensor.from_numpy(a)
    assert t.dtype == expected
    np.testing.assert_array_equal(tensor.to_numpy(t), a.astype(tensor.numpy_dtype(expected)))


def test_from_numpy_rejects_complex():
    with pytest.raises(TypeError, match="astype"):
        tensor.from_numpy(np.zeros(3, np.complex64))


def test_copy_from_numpy_and_size_check(rng):
    t = Tensor((2, 3))
    a = rng.standard_normal((2, 3)).astype(np.float32)
    t.copy_from_numpy(a)
    np.testing.assert_array_equal(tensor.to_numpy(t), a)
    t.copy_from_numpy(np.arange(6, dtype=np.float64))  # cast and reshaped, as SINGA
    np.testing.assert_array_equal(tensor.to_numpy(t).ravel(), np.arange(6))
    with pytest.raises(ValueError, match="copy_from_numpy"):
        t.copy_from_numpy(np.zeros(5, np.float32))


def test_to_numpy_is_a_copy_but_array_shares(rng):
    t = tensor.from_numpy(rng.standard_normal(5).astype(np.float32))
    copy = tensor.to_numpy(t)
    copy[0] = 42
    assert tensor.to_numpy(t)[0] != 42
    shared = np.asarray(t)
    shared[0] = 42
    assert tensor.to_numpy(t)[0] == 42


def test_dlpack_roundtrip_is_zero_copy():
    t = tensor.from_numpy(np.arange(4, dtype=np.float32))
    a = np.from_dlpack(t)
    a[1] = -1
    assert tensor.to_numpy(t)[1] == -1


def test_clone_copy_data_set_value():
    t = t_of(np.arange(6, dtype=np.float32).reshape(2, 3))
    c = t.clone()
    c.set_value(3)
    assert (tensor.to_numpy(c) == 3).all() and tensor.to_numpy(t)[0, 0] == 0
    t.copy_data(c)
    assert (tensor.to_numpy(t) == 3).all()
    assert tensor.to_numpy(tensor.zeros_like(t)).sum() == 0
    assert (tensor.to_numpy(tensor.ones_like(t)) == 1).all()


def test_as_type_and_to_type():
    t = t_of(np.array([1.7, -2.2, 3.5], np.float32))
    i = t.as_type(tensor.int32)
    assert i.dtype == tensor.int32 and t.dtype == tensor.float32
    np.testing.assert_array_equal(tensor.to_numpy(i), [1, -2, 3])
    assert t.as_type(tensor.float32) is t
    t.to_type(tensor.float16)
    assert t.dtype == tensor.float16
    assert tensor.to_numpy(t.as_type("float64")).dtype == np.float64
    with pytest.raises(TypeError, match="unsupported dtype"):
        t.as_type("complex64")


def test_to_device_and_host_on_cpu():
    t = t_of(np.ones(3, np.float32))
    assert t.to_device(device.create_cpu_device()) is t
    assert t.to_host().device.is_cpu()
    h = tensor.to_host(t)
    h.set_value(5)
    assert tensor.to_numpy(t)[0] == 1, "tensor.to_host returns a copy"


# ---------------------------------------------------------------- operators
def test_arithmetic_with_scalars_tensors_and_numpy(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((4,)).astype(np.float32) + 3
    ta, tb = t_of(a), t_of(b)
    cases = {
        "add": (ta + tb, a + b), "radd": (2 + ta, 2 + a), "sub": (ta - tb, a - b), "rsub": (2 - ta, 2 - a),
        "mul": (ta * 3, a * 3), "rmul": (3 * ta, 3 * a), "div": (ta / tb, a / b), "rdiv": (1 / tb, 1 / b),
        "pow": (tb ** 2, b ** 2), "rpow": (2 ** ta, 2 ** a), "neg": (-ta, -a), "abs": (abs(ta), np.abs(a)),
        "numpy_rhs": (ta + b, a + b), "numpy_lhs": (b + ta, b + a), "matmul": (ta @ t_of(a.T), a @ a.T),
    }
    for name, (got, want) in cases.items():
        assert isinstance(got, Tensor), name
        np.testing.assert_allclose(tensor.to_numpy(got), want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_in_place_operators_keep_identity_and_storage(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    t = t_of(a)
    ptr = t.data.data_ptr
    t += 1
    t *= t_of(np.full(4, 2, np.float32))
    t -= 0.5
    t /= 4
    assert t.data.data_ptr == ptr
    np.testing.assert_allclose(tensor.to_numpy(t), ((a + 1) * 2 - 0.5) / 4, rtol=1e-6)
    with pytest.raises(ValueError, match="out has shape"):
        small = t_of(np.ones(4, np.float32))
        small += t  # the result would not fit in place


def test_comparisons_return_bool_and_promote_in_arithmetic():
    a = np.array([1.0, 2.0, 3.0], np.float32)
    t = t_of(a)
    mask = t > 1.5
    assert mask.dtype == tensor.bool_
    np.testing.assert_array_equal(tensor.to_numpy(mask), a > 1.5)
    np.testing.assert_array_equal(tensor.to_numpy(mask * t), (a > 1.5) * a)
    np.testing.assert_array_equal(tensor.to_numpy(tensor.eq(t, 2.0)), a == 2)
    np.testing.assert_array_equal(tensor.to_numpy(tensor.le(t, t_of(np.full(3, 2, np.float32)))), a <= 2)


def test_int_tensor_with_float_scalar_is_float32_but_in_place_is_a_clear_error():
    # SINGA computes an integer tensor with a float scalar in float32 (SINGA's test_tensor _kint_float);
    # in place the float result cannot be stored in the integer tensor.
    t = t_of(np.arange(3, dtype=np.int32))
    r = t + 0.5
    assert r.dtype == tensor.float32
    np.testing.assert_array_equal(tensor.to_numpy(r), [0.5, 1.5, 2.5])
    with pytest.raises(TypeError, match="not an integer"):
        t += 0.5
    np.testing.assert_array_equal(tensor.to_numpy(t * 2), [0, 2, 4])


def test_dtype_mismatch_names_the_fix():
    with pytest.raises(TypeError, match="as_type"):
        t_of(np.ones(3, np.float32)) + t_of(np.ones(3, np.float64))


def test_tensor_is_hashable_by_identity():
    a, b = t_of(np.ones(2, np.float32)), t_of(np.ones(2, np.float32))
    d = {a: 1, b: 2}
    assert d[a] == 1 and d[b] == 2


def test_bool_and_item():
    # SINGA's tensors are always true, whatever their size or values
    assert bool(t_of(np.array([0.0], np.float32)))
    assert bool(t_of(np.zeros(2, np.float32)))
    assert t_of(np.array(3.5, np.float32)).item() == 3.5


# ---------------------------------------------------------------- indexing
def test_getitem_views_and_setitem(rng):
    a = rng.standard_normal((4, 5, 6)).astype(np.float32)
    t = t_of(a)
    # an int keeps its axis, as SINGA's t[i] (a length-1 slice); numpy drops it: compare with i:i+1
    for key, np_key in [(1, slice(1, 2)), (-1, slice(-1, None)), ((1, 2), (slice(1, 2), slice(2, 3))),
                        (slice(1, 3), slice(1, 3)), ((slice(None), 2), (slice(None), slice(2, 3))),
                        ((Ellipsis, 1), (Ellipsis, slice(1, 2))), ((None, 0), (None, slice(0, 1))),
                        ((slice(None, None, -1),), (slice(None, None, -1),)),
                        ((slice(None), slice(4, 0, -2), None), (slice(None), slice(4, 0, -2), None)),
                        ((2, Ellipsis, slice(1, None, 2)), (slice(2, 3), Ellipsis, slice(1, None, 2)))]:
        np.testing.assert_array_equal(tensor.to_numpy(t[key]), a[np_key], err_msg=str(key))
    view = t[1:3, :, 0]
    assert view.data.shares_storage(t.data) and view.shape == (2, 5, 1)
    t[0, 1:3] = 7
    a[0, 1:3] = 7
    t[1] = np.arange(30, dtype=np.float32).reshape(5, 6)
    a[1] = np.arange(30).reshape(5, 6)
    np.testing.assert_array_equal(tensor.to_numpy(t), a)
    with pytest.raises(IndexError, match="out of bounds"):
        t[4]
    with pytest.raises(IndexError, match="too many indices"):
        t[0, 0, 0, 0]
    with pytest.raises(TypeError, match="unsupported index"):
        t[[0, 1]]


# ---------------------------------------------------------------- module functions
def test_reductions_and_softmax(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    t = t_of(a)
    np.testing.assert_allclose(tensor.to_numpy(tensor.sum(t)), a.sum(), rtol=1e-5)
    np.testing.assert_allclose(tensor.to_numpy(tensor.sum(t, 0)), a.sum(0), rtol=1e-5)
    np.testing.assert_allclose(tensor.to_numpy(tensor.average(t, 1)), a.mean(1), rtol=1e-5)
    np.testing.assert_array_equal(tensor.to_numpy(tensor.argmax(t, 1)), a.argmax(1))
    e = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(tensor.to_numpy(tensor.softmax(t)), e / e.sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(tensor.to_numpy(tensor.sum_rows(t)), a.sum(0), rtol=1e-5)
    np.testing.assert_allclose(tensor.to_numpy(tensor.sum_columns(t)), a.sum(1), rtol=1e-5)
    np.testing.assert_allclose(t.l1(), np.abs(a).mean(), rtol=1e-5)
    np.testing.assert_allclose(t.l2(), np.linalg.norm(a.astype(np.float64)) / a.size, rtol=1e-6)  # SINGA's


def test_unary_module_functions(rng):
    a = rng.uniform(0.1, 2, (5,)).astype(np.float32)
    t = t_of(a)
    for name, ref in [("exp", np.exp), ("log", np.log), ("sqrt", np.sqrt), ("square", np.square),
                      ("tanh", np.tanh), ("sigmoid", lambda x: 1 / (1 + np.exp(-x))), ("relu", lambda x: x),
                      ("sign", np.sign), ("abs", np.abs)]:
        np.testing.assert_allclose(tensor.to_numpy(getattr(tensor, name)(t)), ref(a), rtol=1e-5, err_msg=name)
    out = tensor.zeros_like(t)
    assert tensor.exp(t, out=out) is out


def test_gemm_mult_axpy_add_row_column(rng):
    A = rng.standard_normal((3, 4)).astype(np.float32)
    B = rng.standard_normal((4, 5)).astype(np.float32)
    C = rng.standard_normal((3, 5)).astype(np.float32)
    tc = t_of(C)
    r = tensor.mult(t_of(A), t_of(B), tc, alpha=2.0, beta=0.5)
    assert r is tc
    np.testing.assert_allclose(tensor.to_numpy(tc), 2 * A @ B + 0.5 * C, rtol=1e-5, atol=1e-5)
    y = t_of(C.copy())
    tensor.axpy(3.0, t_of(C), y)
    np.testing.assert_allclose(tensor.to_numpy(y), 4 * C, rtol=1e-6)
    M = t_of(C.copy())
    tensor.add_row(2.0, t_of(np.arange(5, dtype=np.float32)), 1.0, M)
    np.testing.assert_allclose(tensor.to_numpy(M), C + 2 * np.arange(5), rtol=1e-6)
    M = t_of(C.copy())
    tensor.add_column(1.0, t_of(np.arange(3, dtype=np.float32)), 0.0, M)
    np.testing.assert_allclose(tensor.to_numpy(M), np.broadcast_to(np.arange(3)[:, None], (3, 5)))


def test_concat_stack_split_repeat(rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    b = rng.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_array_equal(tensor.to_numpy(tensor.concatenate([t_of(a), t_of(b)], 0)),
                                  np.concatenate([a, b]))
    np.testing.assert_array_equal(tensor.to_numpy(tensor.stack([t_of(a), t_of(a)], 1)), np.stack([a, a], 1))
    parts = tensor.split(t_of(b), [1, 3], 0)
    np.testing.assert_array_equal(tensor.to_numpy(parts[1]), b[1:])
    assert len(tensor.split(t_of(b), 2)) == 2
    for reps, axis in [(2, None), (3, 0), (2, 1), ([1, 0, 2], 1), (0, 0)]:
        np.testing.assert_array_equal(tensor.to_numpy(tensor.repeat(t_of(a), reps, axis)), np.repeat(a, reps, axis),
                                      err_msg=f"{reps} {axis}")


def test_tensordot_and_einsum(rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    b = rng.standard_normal((4, 3, 5)).astype(np.float32)
    np.testing.assert_allclose(tensor.to_numpy(tensor.tensordot(t_of(a), t_of(b), ([1, 2], [1, 0]))),
                               np.tensordot(a, b, ([1, 2], [1, 0])), rtol=1e-5, atol=1e-5)
    x = rng.standard_normal((5, 2, 3)).astype(np.float32)
    y = rng.standard_normal((5, 3, 4)).astype(np.float32)
    for spec in ["bij,bjk->bik", "bij,bjk->bki", "bij,bjk->ik", "bij,bjk"]:
        np.testing.assert_allclose(tensor.to_numpy(tensor.einsum(spec, t_of(x), t_of(y))),
                                   np.einsum(spec, x, y), rtol=1e-5, atol=1e-5, err_msg=spec)


def test_random_fills_are_seeded_per_device():
    dev = device.get_default_device()
    dev.SetRandSeed(7)
    first = tensor.to_numpy(Tensor((1000,), dev).gaussian(0, 1))
    second = tensor.to_numpy(Tensor((1000,), dev).gaussian(0, 1))
    dev.SetRandSeed(7)
    again = tensor.to_numpy(Tensor((1000,), dev).gaussian(0, 1))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, second)
    u = tensor.to_numpy(tensor.uniform(-1, 1, Tensor((10000,), dev)))
    assert u.min() >= -1 and u.max() < 1 and abs(u.mean()) < 0.05
    b = tensor.to_numpy(tensor.bernoulli(0.3, Tensor((10000,), dev)))
    assert set(np.unique(b)) <= {0.0, 1.0} and abs(b.mean() - 0.3) < 0.03


# ---------------------------------------------------------------- devices and build
def test_device_api():
    cpu = device.get_default_device()
    assert cpu is device.create_cpu_device()
    assert cpu.id() == -1 and cpu.lang() == "cpp" and cpu.is_cpu()
    cpu.Sync()
    assert pickle.loads(pickle.dumps(cpu)) is cpu
    assert device.get_num_gpus() == singa_lite._core.cuda_device_count()
    assert device.cuda_is_available() == (device.get_num_gpus() > 0)


@pytest.mark.skipif(device.cuda_is_available(), reason="checks the error raised when no GPU is usable")
def test_cuda_device_without_gpu_says_why():
    with pytest.raises(singa_lite.CudaError, match="cannot create cuda:0: .*(driver|built without CUDA|GPU)"):
        device.create_cuda_gpu()
    with pytest.raises(singa_lite.CudaError):
        device.create_cuda_gpu_on(0)


def test_create_cuda_gpu_on_rejects_bad_ids():
    with pytest.raises(TypeError, match="device_id must be an int"):
        device.create_cuda_gpu_on("0")


def test_build_info_reports_components():
    info = singa_lite.build_info()
    assert info["version"] == singa_lite.__version__
    assert info["blas"]["library"] == "OpenBLAS" and "scipy-openblas32" in info["blas"]["package"]
    assert "OpenBLAS" in info["blas"]["config"]
    assert set(info) >= {"cuda", "cudnn", "nccl", "compiler", "openmp"}
    assert isinstance(info["cuda"]["compiled"], bool)
    assert info["cuda"]["device_count"] == device.get_num_gpus()


def test_threads_setting_roundtrip():
    n = device.get_num_threads()
    device.set_num_threads(1)
    assert device.get_num_threads() == 1
    device.set_num_threads(n)
    with pytest.raises(ValueError, match="n >= 1"):
        device.set_num_threads(0)
