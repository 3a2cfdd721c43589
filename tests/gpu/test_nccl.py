"""The nccl backend on one GPU. NCCL cannot put two ranks on one GPU, so these run at world size 1 (the
multi-rank behaviour of the code every backend shares is proven on the CPU backends). Every bootstrap is
used: a holder in this process, a holder passed to a spawned process, no holder, and ``mpiexec -n 1``.
Data are fresh random values each run (the seed is in the failure message). Marked `gpu`: skipped without
a usable GPU; skipped too, with the reason, where NCCL cannot be loaded.

Run as a script (``python tests/gpu/test_nccl.py mpi-job``) it is the job of the mpiexec test."""
import multiprocessing as mp
import os
import subprocess
import sys

import numpy as np
import pytest

from singa_lite import _core, autograd, device, dist, opt, tensor
from singa_lite.comm import nccl

pytestmark = pytest.mark.gpu

FLOATS = (tensor.float16, tensor.float32, tensor.float64)
DTYPES = FLOATS + (tensor.int32, tensor.int64)
NP = {tensor.float16: np.float16, tensor.float32: np.float32, tensor.float64: np.float64, tensor.int32: np.int32,
      tensor.int64: np.int64}


def _ready_or_skip():
    problem = nccl.readiness()
    if problem:
        pytest.skip(problem)


@pytest.fixture(scope="module")
def gpu():
    return device.create_cuda_gpu_on(0)


@pytest.fixture(scope="module")
def comm(gpu):
    _ready_or_skip()
    c = dist.init(backend="nccl", holder=dist.NcclIdHolder(), rank=0, world_size=1, timeout=60)
    yield c
    c.close()


def random_array(rng, shape, dtype):
    if dtype in (tensor.int32, tensor.int64):
        return rng.integers(-1000, 1000, size=shape).astype(NP[dtype])
    return rng.standard_normal(shape).astype(NP[dtype])


def on_gpu(arr, gpu):
    return tensor.from_numpy(arr).to_device(gpu)


def host(t):
    return tensor.to_numpy(t if isinstance(t, tensor.Tensor) else tensor.from_raw_tensor(t))


# ---------------------------------------------------------------- every collective, world size 1
def test_communicator_basics(comm, gpu):
    assert comm.backend == "nccl" and comm.rank == 0 and comm.world_size == 1
    assert comm.local_rank == 0 and comm.local_size == 1 and comm.device is gpu
    assert nccl.version() >= 21400
    assert repr(comm).startswith("NcclCommunicator(rank=0, world_size=1") and "cuda:0" in repr(comm)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_every_collective_matches_numpy(comm, gpu, rng, dtype):
    msg = f"seed {rng.seed_for_message}"
    a = random_array(rng, (6, 5), dtype)
    ops = ("sum", "max", "min", "prod") + (("avg",) if dtype in FLOATS else ())
    for op in ops:
        t = on_gpu(a, gpu)
        assert comm.all_reduce(t, op) is t
        np.testing.assert_array_equal(host(t), a, err_msg=f"all_reduce {op} {msg}")  # one rank: op of one value
        t = on_gpu(a, gpu)
        comm.reduce(t, root=0, op=op)
        np.testing.assert_array_equal(host(t), a, err_msg=f"reduce {op} {msg}")
        rs = comm.reduce_scatter(on_gpu(a, gpu), op)  # a new tensor: a no-op would leave it uninitialised
        np.testing.assert_array_equal(host(rs), a, err_msg=f"reduce_scatter {op} {msg}")
    t = on_gpu(a, gpu)
    comm.broadcast(t, root=0)
    np.testing.assert_array_equal(host(t), a, err_msg=msg)
    # Out-of-place results are new tensors: a wrong NCCL dtype (element size) would leave part unwritten.
    g = comm.all_gather(on_gpu(a, gpu))
    assert g.shape == (1, 6, 5) and g.device is gpu
    np.testing.assert_array_equal(host(g)[0], a, err_msg=msg)
    g = comm.gather(on_gpu(a, gpu), root=0)
    np.testing.assert_array_equal(host(g)[0], a, err_msg=msg)
    s = comm.scatter(on_gpu(a, gpu), root=0)
    np.testing.assert_array_equal(host(s), a, err_msg=msg)
    comm.barrier()


