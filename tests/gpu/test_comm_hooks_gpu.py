"""The communication hooks and the replica check on the GPU code path: a one-rank nccl communicator (NCCL
cannot put two ranks on one GPU; the multi-rank behaviour is proven on the CPU backends in
tests/multiproc/test_comm_hooks_dist.py), buffers and parameters on the GPU. Each result must equal the same
hook's on the CPU (one-rank tcp) for the same values: PowerSGD's matmuls, Gram-Schmidt, error feedback and
warm start run on the device. Marked `gpu`: skipped without a usable GPU or NCCL."""
import numpy as np
import pytest

from singa_lite import device, dist, opt, tensor
from singa_lite.comm import nccl
from singa_lite.parallel import hooks
from singa_lite.parallel.bucket import GradBucket
from singa_lite.parallel.replica_check import check_replicas, replica_digests

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu():
    return device.create_cuda_gpu_on(0)


@pytest.fixture(scope="module")
def comms(gpu):
    problem = nccl.readiness()
    if problem:
        pytest.skip(problem)
    g = dist.init(backend="nccl", holder=dist.NcclIdHolder(), rank=0, world_size=1, timeout=60)
    c = dist.init(backend="tcp", timeout=60)
    yield g, c
    g.close()
    c.close()


def params(shapes, dev=None):
    rng = np.random.default_rng(0)
    ps = [tensor.Tensor(data=rng.standard_normal(s).astype(np.float32), stores_grad=True) for s in shapes]
    return [p.to_device(dev) for p in ps] if dev is not None else ps


@pytest.mark.parametrize("hook", ["allreduce", "fp16", "bf16", "powerSGD"])
def test_hook_on_gpu_equals_cpu(comms, gpu, hook):
    g_comm, c_comm = comms
    shapes = [(20, 12), (12,), (8, 3, 2, 2), (5,)]
    n = sum(int(np.prod(s)) for s in shapes)
    fn = {"allreduce": hooks.allreduce_hook, "fp16": hooks.fp16_compress_hook, "bf16": hooks.bf16_compress_hook,
          "powerSGD": hooks.powerSGD_hook}[hook]
    new_state = (lambda: hooks.PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=1)) \
        if hook == "powerSGD" else hooks.HookState
    states, ps = (new_state(), new_state()), (params(shapes, gpu), params(shapes))
    for step in range(4):  # plain, then compressed with warm start and error feedback
        values = np.random.default_rng(step).standard_normal(n).astype(np.float32)
        outs = []
        for state, comm, p, dev in ((states[0], g_comm, ps[0], gpu), (states[1], c_comm, ps[1], None)):
            buf = tensor.from_numpy(values)
            if dev is not None:
                buf.to_device(dev)
            out = hooks.run_comm_hook(fn, state, GradBucket(0, buf, p, True, comm)).wait()
            assert out is buf and out.device == buf.device
            outs.append(tensor.to_numpy(out))
        np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5 * np.abs(outs[1]).max(),
                                   err_msg=f"{hook} step {step}")
    assert states[0].bytes_sent == states[1].bytes_sent and states[0].bytes_plain == states[1].bytes_plain


def test_replica_check_hashes_gpu_tensors_like_cpu_ones(comms, gpu):
    g_comm, _ = comms
    cpu = {"fc.W": params([(6, 4)])[0], "fc.b": params([(4,)])[0]}
    on_gpu = {n: p.clone().to_device(gpu) for n, p in cpu.items()}
    assert replica_digests(on_gpu) == replica_digests(cpu)  # the same values: the same digests
    sgd = opt.SGD(lr=0.1, momentum=0.9)
    for n, p in on_gpu.items():
        sgd.apply(n, p, tensor.from_numpy(np.ones(p.shape, np.float32)).to_device(gpu))
    check_replicas(g_comm, on_gpu, sgd)  # CPU digests through the nccl communicator (staged on the GPU)
