"""The CUDA runtime pieces of the foundation: devices, memory, fill, copies between host and GPU.
Marked `gpu`: skipped (with the reason) where no GPU is usable."""
import numpy as np
import pytest

import singa_lite
from singa_lite import _core, device, tensor

pytestmark = pytest.mark.gpu


@pytest.fixture
def gpu():
    return device.create_cuda_gpu_on(0)


def test_build_reports_cuda(gpu):
    info = singa_lite.build_info()["cuda"]
    assert info["compiled"] and info["device_count"] >= 1 and info["driver_version"] > 0
    assert gpu.id() == 0 and gpu.lang() == "cuda"


@pytest.mark.parametrize("dtype", [tensor.float16, tensor.float32, tensor.float64, tensor.int32, tensor.int64,
                                   tensor.bool_])
def test_new_gpu_tensor_is_zero_and_fill_works(gpu, dtype):
    t = tensor.Tensor((3, 1000), gpu, dtype)
    assert t.device is gpu
    assert not tensor.to_numpy(t).any()
    t.set_value(1)
    np.testing.assert_array_equal(tensor.to_numpy(t), np.ones((3, 1000), tensor.numpy_dtype(dtype)))


def test_host_device_roundtrip(gpu):
    a = np.random.default_rng(0).standard_normal((17, 33)).astype(np.float32)
    t = tensor.from_numpy(a).to_device(gpu)
    assert t.device is gpu
    np.testing.assert_array_equal(tensor.to_numpy(t), a)
    back = tensor.to_host(t)
    assert back.device.is_cpu()
    np.testing.assert_array_equal(tensor.to_numpy(back), a)
    c = t.clone()  # device-to-device
    np.testing.assert_array_equal(tensor.to_numpy(c), a)


def test_copy_from_numpy_into_gpu_tensor(gpu):
    t = tensor.Tensor((4, 5), gpu, tensor.float32)
    t.copy_from_numpy(np.arange(20, dtype=np.float64))
    np.testing.assert_array_equal(tensor.to_numpy(t).ravel(), np.arange(20))


def test_ops_run_on_the_gpu_and_stay_there(gpu):
    t = tensor.Tensor((2, 2), gpu)
    t.set_value(1.5)
    s = t + t
    assert s.device is gpu
    np.testing.assert_array_equal(tensor.to_numpy(s), np.full((2, 2), 3.0, np.float32))


def test_mixing_devices_is_a_clear_error(gpu):
    with pytest.raises(ValueError, match="different devices"):
        tensor.Tensor((2, 2), gpu) + tensor.Tensor((2, 2))


def test_out_of_range_gpu_id_is_an_error():
    with pytest.raises(singa_lite.CudaError, match="ids 0 to"):
        device.create_cuda_gpu_on(_core.cuda_device_count())


def test_dlpack_exchange_with_torch_orders_the_streams(gpu):
    """DLPack both ways with a CUDA PyTorch: the consumer's stream waits for the producer's queued kernels
    (a large multiply still in flight when the other side reads), and the values arrive intact."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch here has no CUDA")
    n = 1 << 24
    a = tensor.Tensor((n,), gpu)
    a.set_value(1.0)
    t = a.data
    for _ in range(20):  # queue enough work that a reader not ordered behind it would see old values
        t = _core.mul_scalar(t, 1.0001)
    want = np.float32(1.0001) ** 20
    theirs = torch.from_dlpack(t)  # torch reads on its current stream; __dlpack__ made it wait for ours
    assert theirs.device.type == "cuda" and theirs.shape == (n,)
    assert torch.allclose(theirs, torch.full_like(theirs, float(want)), rtol=1e-5)
    src = torch.arange(n, device="cuda", dtype=torch.float32).mul_(2.0)  # queued on torch's stream
    ours = _core.Tensor.from_dlpack(src)  # we handed torch our stream to order its pending work before ours
    got = np.asarray(_core.add(ours, ours).to(_core.Device("cpu")))
    np.testing.assert_array_equal(got, np.arange(n, dtype=np.float32) * 4)
    del ours
    _core.cuda_sync(gpu.id())
