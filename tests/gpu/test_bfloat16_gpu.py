"""bfloat16 on the GPU: the CUDA kernels (float32 compute, one rounding per result, as the CPU) against the
CPU's bfloat16 results, matmul through cuBLAS (CUDA_R_16BF), random fills, and NCCL carrying bfloat16.
Marked `gpu`: skipped without a usable GPU (NCCL parts also without NCCL)."""
import numpy as np
import pytest

from singa_lite import _core, device, dist, tensor
from singa_lite.comm import nccl

pytestmark = pytest.mark.gpu

BF16 = tensor.bfloat16
CPU = _core.Device("cpu")


@pytest.fixture(scope="module")
def gpu():
    return device.create_cuda_gpu_on(0)


def bf(x) -> _core.Tensor:
    return _core.Tensor.from_buffer(np.ascontiguousarray(x, np.float64)).cast(BF16)


def vals(t: _core.Tensor) -> np.ndarray:
    t = t if t.device.is_cpu() else t.to(CPU)
    return np.asarray(t.cast(tensor.float32)).astype(np.float64)


def close(got, want, msg=""):
    # the same float32 value rounded once on both sides; libm and summation order may move it one step
    np.testing.assert_allclose(got, want, rtol=2.0 ** -7, atol=1e-30, err_msg=msg)


def test_elementwise_reductions_and_casts_match_the_cpu(gpu, rng):
    a, b = bf(rng.uniform(-4, 4, (33, 17))), bf(rng.uniform(0.5, 4, (33, 17)))
    ga, gb = a.to(gpu.core), b.to(gpu.core)
    for op in ("add", "sub", "mul", "div", "maximum", "minimum"):
        r = getattr(_core, op)(ga, gb)
        assert r.dtype == BF16 and r.device == gpu.core
        close(vals(r), vals(getattr(_core, op)(a, b)), op)
    for op in ("relu", "abs", "neg", "square", "exp", "tanh", "sigmoid"):
        close(vals(getattr(_core, op)(ga)), vals(getattr(_core, op)(a)), op)
    np.testing.assert_array_equal(vals(_core.max(ga, [1], False)), vals(_core.max(a, [1], False)))
    close(vals(_core.sum(ga, [0], False)), vals(_core.sum(a, [0], False)), "sum")
    close(vals(_core.add_scalar(ga, 0.1)), vals(_core.add_scalar(a, 0.1)), "add_scalar")
    x = rng.standard_normal(1000) * 1e3
    np.testing.assert_array_equal(vals(_core.Tensor.from_buffer(x).to(gpu.core).cast(BF16)), vals(bf(x)))
    np.testing.assert_array_equal(vals(bf(x).to(gpu.core).cast(tensor.float16)), vals(bf(x).cast(tensor.float16)))


def test_matmul_through_cublas(gpu, rng):
    a, b = bf(rng.standard_normal((2, 40, 70))), bf(rng.standard_normal((2, 70, 30)))
    got = _core.matmul(a.to(gpu.core), b.to(gpu.core))
    assert got.dtype == BF16 and tuple(got.shape) == (2, 40, 30)
    exact = vals(a) @ vals(b)
    # float32 accumulation, one rounding: within a bfloat16 step of the exact product's magnitude
    assert (np.abs(vals(got) - exact) <= 2.0 ** -7 * (np.abs(vals(a)) @ np.abs(vals(b)))).all()


def test_random_fills_in_bfloat16(gpu):
    t = tensor.Tensor((4096,), device=gpu, dtype=BF16).uniform(-1.0, 1.0)
    v = vals(t.data)
    assert v.min() >= -1.0 and v.max() < 1.0 and abs(v.mean()) < 0.1


def test_nccl_carries_bfloat16(gpu, rng):
    problem = nccl.readiness()
    if problem:
        pytest.skip(problem)
    comm = dist.init(backend="nccl", holder=dist.NcclIdHolder(), rank=0, world_size=1, timeout=60)
    try:
        a = vals(bf(rng.standard_normal((6, 5))))
        for op in ("sum", "avg", "max"):
            t = tensor.Tensor(data=a, dtype=BF16).to_device(gpu)
            comm.all_reduce(t, op)
            np.testing.assert_array_equal(tensor.to_numpy(t), a, err_msg=op)  # one rank: the values themselves
        g = comm.all_gather(tensor.Tensor(data=a, dtype=BF16).to_device(gpu))
        np.testing.assert_array_equal(tensor.to_numpy(tensor.from_raw_tensor(g) if isinstance(g, _core.Tensor)
                                                      else g)[0], a)
    finally:
        comm.close()