def test_in_place_on_views_and_offsets(comm, gpu, rng):
    a = random_array(rng, (8, 6), tensor.float32)
    t = on_gpu(a, gpu)
    col = t[:, 1:4]  # a non-contiguous view: reduced through a contiguous copy, written back
    assert not col.is_contiguous()
    comm.all_reduce(col, "sum")
    np.testing.assert_array_equal(host(t), a)
    rows = t[2:5]  # contiguous, at an offset into the storage
    comm.broadcast(rows, 0)
    np.testing.assert_array_equal(host(t), a)
    raw = on_gpu(a, gpu).data  # SINGA scripts pass raw tensors
    assert comm.all_reduce(raw, "avg") is raw
    np.testing.assert_array_equal(host(raw), a)


def test_collective_sees_work_queued_before_it(comm, gpu, rng):
    # The GEMM is still running on the compute stream when all_gather is queued: the communication stream
    # must wait for it (an event), or the gathered copy holds stale memory.
    x = on_gpu(rng.standard_normal((2048, 2048)).astype(np.float32), gpu)
    for _ in range(3):
        y = tensor.matmul(x, x)
        g = comm.all_gather(y)
        np.testing.assert_array_equal(host(g)[0], host(y))


def test_async_work_and_wait(comm, gpu, rng):
    arrays = [random_array(rng, (1000 + i,), tensor.float32) for i in range(8)]
    ts = [on_gpu(a, gpu) for a in arrays]
    works = [comm.all_reduce(t, "sum", async_op=True) for t in ts]
    gathered = comm.all_gather(ts[0], async_op=True)
    for t, w, a in zip(ts, works, arrays):
        assert w.wait() is t  # ordered: the copy to the host below runs after the all-reduce
        np.testing.assert_array_equal(host(t), a)
    np.testing.assert_array_equal(host(gathered.wait())[0], arrays[0])
    w = comm.all_reduce(on_gpu(arrays[1], gpu), "max", async_op=True)
    w.wait(timeout=30)  # blocks the host until the GPU finished
    assert w.is_completed()
    w.synchronize()
    assert comm.broadcast(ts[2], 0, async_op=True).wait(timeout=30) is ts[2]


def test_dropped_work_keeps_its_tensors_until_the_compute_stream_waits(comm, gpu, rng):
    # Nobody waits: the tensors go back to the caching allocator only after the compute stream was ordered
    # behind the operation, so reusing their memory right away is safe.
    for _ in range(20):
        comm.all_reduce(on_gpu(random_array(rng, (1 << 16,), tensor.float32), gpu), "sum", async_op=True)
        a = random_array(rng, (1 << 16,), tensor.float32)
        t = on_gpu(a, gpu)
        np.testing.assert_array_equal(host(t), a)


def test_cpu_tensors_and_objects_are_staged_through_the_gpu(comm):
    a = np.arange(10, dtype=np.int32)
    t = tensor.from_numpy(a.copy())
    comm.all_reduce(t, "max")
    np.testing.assert_array_equal(tensor.to_numpy(t), a)
    assert comm.broadcast_object({"epoch": 3, "name": "x", "b": b"\x00\x01"}) == {"epoch": 3, "name": "x",
                                                                                 "b": b"\x00\x01"}
    assert comm.all_gather_object([1, "two"]) == [[1, "two"]]


def test_argument_errors(comm, gpu):
    t = tensor.Tensor((4,), gpu, tensor.bool_)
    with pytest.raises(TypeError, match="cast with as_type"):
        comm.all_reduce(t)
    with pytest.raises(TypeError, match="op='avg' needs a floating dtype"):
        comm.all_reduce(tensor.Tensor((4,), gpu, tensor.int32), "avg")
    with pytest.raises(ValueError, match="op must be one of"):
        comm.all_reduce(tensor.Tensor((4,), gpu), "mean")
    with pytest.raises(ValueError, match="root must be a rank"):
        comm.broadcast(tensor.Tensor((4,), gpu), root=1)
    with pytest.raises(ValueError, match="dst=0 is this rank itself"):
        comm.send(tensor.Tensor((4,), gpu), 0)
    if _core.cuda_device_count() > 1:
        with pytest.raises(ValueError, match="one communicator per process and GPU"):
            comm.all_reduce(tensor.Tensor((4,), device.create_cuda_gpu_on(1)))
    # the communicator is still usable after argument errors
    comm.all_reduce(tensor.Tensor((4,), gpu))


def test_timeout_setting_reaches_the_watchdog(comm):
    old = comm.timeout
    comm.timeout = 12.5
    assert comm._comm.timeout == 12.5
    comm.timeout = old


# ---------------------------------------------------------------- failures
LONELY_RANK = """
import time
from singa_lite import dist
start = time.monotonic()
try:
    dist.init(backend="nccl", holder=dist.NcclIdHolder(), rank=0, world_size=2, timeout=3)
except dist.CommError as e:
    print("RAISED after", round(time.monotonic() - start), "s:", e, flush=True)
"""


