"""__dlpack__'s arguments as the array API (2023.12) defines them, checked where they can be without a GPU: stream
(None only for a CPU tensor; ints, never bools or strings), max_version, dl_device, copy, and a clear TypeError for
anything else. The stream's use on a GPU (the consumer waits for our queue at export, our queue waits for the
consumer's at release) is tested in tests/gpu/test_interop.py."""
import numpy as np
import pytest

from singa_lite import _core, tensor

CPU = _core.Device("cpu")


def cpu_tensor(values):
    return _core.Tensor.from_buffer(np.ascontiguousarray(values))


def test_a_cpu_tensor_has_no_stream():
    t = cpu_tensor(np.arange(4, dtype=np.float32))
    t.__dlpack__(stream=None)  # what numpy and torch pass for a CPU tensor
    for bad in (1, 2, -1, 12345):
        with pytest.raises(ValueError, match=r"on the CPU, which has no streams; pass stream=None"):
            t.__dlpack__(stream=bad)


@pytest.mark.parametrize("bad", ["1", 1.0, True, object()])
def test_stream_must_be_none_or_an_int(bad):
    t = cpu_tensor(np.zeros(2, np.float32))
    with pytest.raises(TypeError, match=r"stream must be None or an int"):
        t.__dlpack__(stream=bad)


def test_numpy_integers_are_ints():
    t = cpu_tensor(np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="no streams"):  # accepted as an int, then refused for the CPU
        t.__dlpack__(stream=np.int64(1))


def test_unknown_arguments_are_refused():
    t = cpu_tensor(np.zeros(2, np.float32))
    with pytest.raises(TypeError, match=r"unexpected argument 'strem'; it takes stream, max_version, dl_device"):
        t.__dlpack__(strem=None)


def test_max_version_picks_the_capsule():
    t = cpu_tensor(np.zeros(2, np.float32))
    assert "dltensor_versioned" in repr(t.__dlpack__(max_version=(1, 0)))
    assert "dltensor_versioned" in repr(t.__dlpack__(max_version=[1, 2]))
    assert '"dltensor"' in repr(t.__dlpack__(max_version=(0, 8)))
    assert '"dltensor"' in repr(t.__dlpack__())
    with pytest.raises(TypeError, match=r"max_version must be a \(major, minor\) pair"):
        t.__dlpack__(max_version=1)


def test_dl_device_must_be_this_tensors_device():
    t = cpu_tensor(np.arange(3, dtype=np.float64))
    a = np.from_dlpack(t, device="cpu")  # numpy passes dl_device=(1, 0)
    assert np.shares_memory(a, np.asarray(t))
    t.__dlpack__(dl_device=(1, 0))
    with pytest.raises(BufferError, match=r"cannot be exported to device \(2, 0\).*to_device"):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(TypeError, match="dl_device must be a"):
        t.__dlpack__(dl_device=2)


def test_copy_true_gives_memory_of_its_own_and_copy_false_shares():
    values = np.arange(6, dtype=np.float32)
    t = cpu_tensor(values)
    copied = np.from_dlpack(t, copy=True)
    shared = np.from_dlpack(t, copy=False)
    assert not np.shares_memory(copied, np.asarray(t))
    assert np.shares_memory(shared, np.asarray(t))
    _core.fill_(t, 7.0)
    np.testing.assert_array_equal(copied, np.arange(6))
    np.testing.assert_array_equal(shared, np.full(6, 7.0))


def test_the_python_tensor_passes_the_arguments_through():
    x = tensor.from_numpy(np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match="no streams"):
        x.__dlpack__(stream=1)
    np.testing.assert_array_equal(np.from_dlpack(x), np.ones((2, 2)))
