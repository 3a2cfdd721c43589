"""Views and copies of the C++ core's Tensor (reshape, view, transpose, slice, select, broadcast_to, unsqueeze,
squeeze, contiguous, clone, cast, to) against numpy indexing, whether they share storage (checked with
shares_storage and by writing through them), and numpy interop: the buffer protocol both ways and DLPack
both ways, without copies."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from singa_lite import _core
from core_testutil import ALL, CPU, DT, DT_TO_NP, NP_TO_DT, assert_same, ids, tensor, to_np

BIG = 1 << 62


def arange_t(shape, dtype=np.float32):
    x = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    return x, tensor(x)


def assert_writes_through(view, base_t, expected_base_after):
    """Fills `view` with -1 and checks the base tensor changed exactly as expected."""
    _core.fill_(view, -1.0)
    assert_same(base_t, expected_base_after)


# ---------------------------------------------------------------- metadata

def test_tensor_metadata():
    t = _core.Tensor((2, 3), DT.float64, CPU)
    assert t.shape == (2, 3) and t.strides == (3, 1) and t.offset == 0
    assert t.dtype == DT.float64 and t.device == CPU and t.ndim == 2 and t.numel == 6
    assert t.itemsize == 8 and t.nbytes == 48 and t.is_contiguous()
    assert "shape=(2, 3)" in repr(t) and "float64" in repr(t) and "cpu" in repr(t)
    d = _core.Tensor((4,))
    assert d.dtype == DT.float32 and d.device.kind == "cpu"
    z = _core.Tensor(())
    assert z.shape == () and z.numel == 1 and z.ndim == 0
    e = _core.Tensor((0, 5), DT.int32)
    assert e.numel == 0 and e.nbytes == 0 and e.is_contiguous()
    for dt in (DT.float16, DT.float32, DT.float64, DT.int32, DT.int64, DT.bool):
        assert dt.itemsize == np.dtype(DT_TO_NP[dt]).itemsize
        assert dt.is_floating == (np.dtype(DT_TO_NP[dt]).kind == "f")


# ---------------------------------------------------------------- reshape / view

def test_view_and_reshape_of_contiguous_share():
    x, t = arange_t((2, 3, 4))
    for shape, np_shape in [((6, 4), (6, 4)), ((-1,), (24,)), ((4, -1, 2), (4, 3, 2)), ((24, 1), (24, 1)),
                            ((1, 2, 1, 12), (1, 2, 1, 12))]:
        for method in ("view", "reshape"):
            v = getattr(t, method)(list(shape))
            assert v.shares_storage(t) and v.is_contiguous()
            assert_same(v, x.reshape(np_shape))
    v = t.view([4, 6])
    expected = x.copy().reshape(4, 6)
    expected[1] = -1
    assert_writes_through(v.select(0, 1), t, expected.reshape(2, 3, 4))
    e = tensor(np.zeros((0, 3), np.float32))
    assert e.view([3, 0]).shape == (3, 0) and e.reshape([0]).shape == (0,)
    s = tensor(np.float32(5))
    assert s.view([1, 1]).shape == (1, 1) and s.reshape([]).shape == ()


def test_reshape_of_noncontiguous_copies_and_view_refuses():
    x, t = arange_t((3, 4))
    tt = t.transpose([])
    r = tt.reshape([12])
    assert not r.shares_storage(t)
    assert_same(r, x.T.reshape(12))
    with pytest.raises(ValueError, match="view: the tensor is not contiguous"):
        tt.view([12])
    # a step-1 slice of leading rows is still contiguous: a view
    rows = t.slice(0, 1, 3, 1)
    assert rows.is_contiguous() and rows.view([8]).shares_storage(t)
    assert_same(rows.view([8]), x[1:3].reshape(8))


def test_view_errors():
    _, t = arange_t((2, 3))
    with pytest.raises(ValueError, match="reshape: cannot reshape"):
        t.view([4, 2])
    with pytest.raises(ValueError, match="reshape: only one dimension can be -1"):
        t.reshape([-1, -1])
    with pytest.raises(ValueError, match="reshape: invalid dimension -2"):
        t.reshape([-2, -3])
    with pytest.raises(ValueError, match="reshape: cannot reshape"):
        tensor(np.zeros((0, 3))).reshape([-1, 0])


def test_huge_sizes_do_not_overflow_in_reshape():
    # Found by UBSan (tools/sanitize.sh): the product of the given sizes wrapped around in reshape, and the
    # contiguous strides of an empty tensor with huge sizes overflowed. Now the one is a clean error, the
    # other an empty tensor whose strides address nothing.
    _, t = arange_t((2, 4))
    with pytest.raises(ValueError, match="reshape: cannot reshape"):
        t.reshape([2 ** 62, 4, -1])
    with pytest.raises(ValueError, match="reshape: cannot reshape"):
        t.reshape([2 ** 62, 2 ** 62, -1])
    e = tensor(np.zeros((0, 3), np.float32))
    for shape in ([0, 2 ** 62, 4], [2 ** 62, 2 ** 62, 0], [3, 2 ** 40, 2 ** 40, 0]):
        v = e.reshape(shape)
        assert v.shape == tuple(shape) and v.numel == 0 and v.is_contiguous()


# ---------------------------------------------------------------- transpose

def test_transpose():
    x, t = arange_t((2, 3, 4))
    for perm in ([], [0, 1, 2], [2, 0, 1], [1, 2, 0], [-1, 0, 1], [0, 2, 1]):
        v = t.transpose(perm)
        assert v.shares_storage(t)
        assert_same(v, x.transpose(*perm) if perm else x.T)
    assert t.transpose().shape == (4, 3, 2)
    v = t.transpose([2, 0, 1])
    assert not v.is_contiguous()
    expected = x.copy()
    expected[:, :, 3] = -1
    assert_writes_through(v.select(0, 3), t, expected)
    z = tensor(np.float32(1))
    assert z.transpose([]).shape == ()
    with pytest.raises(ValueError, match="transpose: axis 1 repeated"):
        t.transpose([1, 1, 0])
    with pytest.raises(ValueError, match="transpose: axes .* do not match a tensor with 3 dimensions"):
        t.transpose([1, 0])
    with pytest.raises(IndexError, match="transpose: axis 3 is out of range"):
        t.transpose([0, 1, 3])


# ---------------------------------------------------------------- slice / select

SLICES = [(0, 5, 1), (1, 4, 2), (None, None, -1), (4, None, -2), (-1, -6, -1), (-2, 0, -1), (3, 1, 1),
          (-100, 100, 3), (100, -100, -3), (2, 2, 1), (0, 5, 7), (5, 0, -7), (-3, None, 1), (None, -3, 1)]


@pytest.mark.parametrize("sl", SLICES, ids=str)
def test_slice_matches_python(sl):
    x, t = arange_t((5, 6))
    start, stop, step = sl
    for axis in (0, 1, -1):
        n = x.shape[axis]
        # Tensor.slice takes ints: Python's None is the far end for the step's direction
        s = start if start is not None else (0 if step > 0 else n - 1)
        e = stop if stop is not None else (BIG if step > 0 else -BIG)
        v = t.slice(axis, s, e, step)
        idx = [slice(None)] * 2
        idx[axis] = slice(start, stop, step)
        expected = x[tuple(idx)]
        assert v.shares_storage(t)
        assert_same(v, expected)


def test_slice_writes_through_and_default_step():
    x, t = arange_t((4, 6))
    v = t.slice(1, 5, -BIG, -2)  # columns 5, 3, 1
    assert v.strides == (6, -2)
    expected = x.copy()
    expected[:, 5::-2] = -1
    assert_writes_through(v, t, expected)
    assert_same(t.slice(0, 1, 3), to_np(t)[1:3])  # step defaults to 1
    with pytest.raises(ValueError, match="slice: step cannot be zero"):
        t.slice(0, 0, 1, 0)
    with pytest.raises(IndexError, match="slice: axis 2 is out of range"):
        t.slice(2, 0, 1, 1)


def test_select():
    x, t = arange_t((3, 4, 5))
    for axis in (0, 1, 2, -1):
        for i in (0, 2, -1):
            v = t.select(axis, i)
            idx = [slice(None)] * 3
            idx[axis] = i
            assert v.shares_storage(t)
            assert_same(v, x[tuple(idx)])
    expected = x.copy()
    expected[:, :, 1] = -1
    assert_writes_through(t.select(2, 1), t, expected)
    s = tensor(np.arange(3.0)).select(0, -1)
    assert s.shape == () and float(to_np(s)) == 2.0
    with pytest.raises(IndexError, match="^select: index 3 is out of bounds for axis 0 with size 3"):
        t.select(0, 3)
    with pytest.raises(IndexError, match="^select: index -5 is out of bounds for axis 1 with size 4"):
        t.select(1, -5)
    with pytest.raises(IndexError, match="select: axis 3 is out of range"):
        t.select(3, 0)
    with pytest.raises(IndexError, match="select: axis 0 is out of range"):
        tensor(np.float32(1)).select(0, 0)


# ---------------------------------------------------------------- broadcast_to / unsqueeze / squeeze

def test_broadcast_to():
    x, t = arange_t((3, 1))
    v = t.broadcast_to((2, 3, 4))
    assert v.shares_storage(t) and v.strides == (0, 1, 0)
    assert_same(v, np.broadcast_to(x, (2, 3, 4)))
    assert_same(tensor(np.float32(7)).broadcast_to((2, 2)), np.full((2, 2), 7, np.float32))
    assert tensor(np.zeros((1, 3))).broadcast_to((0, 3)).shape == (0, 3)
    # writing through a broadcast view writes the one underlying element
    _core.fill_(v.select(0, 1).select(1, 2), -1.0)
    assert_same(t, np.array([[-1], [-1], [-1]], np.float32))
    with pytest.raises(ValueError, match="broadcast_to: cannot broadcast"):
        t.broadcast_to((3, 2, 2))
    with pytest.raises(ValueError, match=r"broadcast_to: cannot broadcast .* \(fewer dimensions\)"):
        t.broadcast_to((3,))


def test_unsqueeze_and_squeeze():
    x, t = arange_t((2, 3))
    for axis in (0, 1, 2, -1, -2, -3):
        v = t.unsqueeze(axis)
        assert v.shares_storage(t)
        assert_same(v, np.expand_dims(x, axis))
        assert v.is_contiguous()
    with pytest.raises(IndexError, match="unsqueeze: axis 3 is out of range"):
        t.unsqueeze(3)
    with pytest.raises(IndexError, match="unsqueeze: axis -4 is out of range"):
        t.unsqueeze(-4)
    y, u = arange_t((1, 2, 1, 3, 1))
    assert_same(u.squeeze(), y.squeeze())
    assert_same(u.squeeze([0, -1]), y.squeeze(axis=(0, 4)))
    assert u.squeeze([2]).shares_storage(u)
    assert tensor(np.float32(1)).unsqueeze(0).shape == (1,)
    assert tensor(np.zeros((1,))).squeeze().shape == ()
    with pytest.raises(ValueError, match="squeeze: axis 1 has size 2, not 1"):
        u.squeeze([1])
    with pytest.raises(IndexError, match="squeeze: axis 5 is out of range"):
        u.squeeze([5])
    # unsqueeze of a non-contiguous view keeps addressing the right elements
    tt = t.transpose([])
    assert_same(tt.unsqueeze(1), np.expand_dims(x.T, 1))
    assert_same(tt.unsqueeze(2).squeeze(), x.T)


# ---------------------------------------------------------------- contiguous / clone / cast / to

def test_contiguous_clone_cast_to():
    x, t = arange_t((3, 4))
    assert t.contiguous().shares_storage(t)
    assert t.contiguous().data_ptr == t.data_ptr
    tt = t.transpose([])
    c = tt.contiguous()
    assert not c.shares_storage(t) and c.is_contiguous()
    assert_same(c, x.T)
    k = t.clone()
    assert not k.shares_storage(t)
    assert_same(k, x)
    _core.fill_(k, 0.0)
    assert_same(t, x)  # the clone is independent
    ks = t.slice(1, 3, -BIG, -2).clone()
    assert ks.is_contiguous() and ks.strides == (2, 1)
    assert_same(ks, x[:, 3::-2])
    assert t.cast(DT.float32).shares_storage(t)  # same dtype: the tensor itself
    c64 = t.cast(DT.float64)
    assert not c64.shares_storage(t)
    assert_same(c64, x.astype(np.float64))
    assert t.to(CPU).shares_storage(t)
    assert tensor(np.zeros((0, 2))).clone().shape == (0, 2)
    assert_same(tensor(np.float16(3)).clone(), np.float16(3))


def test_copy_into_views():
    x, t = arange_t((4, 5))
    src = np.array([10, 20, 30, 40], np.float32)
    _core.copy_(t.select(1, 2), tensor(src))
    expected = x.copy()
    expected[:, 2] = src
    assert_same(t, expected)
    _core.copy_(t.slice(0, 3, -BIG, -2), tensor(np.float32(-5)))  # rows 3 and 1 (broadcast source)
    expected[3::-2] = -5
    assert_same(t, expected)


# ---------------------------------------------------------------- numpy interop

@pytest.mark.parametrize("dtype", ALL, ids=ids(ALL))
def test_buffer_protocol_numpy_to_tensor_shares(dtype):
    a = np.zeros((3, 4), dtype)
    t = _core.Tensor.from_buffer(a)
    assert t.dtype == NP_TO_DT[np.dtype(dtype)] and t.shape == (3, 4) and t.strides == (4, 1)
    assert t.data_ptr == a.ctypes.data
    a[1, 2] = 1
    assert to_np(t)[1, 2] == 1  # numpy's write is seen by the tensor
    _core.fill_(t.select(0, 0), 1.0)
    assert (a[0] == 1).all()  # the tensor's write is seen by numpy


@pytest.mark.parametrize("dtype", ALL, ids=ids(ALL))
def test_buffer_protocol_tensor_to_numpy_shares(dtype):
    t = _core.Tensor((2, 5), NP_TO_DT[np.dtype(dtype)], CPU)
    _core.fill_(t, 0.0)
    a = np.asarray(t)
    assert a.dtype == np.dtype(dtype) and a.shape == (2, 5)
    assert a.ctypes.data == t.data_ptr
    a[1, 3] = 1
    assert to_np(t)[1, 3] == 1
    _core.fill_(t, 1.0)
    assert (a == 1).all()


def test_buffer_protocol_strided_both_ways():
    base = np.arange(40, dtype=np.float64).reshape(5, 8)
    view = base[4:0:-2, 1::3]  # negative and positive steps
    t = _core.Tensor.from_buffer(view)
    assert t.strides == (-16, 3) and not t.is_contiguous()
    assert_same(t, view)
    view[0, 0] = -7
    assert to_np(t)[0, 0] == -7
    tt = tensor(base).transpose([]).slice(0, 7, -BIG, -3)  # a negative-step view of a transpose
    a = np.asarray(tt)
    assert_same(a, base.T[7::-3])
    a[0, 0] = 1000  # the exported numpy view writes into the tensor's storage
    assert to_np(tt)[0, 0] == 1000
    z = np.asarray(tensor(np.float32(2.5)))
    assert z.shape == () and z == 2.5


def test_buffer_protocol_lifetimes():
    # a tensor keeps the numpy array's memory alive, and an exported numpy array keeps the tensor's storage
    a = np.arange(6, dtype=np.float32)
    ref = weakref.ref(a)
    t = _core.Tensor.from_buffer(a)
    del a
    gc.collect()
    assert ref() is not None
    assert_same(t, np.arange(6, dtype=np.float32))
    del t
    gc.collect()
    assert ref() is None
    t = _core.Tensor((4,), DT.int64, CPU)
    _core.fill_(t, 3.0)
    b = np.asarray(t)
    del t
    gc.collect()
    assert (b == 3).all()


def test_from_buffer_other_exporters_and_errors():
    mv = memoryview(bytearray(np.arange(4, dtype=np.int32).tobytes())).cast("i")
    t = _core.Tensor.from_buffer(mv)
    assert t.dtype == DT.int32 and to_np(t).tolist() == [0, 1, 2, 3]
    with pytest.raises(TypeError, match="unsupported element type 'B'"):
        _core.Tensor.from_buffer(np.zeros(3, np.uint8))
    with pytest.raises(TypeError, match="unsupported element type"):
        _core.Tensor.from_buffer(np.zeros(3, np.complex64))
    with pytest.raises(TypeError, match="unsupported element type"):
        _core.Tensor.from_buffer(np.zeros(3, np.int16))
    with pytest.raises(TypeError, match="big-endian data is not supported"):
        _core.Tensor.from_buffer(np.zeros(3, ">f4"))
    rec = np.zeros(4, dtype=[("a", "<f4"), ("b", "u1")])  # field 'a' has a 5-byte stride
    with pytest.raises(ValueError, match="strides 5 are not a multiple of the item size 4"):
        _core.Tensor.from_buffer(rec["a"])


@pytest.mark.parametrize("dtype", ALL, ids=ids(ALL))
def test_dlpack_tensor_to_numpy(dtype):
    t = _core.Tensor((3, 4), NP_TO_DT[np.dtype(dtype)], CPU)
    _core.fill_(t, 0.0)
    a = np.from_dlpack(t)
    assert a.dtype == np.dtype(dtype) and a.shape == (3, 4)
    assert a.ctypes.data == t.data_ptr
    a[2, 1] = 1
    assert to_np(t)[2, 1] == 1
    _core.fill_(t, 1.0)
    assert (a == 1).all()
    assert t.__dlpack_device__() == (1, 0)  # kDLCPU, device 0


@pytest.mark.parametrize("dtype", ALL, ids=ids(ALL))
def test_dlpack_numpy_to_tensor(dtype):
    a = np.zeros((2, 3), dtype)
    t = _core.Tensor.from_dlpack(a)
    assert t.dtype == NP_TO_DT[np.dtype(dtype)] and t.shape == (2, 3)
    assert t.data_ptr == a.ctypes.data
    a[1, 1] = 1
    assert to_np(t)[1, 1] == 1
    _core.fill_(t, 1.0)
    assert (a == 1).all()


def test_dlpack_strided_0d_and_lifetime():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    t = _core.Tensor.from_dlpack(base[::-2, 1::2])
    assert t.strides == (-12, 2)
    assert_same(t, base[::-2, 1::2])
    tv = tensor(base).transpose([]).slice(1, 3, -BIG, -2)  # (6, 2), strides (1, -12)
    a = np.from_dlpack(tv)
    assert_same(a, base.T[:, 3::-2])
    assert np.shares_memory(a, np.asarray(tv))
    z = np.from_dlpack(tensor(np.float64(4)))
    assert z.shape == () and z == 4
    e = np.from_dlpack(tensor(np.zeros((0, 3), np.float16)))
    assert e.shape == (0, 3)
    # the capsule keeps the storage alive after the tensor is gone
    t = _core.Tensor((5,), DT.float64, CPU)
    _core.fill_(t, 2.0)
    a = np.from_dlpack(t)
    del t
    gc.collect()
    assert (a == 2).all()
    # a tensor from numpy's capsule keeps the array alive
    arr = np.arange(3, dtype=np.int64)
    ref = weakref.ref(arr)
    t = _core.Tensor.from_dlpack(arr)
    del arr
    gc.collect()
    assert ref() is not None and to_np(t).tolist() == [0, 1, 2]
    del t
    gc.collect()
    assert ref() is None
    # a raw capsule works too, once
    cap = np.arange(4, dtype=np.float32).__dlpack__()
    assert to_np(_core.Tensor.from_dlpack(cap)).tolist() == [0, 1, 2, 3]
    with pytest.raises(TypeError, match="from_dlpack: expected an object with __dlpack__"):
        _core.Tensor.from_dlpack(cap)
    with pytest.raises(TypeError, match="from_dlpack: unsupported type"):
        _core.Tensor.from_dlpack(np.zeros(3, np.uint8))


def test_cuda_device_unavailable():
    if _core.cuda_device_count() != 0:
        pytest.skip("a CUDA GPU is present")
    with pytest.raises(ValueError, match="cuda:0"):
        _core.Tensor((2,), DT.float32, _core.Device("cuda:0"))
    assert _core.cuda_unavailable_reason() != ""
    if not _core.cuda_compiled():  # a wheel user is told which wheel has CUDA, not only how to compile
        assert "pip install singa-lite-cuda13x" in _core.cuda_unavailable_reason()
    with pytest.raises(ValueError, match="Device: expected 'cpu', 'cuda' or 'cuda:N'"):
        _core.Device("tpu")
    with pytest.raises(ValueError, match="Device: expected 'cuda:N'"):
        _core.Device("cuda:x")
    assert _core.Device("gpu:1") == _core.Device("cuda:1") and _core.Device("cuda").index == 0
    assert str(_core.Device()) == "cpu" and repr(_core.Device("cuda:2")) == "Device('cuda:2')"


# ---------------------------------------------------------------- property test

@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_property_view_chains_match_numpy(data):
    # a random chain of view ops applied to a tensor and to the numpy array; they agree, share storage,
    # and a write through the final view lands where numpy's view says
    shape = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    x = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    base = tensor(x)
    t, v = base, x.copy()
    root = v
    for _ in range(data.draw(st.integers(1, 5))):
        kind = data.draw(st.sampled_from(["transpose", "slice", "select", "unsqueeze", "squeeze"]))
        if kind == "transpose":
            perm = data.draw(st.permutations(range(v.ndim)))
            t, v = t.transpose(list(perm)), v.transpose(perm)
        elif kind == "slice" and v.ndim:
            ax = data.draw(st.integers(0, v.ndim - 1))
            start = data.draw(st.integers(-6, 6))
            stop = data.draw(st.integers(-6, 6))
            step = data.draw(st.sampled_from([-3, -2, -1, 1, 2, 3]))
            idx = [slice(None)] * v.ndim
            idx[ax] = slice(start, stop, step)
            t, v = t.slice(ax, start, stop, step), v[tuple(idx)]
        elif kind == "select" and v.ndim and all(v.shape):
            ax = data.draw(st.integers(0, v.ndim - 1))
            i = data.draw(st.integers(-v.shape[ax], v.shape[ax] - 1))
            t, v = t.select(ax, i), v[(slice(None),) * ax + (i, Ellipsis)]  # a 0-d view, not a scalar
        elif kind == "unsqueeze":
            ax = data.draw(st.integers(-v.ndim - 1, v.ndim))
            t, v = t.unsqueeze(ax), np.expand_dims(v, ax)
        elif kind == "squeeze":
            t, v = t.squeeze(), v.squeeze()
        assert t.shares_storage(base)
        assert_same(t, v)
    if v.size:
        _core.fill_(t, -1.0)
        v[...] = -1  # v is a view of root, as t is of base
        assert_same(base, root)


def test_from_buffer_copies_read_only_arrays():
    # A read-only buffer (np.frombuffer of bytes, a broadcast view) must never be written through.
    ro = np.frombuffer(np.arange(6, dtype=np.float32).tobytes(), dtype=np.float32)
    assert not ro.flags.writeable
    t = _core.Tensor.from_buffer(ro)
    _core.fill_(t, 9.0)
    assert (ro == np.arange(6)).all() and (to_np(t) == 9).all()
    b = np.broadcast_to(np.float32(1.0), (3, 4))
    tb = _core.Tensor.from_buffer(b)
    assert tb.strides == (4, 1), "a read-only broadcast view arrives packed, not as aliasing stride-0 memory"
    w = np.zeros(3, np.float32)
    tw = _core.Tensor.from_buffer(w)
    _core.fill_(tw, 2.0)
    assert (w == 2).all(), "a writable array is shared"


def test_large_cpu_blocks_are_reused_and_can_be_released():
    # Training allocates the same large shapes every step: a released block comes back for the next tensor
    # of its size class, without new page faults; empty_cache() hands everything back to the system.
    _core.empty_cache()
    t = _core.Tensor((1 << 20,), DT.float32, CPU)  # 4 MiB
    ptr = t.data_ptr
    del t
    assert _core.cpu_cache_bytes() >= 4 << 20
    u = _core.Tensor((1 << 20,), DT.float32, CPU)
    assert u.data_ptr == ptr and _core.cpu_cache_bytes() == 0
    small = _core.Tensor((100,), DT.float32, CPU)  # below the cached sizes: plain malloc
    del u, small
    _core.empty_cache()
    assert _core.cpu_cache_bytes() == 0


def test_kernels_on_empty_tensors_with_huge_sizes():
    # UBSan found the byte strides of such a tensor overflowing in the CPU loop set-up (one_hot of 2**62
    # classes on no rows): nothing is visited, so no geometry may be computed.
    idx = _core.Tensor.from_buffer(np.zeros(0, np.int32))
    assert tuple(_core.one_hot(idx, 2**62, _core.DType.float32).shape) == (0, 2**62)
    for shape in ([0, 2**62], [2**61, 0, 3]):
        e = _core.Tensor(shape, _core.DType.float32, _core.Device("cpu"))
        _core.fill_(e, 1.0)
        assert e.numel == 0 and _core.add(e, e).numel == 0


@pytest.mark.parametrize("dtype", ALL, ids=ids(ALL))
def test_fill_writes_every_element_of_any_view(dtype):
    # The views tests/gpu/test_gpu_views.py fills on a GPU and compares with this: a column (t[:, 0] = 1.0), a
    # stepped slice, a transpose, a reversed axis and a broadcast (stride 0) view; the rest of the base untouched.
    def base():
        x, t = arange_t((5, 6), np.float64)
        return x.astype(dtype), _core.Tensor.from_buffer(np.ascontiguousarray(x.astype(dtype)))

    views = [
        (lambda t: t.select(1, 0), lambda a: a[:, 0]),
        (lambda t: t.slice(1, 1, 6, 2), lambda a: a[:, 1:6:2]),
        (lambda t: t.transpose([1, 0]).slice(0, 2, 4, 1), lambda a: a.T[2:4]),
        (lambda t: t.slice(0, 4, -BIG, -2), lambda a: a[4::-2]),
        (lambda t: t.select(0, 3).unsqueeze(0).broadcast_to((4, 6)), lambda a: a[3:4]),
    ]
    for make_view, numpy_view in views:
        want, t = base()
        numpy_view(want)[...] = 1
        _core.fill_(make_view(t), 1.0)
        assert_same(t, want)
