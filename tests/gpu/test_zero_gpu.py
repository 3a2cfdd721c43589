"""DistOpt(zero_stage=1|2) over NCCL on one GPU (world size 1: every parameter is this rank's, but the sharded
code runs on the device: the reduce into the owner, the owners' broadcast, clipping across shards, the vote,
the allocator's cache handed back after stage 2's first step, memory_report's gpu_peak)."""
import numpy as np
import pytest

from singa_lite import autograd, device, dist, opt, tensor
from singa_lite.comm import nccl

pytestmark = pytest.mark.gpu

N, D, H, C = 24, 7, 40, 5


@pytest.fixture(scope="module")
def gpu():
    return device.create_cuda_gpu_on(0)


@pytest.fixture(scope="module")
def comm(gpu):
    problem = nccl.readiness()
    if problem:
        pytest.skip(problem)
    c = dist.init(backend="nccl", holder=dist.NcclIdHolder(), rank=0, world_size=1, timeout=60)
    yield c
    c.close()


def _train(gpu, dopt, steps=6):
    rng = np.random.default_rng(0)
    shapes = {"W1": (D, H), "b1": (H,), "W2": (H, C), "b2": (C,)}
    params = {k: tensor.Tensor(data=(rng.standard_normal(s) * 0.3).astype(np.float32), device=gpu,
                               requires_grad=True, stores_grad=True, name=k) for k, s in shapes.items()}
    autograd.training = True
    for step in range(steps):
        r = np.random.default_rng(1000 + step)
        x = tensor.from_numpy(r.standard_normal((N, D)).astype(np.float32)).to_device(gpu)
        y = tensor.from_numpy(r.integers(0, C, N).astype(np.int32)).to_device(gpu)
        h = autograd.tanh(autograd.add_bias(autograd.matmul(x, params["W1"]), params["b1"]))
        loss = autograd.softmax_cross_entropy(autograd.add_bias(autograd.matmul(h, params["W2"]), params["b2"]), y)
        pending = dopt.backward(loss, 50)
        pending.clip_grad_norm(0.5)
        pending.finish()
    return {k: tensor.to_numpy(v) for k, v in params.items()}


@pytest.mark.parametrize("stage", [1, 2])
def test_sharded_stages_equal_stage_0_on_the_gpu(comm, gpu, stage):
    want = _train(gpu, opt.DistOpt(opt.Adam(lr=0.01), communicator=comm))
    d = opt.DistOpt(opt.Adam(lr=0.01), communicator=comm, zero_stage=stage)
    got = _train(gpu, d)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6, err_msg=k)
    rep = d.memory_report()
    assert rep["owned_parameters"] == 4 and rep["optimizer_state"] == 2 * rep["parameters"], rep
    assert isinstance(rep["gpu_peak"], int) and rep["gpu_peak"] >= rep["parameters"], rep
