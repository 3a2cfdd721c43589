"""singa_lite.multi_device's NCCL route: the single-process multi-device clique (_core.NcclClique), one NCCL
rank per visible GPU, driven by this one process. World size = the number of GPUs this process sees (1 on a
one-GPU machine: NCCL at world size 1 still runs its kernels and every check). Results are compared with the
host route (sum) and with numpy (the other ops); the argument checks, the errors after abort / close and the
clique cache are covered too. Marked `gpu`: skipped without a usable GPU; skipped with the reason where NCCL
cannot be loaded. Data are fresh random values each run (the seed is in the failure message)."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from singa_lite import _core, device, tensor
from singa_lite.parallel import multi_device
from singa_lite.comm import CommError, nccl

pytestmark = pytest.mark.gpu

NP = {"float16": np.float16, "float32": np.float32, "float64": np.float64, "int32": np.int32}
OPS = ("sum", "avg", "max", "min", "prod")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def gpus():
    problem = nccl.readiness()
    if problem:
        pytest.skip(problem)
    return [device.create_cuda_gpu_on(i) for i in range(device.get_num_gpus())]


@pytest.fixture(scope="module")
def clique(gpus):
    c = _core.NcclClique([d.index for d in gpus], 60.0)
    yield c
    c.close()


def replica_values(rng, n, shape, dtype, op):
    """One array per replica; prod gets values near 1 (floats) or in [-2, 2] (ints) so that it stays finite
    and exact enough to compare."""
    if dtype == "int32":
        high = 3 if op == "prod" else 1000
        return [rng.integers(-high + 1, high, size=shape).astype(np.int32) for _ in range(n)]
    if op == "prod":
        return [rng.uniform(0.5, 1.5, size=shape).astype(NP[dtype]) for _ in range(n)]
    return [rng.standard_normal(shape).astype(NP[dtype]) for _ in range(n)]


def on_gpus(arrays, gpus):
    return [tensor.from_numpy(a, d) for a, d in zip(arrays, gpus)]


def tolerance(dtype, n):
    return {"float16": 2e-3 * n, "float32": 1e-6 * n, "float64": 1e-12 * n, "int32": 0}[dtype]


# ---------------------------------------------------------------- results
@pytest.mark.parametrize("dtype", list(NP))
@pytest.mark.parametrize("shape", [(1,), (7, 3), (1 << 20,)])
def test_nccl_route_matches_the_host_route(gpus, rng, dtype, shape):
    arrays = replica_values(rng, len(gpus), shape, dtype, "sum")
    via_nccl, via_host = on_gpus(arrays, gpus), on_gpus(arrays, gpus)
    assert multi_device.choose_backend(via_nccl) == "nccl"
    assert multi_device.all_reduce(via_nccl, backend="nccl") is via_nccl
    multi_device.all_reduce(via_host, backend="host")
    expected = tensor.to_numpy(via_host[0]).astype(np.float64)
    for t, d in zip(via_nccl, gpus):
        assert t.device == d and t.dtype == tensor.to_dtype(dtype)
        got = tensor.to_numpy(t).astype(np.float64)
        tol = tolerance(dtype, len(gpus)) * (1 + np.abs(expected))
        assert np.all(np.abs(got - expected) <= tol), f"seed {rng.seed_for_message}"


@pytest.mark.parametrize("dtype", list(NP))
@pytest.mark.parametrize("op", OPS)
def test_clique_all_reduce_ops(clique, gpus, rng, dtype, op):
    if op == "avg" and dtype == "int32":
        pytest.skip("avg of integers is refused (test_clique_argument_errors)")
    arrays = replica_values(rng, len(gpus), (5, 33), dtype, op)
    ts = on_gpus(arrays, gpus)
    clique.all_reduce([t.data for t in ts], op)
    stacked = np.stack([a.astype(np.float64) for a in arrays])
    expected = {"sum": stacked.sum(0), "avg": stacked.mean(0), "max": stacked.max(0), "min": stacked.min(0),
                "prod": stacked.prod(0)}[op]
    for t in ts:
        got = tensor.to_numpy(t).astype(np.float64)
        tol = tolerance(dtype, len(gpus)) * (1 + np.abs(expected))
        assert np.all(np.abs(got - expected) <= tol), f"op {op}, seed {rng.seed_for_message}"


def test_clique_broadcast_and_synchronize(clique, gpus, rng):
    arrays = [rng.standard_normal((4, 9)).astype(np.float32) for _ in gpus]
    ts = on_gpus(arrays, gpus)
    root = len(gpus) - 1
    clique.broadcast([t.data for t in ts], root)
    clique.synchronize(60.0)
    for t in ts:
        np.testing.assert_array_equal(tensor.to_numpy(t), arrays[root])


def test_result_is_ordered_before_later_work_on_the_stream(gpus, rng):
    # no host wait in between: the kernel that doubles the tensor is queued on the same compute stream
    arrays = replica_values(rng, len(gpus), (1 << 18,), "float32", "sum")
    ts = on_gpus(arrays, gpus)
    multi_device.all_reduce(ts, backend="nccl")
    doubled = [t * 2.0 for t in ts]
    expected = 2 * np.sum(np.stack(arrays).astype(np.float64), 0)
    for t in doubled:
        np.testing.assert_allclose(tensor.to_numpy(t), expected, rtol=1e-5, atol=1e-5 * len(gpus))


def test_empty_tensors_are_nothing_to_do(clique, gpus):
    ts = [tensor.from_numpy(np.zeros((0, 3), np.float32), d) for d in gpus]
    clique.all_reduce([t.data for t in ts], "sum")
    assert all(t.shape == (0, 3) for t in ts)


# ---------------------------------------------------------------- errors
def test_clique_creation_errors(gpus):
    with pytest.raises(ValueError, match=r"cuda:0 is listed more than once; NCCL cannot put two ranks"):
        _core.NcclClique([0, 0])
    with pytest.raises(ValueError, match="no devices given"):
        _core.NcclClique([])
    with pytest.raises(ValueError, match=rf"cuda:{len(gpus)} does not exist"):
        _core.NcclClique([len(gpus)])
    with pytest.raises(ValueError, match="timeout must be a positive"):
        _core.NcclClique([0], 0.0)


def test_clique_argument_errors_leave_it_usable(clique, gpus):
    n = len(gpus)
    good = [tensor.from_numpy(np.ones(4, np.float32), d).data for d in gpus]
    with pytest.raises(ValueError, match=rf"takes one tensor per device in that order, got {n + 1} tensor"):
        clique.all_reduce(good + [good[0]], "sum")
    with pytest.raises(ValueError, match=r"tensor 0 must be on cuda:0 .* got cpu"):
        clique.all_reduce([tensor.from_numpy(np.ones(4, np.float32)).data] + good[1:], "sum")
    wide = tensor.from_numpy(np.ones((3, 4), np.float32), gpus[0]).data.slice(1, 0, 2)
    with pytest.raises(ValueError, match="must be contiguous"):
        clique.all_reduce([wide] + good[1:], "sum")
    flags = tensor.from_numpy(np.ones(4, bool), gpus[0]).data
    with pytest.raises(TypeError, match="float16, float32, float64, int32 and int64"):
        clique.all_reduce([flags] + good[1:], "sum")
    with pytest.raises(ValueError, match="op must be one of"):
        clique.all_reduce(good, "mean")
    ints = [tensor.from_numpy(np.ones(4, np.int32), d).data for d in gpus]
    with pytest.raises(TypeError, match="op='avg' needs a floating dtype"):
        clique.all_reduce(ints, "avg")
    with pytest.raises(ValueError, match=r"root must be a position"):
        clique.broadcast(good, n)
    if n >= 2:
        with pytest.raises(ValueError, match="must be on cuda:0"):
            clique.all_reduce(good[::-1], "sum")
        with pytest.raises(TypeError, match="tensor 0's dtype float32"):
            clique.all_reduce([good[0]] + ints[1:], "sum")
        longer = [tensor.from_numpy(np.ones(5, np.float32), d).data for d in gpus]
        with pytest.raises(ValueError, match=r"tensor 0's shape"):
            clique.all_reduce([good[0]] + longer[1:], "sum")
    clique.all_reduce(good, "sum")  # none of the above touched NCCL
    for t in good:
        np.testing.assert_array_equal(np.array(tensor.Tensor(data=t)), np.full(4, n, np.float32))
    assert clique.error == ""


def test_abort_then_close(gpus):
    c = _core.NcclClique([d.index for d in gpus], 60.0)
    assert c.size == len(gpus) and c.devices == [d.index for d in gpus] and "NcclClique(devices=[cuda:0" in repr(c)
    c.abort("test reason")
    assert "aborted: test reason" in c.error
    ts = [tensor.from_numpy(np.ones(2, np.float32), d).data for d in gpus]
    with pytest.raises(CommError, match="aborted: test reason"):
        c.all_reduce(ts, "sum")
    c.close()
    c.close()  # idempotent
    assert c.closed


def test_use_after_close(gpus):
    c = _core.NcclClique([d.index for d in gpus], 60.0)
    c.close()
    with pytest.raises(CommError, match=r"used after close\(\)"):
        c.all_reduce([tensor.from_numpy(np.ones(2, np.float32), d).data for d in gpus], "sum")


def test_forced_nccl_with_a_duplicated_device_is_a_value_error(gpus):
    ts = [tensor.from_numpy(np.ones(3, np.float32), gpus[0]) for _ in range(2)]
    assert multi_device.choose_backend(ts) == "host"  # auto falls back: two replicas share the GPU
    with pytest.raises(ValueError, match=r"distinct CUDA device .*tensors 0 and 1 are both on cuda:0"):
        multi_device.all_reduce(ts, backend="nccl")
    multi_device.all_reduce(ts, backend="auto")
    for t in ts:
        np.testing.assert_array_equal(tensor.to_numpy(t), [2, 2, 2])


def test_cliques_are_cached_per_device_tuple_and_replaced_after_failure(gpus):
    devices = tuple(d.index for d in gpus)
    ts = [tensor.from_numpy(np.ones(2, np.float32), d) for d in gpus]
    multi_device.all_reduce(ts, backend="nccl")
    first = multi_device._cliques[devices]
    multi_device.all_reduce(ts, backend="nccl")
    assert multi_device._cliques[devices] is first
    first.abort("made to fail by the test")
    multi_device.all_reduce(ts, backend="nccl")  # a fresh clique
    assert multi_device._cliques[devices] is not first
    np.testing.assert_array_equal(tensor.to_numpy(ts[0]), np.full(2, len(gpus) ** 3, np.float32))
    multi_device.close_cliques()
    assert not multi_device._cliques


def test_example_reports_the_nccl_route(gpus):
    pytest.importorskip("sklearn", reason="the offline digits come with scikit-learn")
    n = len(gpus)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "multi_device.py"), "--device", "cuda",
                           "--replicas", str(n), "--epochs", "1", "--allreduce", "nccl"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "gradients summed by all_reduce over nccl" in out, out
    assert re.search(r"replicas identical: yes", out), out
