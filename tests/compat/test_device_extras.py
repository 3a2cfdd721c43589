"""SINGA's GPU queries (``device.get_gpu_mem_size``, ``device.device_query``) and its OpenCL functions.

Without a usable GPU the queries raise CudaError naming what is missing, like create_cuda_gpu; the tests
marked gpu read real numbers and check them against an allocation of known size. OpenCL is absent on purpose:
no platforms, no devices, and creating one says so.
"""
import re

import numpy as np
import pytest

from singa_lite import CudaError, _core, device, tensor


def test_queries_without_gpu_name_what_is_missing():
    if device.cuda_is_available():
        pytest.skip("this machine has a usable GPU")
    reason = _core.cuda_unavailable_reason()
    with pytest.raises(CudaError, match=r"cannot query cuda:0: ") as err:
        device.get_gpu_mem_size(0)
    assert reason in str(err.value)
    with pytest.raises(CudaError, match=r"cannot query cuda:1: "):
        device.device_query(1, verbose=True)


def test_queries_check_the_id():
    with pytest.raises(TypeError, match="id must be an int"):
        device.get_gpu_mem_size("0")
    with pytest.raises(TypeError, match="id must be an int"):
        device.device_query(0.0)
    with pytest.raises(CudaError, match="cuda:-1"):
        device.get_gpu_mem_size(-1)


def test_opencl_is_absent_on_purpose():
    assert device.get_num_opencl_platforms() == 0
    assert device.get_num_opencl_devices() == 0
    with pytest.raises(RuntimeError, match="no OpenCL backend"):
        device.create_opencl_device()


@pytest.mark.gpu
def test_gpu_mem_size_sees_our_allocations():
    free0, total = device.get_gpu_mem_size(0)
    assert 0 < free0 <= total
    dev = device.create_cuda_gpu_on(0)
    dev.empty_cache()
    free0, _ = device.get_gpu_mem_size(0)
    big = tensor.Tensor((256, 1024, 1024), dev)  # 1 GiB of float32, from the caching allocator
    free1, total1 = device.get_gpu_mem_size(0)
    assert total1 == total
    assert free0 - free1 >= 1 << 30  # the runtime's context is the one queried: our memory counts
    del big
    dev.empty_cache()
    assert device.get_gpu_mem_size(0)[0] > free1


@pytest.mark.gpu
def test_device_query_describes_the_gpu():
    _, total = device.get_gpu_mem_size(0)
    short = device.device_query(0)
    assert re.search(rf"^Total global memory: +{total}$", short, re.M)
    assert re.search(r"^Maximum threads per block: +\d+$", short, re.M)
    assert "Name:" not in short
    full = device.device_query(0, verbose=True)
    assert full.startswith(short.splitlines()[0]) and len(full) > len(short)
    major = int(re.search(r"^Major revision number: +(\d+)$", full, re.M).group(1))
    assert major >= 5  # every GPU a CUDA 12/13 build runs on
    assert re.search(r"^Warp size: +32$", full, re.M)
    np.testing.assert_equal(int(re.search(r"^Device id: +(\d+)$", full, re.M).group(1)), 0)
