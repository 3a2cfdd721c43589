"""DLPack with CUDA consumers and producers: PyTorch and CuPy, both ways, and the lifetime of exported memory. The
memory of an exported tensor returns to the caching allocator when the consumer drops it; the next kernel of ours
may get it at once, so our stream must first wait for what the consumer queued on its stream (the one it named in
__dlpack__(stream=...)). Each release test queues a slow read on the consumer's stream, drops the tensor, reuses
the block for a write of other values on our stream and checks that the read saw the old values. Marked `gpu`;
the PyTorch / CuPy parts skip where that library (with CUDA) is not installed."""
import gc

import numpy as np
import pytest

from singa_lite import _core

pytestmark = pytest.mark.gpu

CPU = _core.Device("cpu")
DT = _core.DType
N = 1 << 24  # 64 MiB of float32: a read of it takes a while, and its size class is reused exactly


@pytest.fixture(scope="module")
def gpu():
    return _core.Device("cuda:0")


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("this PyTorch has no CUDA")
    return torch


@pytest.fixture(scope="module")
def cupy():
    cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - CuPy's own CUDA runtime error types
        pytest.skip(f"CuPy cannot use the GPU: {e}")
    return cupy


def filled(gpu, value):
    t = _core.Tensor((N,), DT.float32, gpu)
    _core.fill_(t, value)
    return t


def reuse_and_overwrite(gpu, old_ptr):
    """The block of the tensor just released, written with 2.0 on our stream."""
    again = _core.Tensor((N,), DT.float32, gpu)
    assert again.data_ptr == old_ptr, "the caching allocator did not hand the block out again: nothing was tested"
    _core.fill_(again, 2.0)
    return again


def test_torch_reads_before_our_stream_reuses_the_memory(gpu, torch):
    side = torch.cuda.Stream()
    for _ in range(3):
        ours = filled(gpu, 1.0)
        ptr = ours.data_ptr
        with torch.cuda.stream(side):
            theirs = torch.from_dlpack(ours)  # __dlpack__(stream=side): side waits for our fill
            torch.cuda._sleep(100_000_000)  # tens of ms on side before the read below
            seen = theirs.sum()
        del theirs, ours
        gc.collect()
        again = reuse_and_overwrite(gpu, ptr)  # must wait for side's sum
        torch.cuda.synchronize()
        assert seen.item() == float(N), "our write overtook the consumer's read of the released block"
        del again


def test_torch_produces_and_we_read_in_order(gpu, torch):
    src = torch.arange(N, device="cuda", dtype=torch.float32)
    torch.cuda._sleep(50_000_000)  # torch's stream busy
    src.mul_(2.0)
    ours = _core.Tensor.from_dlpack(src)  # we handed torch our stream: it waits for torch's queue
    assert ours.data_ptr == src.data_ptr()  # no copy
    got = np.asarray(_core.add(ours, ours).to(CPU))
    np.testing.assert_array_equal(got, np.arange(N, dtype=np.float32) * 4)
    del ours
    _core.cuda_sync(0)


SLOW_READ = r"""
extern "C" __global__ void slow_sum(const float* x, float* out, long long n, long long spin) {
  long long start = clock64();
  while (clock64() - start < spin) {}
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    float s = 0.f;
    for (long long i = 0; i < n; i += 4096) s += x[i];
    *out = s;
  }
}
"""


def test_cupy_reads_before_our_stream_reuses_the_memory(gpu, cupy):
    kernel = cupy.RawKernel(SLOW_READ, "slow_sum")
    stream = cupy.cuda.Stream(non_blocking=True)
    for _ in range(3):
        ours = filled(gpu, 1.0)
        ptr = ours.data_ptr
        with stream:
            theirs = cupy.from_dlpack(ours)  # passes stream=this stream
            out = cupy.zeros(1, cupy.float32)
            kernel((1,), (1,), (theirs, out, np.int64(N), np.int64(100_000_000)))
        del theirs, ours
        gc.collect()
        again = reuse_and_overwrite(gpu, ptr)
        stream.synchronize()
        assert float(out.get()[0]) == float(N // 4096), "our write overtook CuPy's read of the released block"
        del again


def test_cupy_both_ways_share_memory(gpu, cupy):
    a = cupy.arange(12, dtype=cupy.float32).reshape(3, 4)
    t = _core.Tensor.from_dlpack(a)
    assert t.data_ptr == a.data.ptr and tuple(t.shape) == (3, 4) and t.device == gpu
    _core.mul_scalar(t, 10.0, out=t)
    _core.cuda_sync(0)  # a write through shared memory on our stream: CuPy's stream knows nothing of it
    np.testing.assert_array_equal(cupy.asnumpy(a), np.arange(12).reshape(3, 4) * 10)
    b = cupy.from_dlpack(_core.add_scalar(t, 1.0))
    np.testing.assert_array_equal(cupy.asnumpy(b), np.arange(12).reshape(3, 4) * 10 + 1)
    view = _core.Tensor.from_dlpack(a.T)  # strided
    assert tuple(view.strides) == (1, 4)
    np.testing.assert_array_equal(np.asarray(view.to(CPU)), np.arange(12).reshape(3, 4).T * 10)


def test_a_tensor_from_cupy_keeps_cupys_memory(gpu, cupy):
    a = cupy.full(N, 3.0, dtype=cupy.float32)
    t = _core.Tensor.from_dlpack(a)
    del a
    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()  # what CuPy would hand out again, if it had got it back
    filler = cupy.full(N, 7.0, dtype=cupy.float32)
    assert float(np.asarray(_core.max(t).to(CPU))) == 3.0 and float(np.asarray(_core.min(t).to(CPU))) == 3.0
    del t, filler


@pytest.mark.parametrize("bad", [0, -2])
def test_stream_arguments_on_the_gpu(gpu, bad):
    t = filled(gpu, 1.0)
    with pytest.raises(ValueError, match=r"stream must be None, -1, 1, 2 or a CUDA stream handle"):
        t.__dlpack__(stream=bad)
    for ok in (None, 1, 2, -1):
        cap = t.__dlpack__(stream=ok)
        del cap  # unused: freed without ordering against a stream nobody read on
    _core.cuda_sync(0)
