"""Host <-> device copies of 1 MiB or more go through a pinned double buffer (csrc/cuda/runtime.cpp): every byte
must arrive as it does on the plain path, for sizes around the threshold and the 8 MiB chunk, odd byte counts,
several chunks (both halves reused), and strided sources and destinations. Marked `gpu`."""
import numpy as np
import pytest

from singa_lite import _core

pytestmark = pytest.mark.gpu

MiB = 1 << 20
CPU = _core.Device("cpu")


@pytest.fixture(scope="module")
def gpu():
    return _core.Device("cuda:0")


@pytest.fixture(params=[True, False], ids=["staged", "plain"])
def staging(request):
    saved = _core.cuda_copy_staging()
    _core.cuda_set_copy_staging(request.param)
    yield request.param
    _core.cuda_set_copy_staging(saved)


# byte counts: below / at the threshold, one chunk exactly, a chunk plus an odd tail, three chunks and a bit
SIZES = [MiB - 1, MiB, 8 * MiB, 8 * MiB + 7, 17 * MiB + 3, 40 * MiB + 1]


def pattern(nbytes, seed):
    return np.random.default_rng(seed).integers(0, 2, nbytes).astype(np.bool_)


@pytest.mark.parametrize("nbytes", SIZES)
def test_roundtrip_bytes(gpu, staging, nbytes):
    # bool: one byte per element, so every byte count (odd ones too) can be tested
    a = pattern(nbytes, nbytes)
    before = _core.cuda_staged_copy_count()
    t = _core.Tensor.from_buffer(a).to(gpu)
    back = np.asarray(t.to(CPU))
    np.testing.assert_array_equal(back, a)
    # the path under test was the one taken: both copies staged, or neither (this machine can pin 16 MiB)
    staged = _core.cuda_staged_copy_count() - before
    assert staged == (2 if staging and nbytes >= MiB else 0)


@pytest.mark.parametrize("n", [MiB // 4 + 1, 5 * MiB + 3, 9 * MiB // 2 + 1])
def test_float32_values_and_device_side_result(gpu, staging, n):
    a = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    t = _core.Tensor.from_buffer(a).to(gpu)
    # the GPU sees the right values (computed there, not just round-tripped)
    s = np.asarray(_core.mul_scalar(t, 2.0).to(CPU))
    np.testing.assert_array_equal(s, a * 2)
    np.testing.assert_array_equal(np.asarray(t.to(CPU)), a)


def test_strided_source_and_destination(gpu, staging):
    a = np.random.default_rng(1).standard_normal((1500, 1100)).astype(np.float32)  # 6.3 MiB
    src = _core.Tensor.from_buffer(a).transpose([1, 0])  # non-contiguous host source
    t = src.to(gpu)
    np.testing.assert_array_equal(np.asarray(t.to(CPU)), a.T)
    # a strided host destination (every other column of a wider array)
    wide = np.zeros((1100, 3000), np.float32)
    dst = _core.Tensor.from_buffer(wide).slice(1, 0, 3000, 2).slice(1, 0, 1500)
    _core.copy_(dst, t)
    np.testing.assert_array_equal(wide[:, 0:3000:2], a.T)
    assert not wide[:, 1::2].any()
    # a strided GPU source copied to the host
    g_t = t.transpose([1, 0])
    np.testing.assert_array_equal(np.asarray(g_t.to(CPU)), a)


def test_staged_and_plain_agree_and_cast(gpu):
    a = np.random.default_rng(2).standard_normal(3 * MiB + 5).astype(np.float64)
    outs = []
    for flag in (True, False):
        _core.cuda_set_copy_staging(flag)
        try:
            t = _core.Tensor.from_buffer(a).to(gpu)
            h = _core.Tensor([a.size], _core.DType.float32, CPU)
            _core.copy_(h, t)  # cast to float32 on the GPU, then the bytes come back
            outs.append(np.asarray(h))
        finally:
            _core.cuda_set_copy_staging(True)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], a.astype(np.float32))