def test_init_that_nobody_joins_times_out_clearly(gpu):
    # Rank 1 never comes: the non-blocking init is polled until the timeout, then aborted (in a subprocess,
    # so that a hang would fail this test instead of the whole run).
    _ready_or_skip()
    proc = subprocess.run([sys.executable, "-c", LONELY_RANK], capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "RAISED after" in out and "did not all join within 3" in out, out


def test_abort_and_close_make_later_calls_fail(gpu):
    _ready_or_skip()
    c = dist.init(backend="nccl", holder=dist.NcclIdHolder(), rank=0, world_size=1, timeout=30)
    t = tensor.Tensor((4,), gpu)
    c.all_reduce(t)
    c.abort("test")
    with pytest.raises(dist.CommError, match="aborted: test"):
        c.all_reduce(t)
    c.close()
    c2 = dist.init(backend="nccl", rank=0, world_size=1, timeout=30)  # no holder: a one-process communicator
    c2.all_reduce(t)
    c2.close()
    with pytest.raises(dist.CommError, match="used after close"):
        c2.all_reduce(t)
    c2.close()  # idempotent


def test_automatic_choice_picks_nccl_for_a_gpu_default_device(gpu):
    _ready_or_skip()
    before = device.get_default_device()
    device.set_default_device(gpu)
    try:
        c = dist.init(holder=dist.NcclIdHolder(), rank=0, world_size=1, timeout=30)
        assert c.backend == "nccl" and c.device is gpu
        c.close()
    finally:
        device.set_default_device(before)


# ---------------------------------------------------------------- DistOpt: must need no change for NCCL
N, D, H, C = 24, 7, 40, 5


def _params(gpu):
    rng = np.random.default_rng(0)
    shapes = {"W1": (D, H), "b1": (H,), "W2": (H, C), "b2": (C,)}
    return {k: tensor.Tensor(data=(rng.standard_normal(s) * 0.3).astype(np.float32), device=gpu, requires_grad=True,
                             stores_grad=True, name=k) for k, s in shapes.items()}


def _train(params, step_fn, gpu, steps=5):
    autograd.training = True
    for step in range(steps):
        rng = np.random.default_rng(1000 + step)
        x = on_gpu(rng.standard_normal((N, D)).astype(np.float32), gpu)
        y = on_gpu(rng.integers(0, C, N).astype(np.int32), gpu)
        h = autograd.tanh(autograd.add_bias(autograd.matmul(x, params["W1"]), params["b1"]))
        loss = autograd.softmax_cross_entropy(autograd.add_bias(autograd.matmul(h, params["W2"]), params["b2"]), y)
        step_fn(loss)
    return {k: host(v) for k, v in params.items()}


@pytest.mark.parametrize("threshold", [2097152, 50], ids=["one-bucket", "small-buckets"])
def test_distopt_step_equals_the_plain_optimizer(comm, gpu, threshold):
    plain = opt.SGD(lr=0.1, momentum=0.9)
    want = _train(_params(gpu), plain, gpu)
    dopt = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm)
    got = _train(_params(gpu), lambda loss: dopt.backward_and_update(loss, threshold=threshold), gpu)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6, err_msg=k)


def test_distopt_with_a_holder_as_seed_scripts_write_it(gpu):
    _ready_or_skip()
    holder = dist.NcclIdHolder()
    dopt = opt.DistOpt(opt.SGD(lr=0.1), nccl_id=holder, gpu_num=0, gpu_per_node=1, backend="nccl")
    assert dopt.communicator.backend == "nccl" and dopt.local_rank == 0 and dopt.world_size == 1
    got = _train(_params(gpu), dopt.backward_and_update, gpu, steps=3)
    want = _train(_params(gpu), opt.SGD(lr=0.1), gpu, steps=3)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6, err_msg=k)
    dopt.communicator.close()


