"""singa_lite.multi_device: split_and_load, replicate, all_reduce (and its choice of route), max_divergence
(replicas on the CPU; the GPU twin runs where a CUDA build sees two GPUs; the NCCL route's own tests are in
tests/gpu/test_multi_device_nccl.py)."""
import numpy as np
import pytest

from singa_lite import autograd, device, tensor
from singa_lite.parallel import multi_device
from singa_lite.tensor import Tensor

CPU = device.create_cpu_device()


@pytest.mark.parametrize("n,k,sizes", [(8, 2, [4, 4]), (7, 3, [3, 2, 2]), (5, 5, [1] * 5), (10, 4, [3, 3, 2, 2])])
@pytest.mark.parametrize("as_tensor", [False, True])
def test_split_and_load_contiguous_parts_sizes_differ_by_one(n, k, sizes, as_tensor):
    data = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    parts = multi_device.split_and_load(tensor.from_numpy(data) if as_tensor else data, [CPU] * k)
    assert [len(p) for p in parts] == sizes
    assert all(p.device == CPU and not p.requires_grad for p in parts)
    np.testing.assert_array_equal(np.concatenate([tensor.to_numpy(p) for p in parts]), data)


def test_split_and_load_too_few_examples():
    with pytest.raises(ValueError, match="3 examples cannot be split over 4 devices"):
        multi_device.split_and_load(np.zeros((3, 2), np.float32), [CPU] * 4)
    with pytest.raises(ValueError, match="no devices"):
        multi_device.split_and_load(np.zeros((3, 2), np.float32), [])


def test_replicate_makes_independent_named_leaves():
    w = Tensor(data=np.ones((2, 2), np.float32), stores_grad=True, name="w")
    r0, r1 = multi_device.replicate([w], [CPU, CPU])
    assert r0[0].name == r1[0].name == "w" and r0[0].stores_grad and r1[0].requires_grad
    r0[0] += 1.0
    assert tensor.to_numpy(r1[0]).sum() == 4 and tensor.to_numpy(w).sum() == 4
    assert multi_device.max_divergence([r0, r1]) == 1.0


@pytest.mark.parametrize("k", [1, 2, 3])
def test_all_reduce_sums_replica_dependent_values_into_every_replica(k):
    # replica c holds c + position, so an offset or a missed replica shows in the closed-form sum
    pos = np.arange(6, dtype=np.float32).reshape(2, 3)
    ts = [tensor.from_numpy(c + pos) for c in range(k)]
    multi_device.all_reduce(ts)
    for t in ts:
        np.testing.assert_array_equal(tensor.to_numpy(t), k * pos + k * (k - 1) / 2)


@pytest.mark.parametrize("backend", ["auto", "host"])
def test_cpu_replicas_take_the_host_route(backend):
    ts = [tensor.from_numpy(np.full((2, 2), c, np.float32)) for c in range(3)]
    assert multi_device.choose_backend(ts, backend) == "host"
    assert multi_device.all_reduce(ts, backend=backend) is ts
    for t in ts:
        np.testing.assert_array_equal(tensor.to_numpy(t), np.full((2, 2), 3, np.float32))


def test_forced_nccl_names_the_condition_that_fails():
    ts = [tensor.from_numpy(np.ones(3, np.float32)) for _ in range(2)]
    with pytest.raises(ValueError, match=r"backend='nccl'.*every tensor must be on a CUDA device, tensor 0 is on "
                                         r"cpu.*backend='host'"):
        multi_device.all_reduce(ts, backend="nccl")
    np.testing.assert_array_equal(tensor.to_numpy(ts[0]), [1, 1, 1])  # nothing was touched
    with pytest.raises(ValueError, match="there are no tensors"):
        multi_device.all_reduce([], backend="nccl")


def test_no_tensors_is_nothing_to_do():
    assert multi_device.all_reduce([]) == [] and multi_device.all_reduce([], backend="host") == []


@pytest.mark.parametrize("backend", ["NCCL", "mpi", "", None])
def test_unknown_backend_is_a_value_error(backend):
    ts = [tensor.from_numpy(np.ones(3, np.float32))]
    with pytest.raises(ValueError, match=r"backend must be one of 'auto', 'nccl', 'host'"):
        multi_device.all_reduce(ts, backend=backend)


def test_two_replicas_step_like_one_device():
    """The summed, share-scaled gradients of two replicas equal one device's gradient of the whole batch."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(7, 4)).astype(np.float32), rng.integers(0, 3, 7).astype(np.int32)
    w = Tensor(data=rng.normal(size=(4, 3)).astype(np.float32), stores_grad=True, name="w")
    autograd.training = True
    try:
        (g_one,) = autograd.gradients(autograd.softmax_cross_entropy(autograd.matmul(
            tensor.from_numpy(x), w), tensor.from_numpy(y))).values()
        replicas = multi_device.replicate([w], [CPU, CPU])
        grads = []
        for xi, yi, (wi,) in zip(multi_device.split_and_load(x, [CPU, CPU]),
                                 multi_device.split_and_load(y, [CPU, CPU]), replicas):
            loss = autograd.softmax_cross_entropy(autograd.matmul(xi, wi), yi)
            grads.append(autograd.gradients(loss, dy=len(xi) / len(x))[wi])
    finally:
        autograd.training = False
    multi_device.all_reduce(grads)
    for g in grads:
        np.testing.assert_allclose(tensor.to_numpy(g), tensor.to_numpy(g_one), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_all_reduce_across_two_gpus():
    if device.get_num_gpus() < 2:
        pytest.skip("needs two GPUs")
    devs = [device.create_cuda_gpu_on(0), device.create_cuda_gpu_on(1)]
    ts = [tensor.from_numpy(np.full((3,), c + 1, np.float32), dev) for c, dev in enumerate(devs)]
    multi_device.all_reduce(ts)
    assert [t.device for t in ts] == devs
    for t in ts:
        np.testing.assert_array_equal(tensor.to_numpy(t), [3, 3, 3])
