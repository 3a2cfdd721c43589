"""fill_ on strided CUDA views (t[:, 0] = 1.0 raised "CUDA tensors must be contiguous" before), against the CPU on the
same views, every dtype; and the strided kernels past 2^31 elements, where 32-bit index arithmetic would wrap.
Marked `gpu`: skipped where no GPU is usable."""
import numpy as np
import pytest

from singa_lite import _core, device, tensor

pytestmark = pytest.mark.gpu

CPU = _core.Device("cpu")
DT = _core.DType
BIG = 1 << 62
DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64", "bool"]

# (name, make the view from a (5, 6) tensor): the same views tests/unit/test_core_views.py checks on the CPU
VIEWS = [
    ("column", lambda t: t.select(1, 0)),
    ("stepped", lambda t: t.slice(1, 1, 6, 2)),
    ("transposed", lambda t: t.transpose([1, 0]).slice(0, 2, 4, 1)),
    ("reversed", lambda t: t.slice(0, 4, -BIG, -2)),
    ("broadcast", lambda t: t.select(0, 3).unsqueeze(0).broadcast_to((4, 6))),
    ("contiguous", lambda t: t.slice(0, 1, 3, 1)),
]


@pytest.fixture(scope="module")
def gpu():
    return _core.Device("cuda:0")


def host(t):
    t = t.to(CPU) if t.device.is_cuda() else t
    return np.asarray(t.cast(DT.float32) if t.dtype == DT.bfloat16 else t)


def base(dtype):
    x = _core.Tensor.from_buffer(np.arange(30, dtype=np.float64).reshape(5, 6))
    return x.cast(getattr(DT, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,make_view", VIEWS, ids=[v[0] for v in VIEWS])
def test_fill_of_a_view_matches_the_cpu(gpu, dtype, name, make_view):
    # bool: base() is True everywhere but at (0, 0), so only False changes every view
    value = 0.0 if dtype == "bool" else -3.0 if dtype.startswith("int") else 0.5
    on_cpu = base(dtype)
    on_gpu = on_cpu.to(gpu)
    _core.fill_(make_view(on_cpu), value)
    _core.fill_(make_view(on_gpu), value)
    got, want = host(on_gpu), host(on_cpu)
    np.testing.assert_array_equal(got, want)
    assert (got != host(base(dtype))).any(), "the fill changed nothing: the test would not see a missing write"


def test_setitem_of_a_column(gpu):
    t = tensor.Tensor((4, 3), device.create_cuda_gpu_on(0))
    t.set_value(0.0)
    t[:, 0] = 1.0
    t[1:3, 2] = 2.0
    want = np.zeros((4, 3), np.float32)
    want[:, 0] = 1.0
    want[1:3, 2] = 2.0
    np.testing.assert_array_equal(tensor.to_numpy(t), want)


def test_kernels_past_2_to_the_31_elements(gpu):
    """Tensors of more than 2^31 elements (about 16 GiB in all): the contiguous fill and element-wise op, max /
    argmax whose answer lies past 2^31, an element-wise op over a transposed view of 2^31 + 64 elements, and a
    strided fill of 3.2e9 elements whose offsets pass 2^32. A kernel indexing in 32 signed bits would wrap and write
    (or find) values near the start instead."""
    rows = (1 << 25) + 1
    n = rows * 64  # 2^31 + 64
    x = _core.Tensor((n,), DT.float16, gpu)
    _core.fill_(x, 0.0)
    _core.fill_(x.slice(0, n - 3, n, 1), 5.0)
    _core.fill_(x.slice(0, 1, n, 2).slice(0, (1 << 30) - 4, (1 << 30) + 4, 1), 2.0)  # odd offsets 2^31 - 7 .. + 7
    y = _core.add_scalar(x, 1.0)
    np.testing.assert_array_equal(host(y.slice(0, n - 5, n, 1)), [1, 1, 6, 6, 6])
    np.testing.assert_array_equal(host(y.slice(0, (1 << 31) - 8, (1 << 31) + 8, 1)), [1, 3] * 8)
    np.testing.assert_array_equal(host(y.slice(0, 0, 4, 1)), [1, 1, 1, 1])  # nothing wrapped to the start
    assert float(host(_core.max(y))) == 6.0
    assert int(host(_core.argmax(y))) == n - 3
    del y
    z = _core.mul_scalar(x.view([rows, 64]).transpose([1, 0]), 2.0)  # (64, rows), read with strides (1, 64)
    assert tuple(z.shape) == (64, rows)
    # z[63, r] = x[64 r + 63]: offset 2^31 - 1 (odd, filled with 2) and n - 1 (filled with 5), doubled
    np.testing.assert_array_equal(host(z.slice(0, 63, 64, 1).slice(1, rows - 2, rows, 1)), [[4, 10]])
    np.testing.assert_array_equal(host(z.slice(0, 61, 62, 1).slice(1, rows - 1, rows, 1)), [[10]])
    np.testing.assert_array_equal(host(z.slice(0, 0, 2, 1).slice(1, 0, 1, 1)), [[0], [0]])
    del x, z
    b = _core.Tensor(((1 << 26) + 2, 64), DT.bool, gpu)  # 2^32 + 128 bytes
    _core.fill_(b, 0.0)
    _core.fill_(b.slice(1, 0, 48, 1), 1.0)  # 3.2e9 elements, the last at offset 2^32 + 111
    got = np.asarray(b.to(CPU))
    assert got[:, :48].all() and not got[:, 48:].any()
    del b, got
    _core.cuda_empty_cache(0)