MODES = {
    "plain": lambda d: d.backward_and_update,
    "half": lambda d: lambda loss: d.backward_and_update_half(loss, threshold=50, clipping=True, clip_Value=5.0),
    "partial": lambda d: lambda loss: d.backward_and_partial_update(loss, threshold=100),
    "sparse_topk": lambda d: lambda loss: d.backward_and_sparse_update(loss, threshold=100, spars=0.2, topK=True),
    "sparse_threshold": lambda d: lambda loss: d.backward_and_sparse_update(loss, spars=0.01, topK=False),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_distopt_mode_on_the_gpu_equals_the_cpu(comm, gpu, mode):
    """Each DistOpt mode over NCCL on the GPU against the same mode over shared memory on the CPU (both at
    world size 1, so the same arithmetic): the same Python code on either device."""
    cpu = device.get_default_device()
    cpu_comm = dist.init(backend="shm", holder=dist.NcclIdHolder(), rank=0, world_size=1, timeout=60)
    try:
        runs = []
        for dev, c in ((cpu, cpu_comm), (gpu, comm)):
            dopt = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=c)
            runs.append(_train(_params(dev), MODES[mode](dopt), dev))
    finally:
        cpu_comm.close()
    tol = 2e-3 if mode == "half" else 1e-5
    for k in runs[0]:
        np.testing.assert_allclose(runs[1][k], runs[0][k], rtol=tol, atol=tol, err_msg=f"{k} ({mode})")


# ---------------------------------------------------------------- the other bootstraps, in other processes
def _spawned_rank(holder, out):
    try:
        from singa_lite import device as dev
        from singa_lite import dist as d
        from singa_lite import tensor as tn

        c = d.init(backend="nccl", holder=holder, rank=0, world_size=1, timeout=60)
        g = dev.create_cuda_gpu_on(0)
        t = tn.from_numpy(np.arange(5, dtype=np.float32)).to_device(g)
        c.all_reduce(t, "sum")
        out.put(("ok", tn.to_numpy(t).tolist(), c.device.index))
        c.close()
    except BaseException as e:  # reported to the test, which names it
        out.put(("error", repr(e), None))


def test_holder_bootstrap_in_a_spawned_process(gpu):
    _ready_or_skip()
    ctx = mp.get_context("spawn")  # this process has initialised CUDA: a forked child could not use it
    holder = dist.NcclIdHolder()
    q = ctx.Queue()
    p = ctx.Process(target=_spawned_rank, args=(holder, q))
    p.start()
    status, value, index = q.get(timeout=240)
    p.join(60)
    assert status == "ok", value
    assert value == [0.0, 1.0, 2.0, 3.0, 4.0] and index == 0 and p.exitcode == 0


FORKED_JOB = """
import multiprocessing as mp
import numpy as np
from singa_lite import device, dist, tensor

def rank(holder, q):
    c = dist.init(backend="nccl", holder=holder, rank=0, world_size=1, timeout=60)
    t = tensor.from_numpy(np.arange(4, dtype=np.float32)).to_device(device.create_cuda_gpu_on(0))
    c.all_reduce(t, "sum")
    q.put(tensor.to_numpy(t).tolist())
    c.close()

if __name__ == "__main__":
    holder = dist.NcclIdHolder()  # in the parent, before the workers start, as SINGA's scripts do
    assert holder.nccl_id is not None, holder.nccl_error
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=rank, args=(holder, q))
    p.start()
    print("GOT", q.get(timeout=120), flush=True)
    p.join(60)
"""


def test_holder_made_in_the_parent_leaves_forked_workers_able_to_use_the_gpu():
    # A parent that initialised CUDA could not fork workers that use it: creating the NCCL id must not.
    _ready_or_skip()
    proc = subprocess.run([sys.executable, "-c", FORKED_JOB], capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "GOT [0.0, 1.0, 2.0, 3.0]" in out, out


def _mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(here):
        pytest.skip("no mpiexec next to this Python: pip install 'singa_lite[mpi]'")
    return here


def test_mpi_bootstrap_under_mpiexec(gpu):
    _ready_or_skip()
    pytest.importorskip("mpi4py")
    proc = subprocess.run([_mpiexec(), "-n", "1", sys.executable, os.path.abspath(__file__), "mpi-job"],
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "OK rank 0 of 1" in out, out


def _mpi_job() -> None:
    c = dist.init(backend="nccl", timeout=60)  # under mpiexec: rank 0's unique id travels over MPI
    assert c.backend == "nccl" and c.world_size == 1 and c.local_size == 1
    g = c.device
    a = np.random.default_rng().standard_normal(1000).astype(np.float32)
    t = tensor.from_numpy(a).to_device(g)
    c.all_reduce(t, "avg")
    np.testing.assert_array_equal(tensor.to_numpy(t), a)
    np.testing.assert_array_equal(tensor.to_numpy(c.all_gather(t))[0], a)
    c.barrier()
    c.close()
    print(f"OK rank {c.rank} of {c.world_size}", flush=True)


if __name__ == "__main__" and sys.argv[1:] == ["mpi-job"]:
    _mpi_job()
