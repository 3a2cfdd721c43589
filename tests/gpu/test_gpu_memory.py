"""GPU memory held by the caching allocator against the libraries that allocate for themselves (cuBLAS, cuDNN, NCCL
take memory with cudaMalloc): a library call that fails for lack of memory while the cache holds free blocks gets
the cache emptied and is made again; NCCL gets it emptied before its communicator is created; the cache can be
capped and the memory of live tensors limited. The out-of-memory cases run in a child process that fills the whole
GPU first. Marked `gpu`: skipped where no GPU is usable."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from singa_lite import _core

# gpu_exclusive: tests running beside these in other processes would find no memory left
pytestmark = [pytest.mark.gpu, pytest.mark.gpu_exclusive]

CPU = _core.Device("cpu")
DT = _core.DType


@pytest.fixture(scope="module")
def gpu():
    return _core.Device("cuda:0")


@pytest.fixture
def limits(gpu):
    yield
    _core.cuda_set_cache_limit(0, None)
    _core.cuda_set_memory_limit(0, None)


def run_child(body: str) -> str:
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


# Fills the GPU with the allocator's blocks and frees them, so that nearly all of its memory sits in the cache:
# what a training job looks like to a library that allocates for itself after the first steps. The outputs the
# calls below will need are allocated (and freed) first, so that they come from the cache and only the library
# itself is short of memory.
HOARD = """
import numpy as np
from singa_lite import _core
DT, gpu, CPU = _core.DType, _core.Device("cuda:0"), _core.Device("cpu")

def hoard():
    blocks = []
    for size in (1 << 30, 1 << 26, 1 << 21):
        while True:
            try:
                blocks.append(_core.Tensor((size,), DT.bool, gpu))
            except MemoryError:
                break
    cached_before = _core.cuda_memory_stats(0)["cached"]
    del blocks
    stats = _core.cuda_memory_stats(0)
    assert stats["cached"] > cached_before + (8 << 30), stats
    return stats["cached"]
"""


def test_cublas_gets_the_cache_when_it_needs_memory():
    out = run_child(HOARD + """
a = _core.Tensor.from_buffer(np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)).to(gpu)
b = _core.Tensor.from_buffer(np.random.default_rng(1).standard_normal((512, 128)).astype(np.float32)).to(gpu)
_core.Tensor((256, 128), DT.float32, gpu)  # the product's block, freed at once: cached
cached = hoard()
c = _core.matmul(a, b)  # the first matmul: cuBLAS creates its handle and workspace with cudaMalloc
got = np.asarray(c.to(CPU))
want = np.asarray(a.to(CPU)).astype(np.float64) @ np.asarray(b.to(CPU)).astype(np.float64)
assert np.abs(got - want).max() < 1e-3, np.abs(got - want).max()
print("cached", cached, "->", _core.cuda_memory_stats(0)["cached"])
""")
    before, after = (int(v) for v in out.split()[1:4:2])
    assert after < before // 2, out  # the retry emptied the cache for cuBLAS


def test_cudnn_gets_the_cache_when_it_needs_memory():
    if not _core.cudnn_available():
        pytest.skip(f"cuDNN not usable: {_core.cudnn_unavailable_reason()}")
    out = run_child(HOARD + """
x = _core.Tensor.from_buffer(np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)).to(gpu)
w = _core.Tensor.from_buffer(np.random.default_rng(1).standard_normal((8, 3, 3, 3)).astype(np.float32)).to(gpu)
_core.Tensor((2, 8, 16, 16), DT.float32, gpu)  # the output's block, freed at once: cached
cached = hoard()
y = _core.cudnn_conv2d_forward(x, w, (1, 1), (1, 1), (1, 1), 1)  # the first cuDNN call creates its handle
print("cached", cached, "->", _core.cuda_memory_stats(0)["cached"])
got = np.asarray(y.to(CPU))
import numpy.lib.stride_tricks as st
xp = np.pad(np.asarray(x.to(CPU)).astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
win = st.sliding_window_view(xp, (3, 3), axis=(2, 3))  # N, C, 16, 16, 3, 3
want = np.einsum("nchwij,ocij->nohw", win, np.asarray(w.to(CPU)).astype(np.float64))
assert np.abs(got - want).max() < 1e-3, np.abs(got - want).max()
""")
    before, after = (int(v) for v in out.split()[1:4:2])
    assert after < before // 2, out


def test_nccl_gets_the_cache_before_its_communicator():
    from singa_lite.comm import nccl
    problem = nccl.readiness()
    if problem:
        pytest.skip(problem)
    out = run_child(HOARD + """
from singa_lite import dist
t = _core.Tensor.from_buffer(np.arange(1000, dtype=np.float32)).to(gpu)
cached = hoard()
comm = dist.init(backend="nccl", holder=dist.NcclIdHolder(), rank=0, world_size=1, timeout=120)
comm.all_reduce(t, "sum")  # NCCL's init and its first collective allocate its buffers
np.testing.assert_array_equal(np.asarray(t.to(CPU)), np.arange(1000))
print("cached", cached, "->", _core.cuda_memory_stats(0)["cached"])
comm.close()
""")
    before, after = (int(v) for v in out.split()[1:4:2])
    assert after < before // 2, out


def test_the_cache_cap(gpu, limits):
    _core.cuda_empty_cache(0)
    blocks = [_core.Tensor((1 << 20,), DT.float32, gpu) for _ in range(8)]  # 4 MiB each
    _core.cuda_set_cache_limit(0, 10 << 20)
    del blocks
    stats = _core.cuda_memory_stats(0)
    assert stats["cache_limit"] == 10 << 20 and stats["cached"] == 8 << 20  # two fit, the rest went to the driver
    _core.cuda_set_cache_limit(0, 0)  # lowering it trims at once
    assert _core.cuda_memory_stats(0)["cached"] == 0
    t = _core.Tensor((1 << 20,), DT.float32, gpu)
    _core.fill_(t, 3.0)
    u = _core.add(t, t)  # freed results go straight back, and results stay right
    del t
    np.testing.assert_array_equal(np.asarray(u.to(CPU))[:3], [6, 6, 6])
    assert _core.cuda_memory_stats(0)["cached"] == 0
    _core.cuda_set_cache_limit(0, None)
    assert _core.cuda_memory_stats(0)["cache_limit"] is None


def test_the_cache_cap_from_the_environment():
    out = run_child("""
from singa_lite import _core
t = _core.Tensor((1024,), _core.DType.float32, _core.Device("cuda:0"))
print(_core.cuda_memory_stats(0)["cache_limit"])
""".replace("from singa_lite", "import os; os.environ['SINGA_LITE_CUDA_CACHE_LIMIT'] = '512M'\nfrom singa_lite"))
    assert out.strip() == str(512 << 20)


def test_the_memory_limit(gpu, limits):
    in_use = _core.cuda_memory_stats(0)["in_use"]
    _core.cuda_set_memory_limit(0, in_use + (8 << 20))
    keep = _core.Tensor((1 << 20,), DT.float32, gpu)  # 4 MiB: fits
    with pytest.raises(MemoryError, match=r"the memory limit of this device \(set_memory_limit\) is"):
        _core.Tensor((2 << 20,), DT.float32, gpu)  # 8 MiB more does not
    _core.cuda_set_memory_limit(0, None)
    del keep
