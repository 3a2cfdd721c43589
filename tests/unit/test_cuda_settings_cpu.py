"""The CUDA memory and index-check settings where no GPU is needed to check them: how SINGA_LITE_CUDA_CACHE_LIMIT is
read, the settings' refusal of a GPU that does not exist, and that deferring index checks to the GPU changes
nothing on the CPU (an out-of-range index still raises at the call, before anything is written, with the same
message). The GPU side is in tests/gpu/test_gpu_memory.py and tests/gpu/test_index_checks_gpu.py."""
import numpy as np
import pytest

from singa_lite import _core

cuda_build = pytest.mark.skipif(not _core.cuda_compiled(), reason="the CUDA allocator exists in CUDA builds only")


@cuda_build
@pytest.mark.parametrize("text,value", [("0", 0), ("1073741824", 1 << 30), ("512M", 512 << 20), ("512m", 512 << 20),
                                        ("8G", 8 << 30), ("2GiB", 2 << 30), ("3k", 3 << 10), ("1T", 1 << 40)])
def test_byte_counts(text, value):
    assert _core._parse_bytes(text, "SINGA_LITE_CUDA_CACHE_LIMIT") == value


@cuda_build
@pytest.mark.parametrize("text", ["", "G", "-1", "1.5G", "12X", "8 G", "99999999999999999999", "20000000000T"])
def test_bad_byte_counts_name_the_variable(text):
    with pytest.raises(ValueError, match=r"SINGA_LITE_CUDA_CACHE_LIMIT: expected a byte count such as 1073741824, "
                                         r"512M or 8G, got"):
        _core._parse_bytes(text, "SINGA_LITE_CUDA_CACHE_LIMIT")


def test_limits_of_a_gpu_that_does_not_exist_are_refused():
    n = _core.cuda_device_count()
    for set_limit in (_core.cuda_set_cache_limit, _core.cuda_set_memory_limit):
        with pytest.raises(ValueError, match=f"cuda:{n} "):
            set_limit(n, 1 << 20)


@pytest.mark.parametrize("deferred", [True, False])
def test_the_cpu_checks_indices_at_the_call_whatever_the_gpu_does(deferred):
    saved = _core.cuda_deferred_index_checks()
    _core.cuda_set_deferred_index_checks(deferred)
    try:
        assert _core.cuda_deferred_index_checks() == (deferred and _core.cuda_compiled())
        with pytest.raises(IndexError, match=r"^one_hot: indices must lie in \[0, 5\), got values in \[1, 7\]$"):
            _core.one_hot(_core.Tensor.from_buffer(np.array([1, 7], np.int32)), 5)
        dense = _core.Tensor.from_buffer(np.zeros(5, np.float32))
        with pytest.raises(IndexError, match=r"^index_add: indices must lie in \[0, 5\), got values in \[-1, 1\]$"):
            _core.index_add_(dense, _core.Tensor.from_buffer(np.array([1, -1], np.int64)),
                             _core.Tensor.from_buffer(np.ones(2, np.float32)))
        np.testing.assert_array_equal(np.asarray(dense), np.zeros(5))  # nothing written
        with pytest.raises(IndexError, match=r"^take: indices must lie in \[0, 5\), got values in \[5, 5\]$"):
            _core.take(dense, _core.Tensor.from_buffer(np.array([5], np.int64)))
    finally:
        _core.cuda_set_deferred_index_checks(saved)
