"""What of the nccl backend runs without a GPU: the clear errors when CUDA, a GPU or NCCL is missing, the
NcclIdHolder without NCCL, the MPI bootstrap's readiness check, and the Python layer (queueing, staging of
CPU tensors, Work.wait ordering, DistOpt on top) driven by a stand-in for _core.NcclComm. The real thing on
a GPU is tests/gpu/test_nccl.py."""
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from singa_lite import _core, dist, opt, singa_wrap, tensor
from singa_lite.comm import mpi as comm_mpi, nccl

from distopt_cases import make_opt, make_params, reference, train  # noqa: E402  (tests/multiproc is on sys.path)


# ---------------------------------------------------------------- without what NCCL needs
def test_holder_is_created_and_pickles_without_nccl():
    h = dist.NcclIdHolder()
    if h.nccl_id is None:
        assert isinstance(h.nccl_error, str) and h.nccl_error  # says what was missing
    else:  # a machine that has NCCL and a GPU
        assert isinstance(h.nccl_id, bytes) and len(h.nccl_id) == 128 and h.nccl_error is None
    h2 = pickle.loads(pickle.dumps(h))
    assert (h2.shm_name, h2.nccl_id, h2.nccl_error) == (h.shm_name, h.nccl_id, h.nccl_error)
    old = pickle.loads(pickle.dumps(h))  # a pickle from before nccl_error existed still loads
    state = h.__getstate__()
    del state["nccl_error"]
    old.__setstate__(state)
    assert old.nccl_error is None


def test_init_without_what_nccl_needs_says_what_is_missing():
    problem = nccl.readiness()
    if not problem:
        pytest.skip("this machine can run the nccl backend (tests/gpu/test_nccl.py covers it)")
    if not nccl.compiled():
        assert "needs a CUDA build with NCCL" in problem
    elif _core.cuda_device_count() == 0:
        assert "needs a GPU" in problem
    else:
        assert "pip install nvidia-nccl-cu1" in problem and "libnccl.so.2" in problem
    with pytest.raises(dist.CommError) as e:
        dist.init(backend="nccl")
    assert str(e.value) == problem
    with pytest.raises(dist.CommError) as e:
        dist.init(backend="nccl", holder=dist.NcclIdHolder(), rank=0, world_size=1)
    assert str(e.value) == problem
    with pytest.raises((dist.CommError, _core.CudaError)):
        nccl.unique_id()
    assert singa_wrap.USE_NCCL is False or nccl.compiled()


def test_loader_error_names_the_wheel_to_install():
    if not nccl.compiled():
        pytest.skip("a CPU-only build has no NCCL loader")
    if nccl.available():
        pytest.skip("NCCL loads on this machine")
    reason = _core.nccl_unavailable_reason()
    assert "pip install nvidia-nccl-cu1" in reason and "libnccl.so.2" in reason
    with pytest.raises(dist.CommError, match="needs the NCCL library"):
        nccl.version()


def test_bootstrap_argument_errors(monkeypatch):
    for var in comm_mpi.MPI_LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="needs the parent's NcclIdHolder"):
        dist.init(backend="nccl", rank=1, world_size=2)
    with pytest.raises(ValueError, match="needs rank= and world_size= with the holder"):
        dist.init(backend="nccl", holder=dist.NcclIdHolder())
    with pytest.raises(TypeError, match="holder must be a NcclIdHolder"):
        dist.init(backend="nccl", holder="abc", rank=0, world_size=1)
    # a holder made where NCCL was missing carries the reason to the ranks
    monkeypatch.setattr(nccl, "_require_ready", lambda: None)
    h = dist.NcclIdHolder()
    h.nccl_id, h.nccl_error = None, "NCCL could not be loaded (for this test)"
    with pytest.raises(dist.CommError, match=r"carries no NCCL id; .*could not be loaded \(for this test\)"):
        dist.init(backend="nccl", holder=h, rank=0, world_size=1)


def test_usable_flag_is_a_bool():
    assert singa_wrap.USE_NCCL in (True, False) and singa_wrap.USE_NCCL == nccl.available()


def test_mpi_bootstrap_fails_on_every_rank_naming_the_ranks_that_cannot_use_nccl():
    pytest.importorskip("mpi4py")
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        pytest.skip("no mpiexec next to this Python: pip install 'singa_lite[mpi]'")
    code = ("from singa_lite import dist\n"
            "try:\n"
            "    c = dist.init(backend='nccl', timeout=30)\n"
            "    print('CREATED', flush=True)\n"
            "    c.close()\n"
            "except dist.CommError as e:\n"
            "    print('FAILED', e, flush=True)\n")
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    if out.count("CREATED") == 2:
        pytest.skip("this host can run two NCCL ranks")
    assert out.count("FAILED") == 2, out  # nobody waits for a rank that cannot join (ranks' lines may interleave)
    for r in (0, 1):
        assert f"nccl init (rank {r} of 2): rank(s) " in out and "cannot use NCCL" in out, out


# ---------------------------------------------------------------- the Python layer, on a stand-in
class FakeWork:
    def __init__(self, log, what):
        self.what, self.ordered, self.synced = what, False, False
        log.append(self)

    def completed(self):
        return True

    def order(self):
        self.ordered = True

    def synchronize(self, timeout, abort_on_timeout):
        assert timeout > 0 and abort_on_timeout in (True, False)
        self.synced = True


class FakeComm:
    """Stands in for _core.NcclComm: world_size replicas that hold the same data, so every collective's result
    is known in closed form (sum = P * x, prod = x ** P, avg / max / min = x, gathers = P copies)."""

    def __init__(self, unique_id, rank, world_size, device, timeout):
        assert isinstance(unique_id, bytes) and len(unique_id) == 128
        self.rank, self.world_size, self.device, self.timeout = rank, world_size, device, timeout
        self.log, self.closed, self.error = [], False, ""

    def _work(self, what):
        if self.error:
            raise dist.CommError(self.error)
        if self.closed:
            raise dist.CommError("used after close()")
        return FakeWork(self.log, what)

    def _reduced(self, a, op):
        P = self.world_size
        return a * P if op == "sum" else a ** P if op == "prod" else a

    def all_reduce(self, t, op):
        a = np.asarray(t)
        a[...] = self._reduced(a.copy(), op)
        return self._work("all_reduce")

    def broadcast(self, t, root):
        return self._work("broadcast")

    def reduce(self, t, root, op):
        if self.rank == root:
            a = np.asarray(t)
            a[...] = self._reduced(a.copy(), op)
        return self._work("reduce")

    def all_gather(self, out, t):
        np.asarray(out).reshape(self.world_size, -1)[...] = np.asarray(t).reshape(1, -1)
        return self._work("all_gather")

    def reduce_scatter(self, out, t, op):
        m = out.numel
        block = np.asarray(t).reshape(-1)[self.rank * m:(self.rank + 1) * m]
        np.asarray(out).reshape(-1)[...] = self._reduced(block.copy(), op)
        return self._work("reduce_scatter")

    def gather(self, out, t, root):
        if out is not None:
            np.asarray(out).reshape(self.world_size, -1)[...] = np.asarray(t).reshape(1, -1)
        return self._work("gather")

    def scatter(self, out, t, root):
        m = out.numel
        np.asarray(out).reshape(-1)[...] = np.asarray(t).reshape(-1)[self.rank * m:(self.rank + 1) * m]
        return self._work("scatter")

    def send(self, t, dst):
        return self._work("send")

    def recv(self, t, src):
        return self._work("recv")

    def abort(self, reason):
        self.error = f"aborted: {reason}"

    def close(self):
        self.closed = True


class FakeGpu:
    """The device the stand-in communicator claims; its tensors are CPU tensors."""
    core = _core.Device("cpu")
    index = 0

    def __str__(self):
        return "cuda:0 (stand-in)"


class DirectNccl(nccl.NcclCommunicator):
    """Treats CPU tensors as if they were on the communicator's GPU (no staging): the GPU path's logic."""

    def _staged(self, *tensors, written):
        import contextlib

        return contextlib.nullcontext(list(tensors))


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(nccl._core, "NcclComm", FakeComm, raising=False)
    monkeypatch.setattr(nccl, "_require_ready", lambda: None)
    monkeypatch.setattr(nccl, "choose_device", lambda device, local_rank, local_size: FakeGpu())

    def make(world_size=1, cls=nccl.NcclCommunicator):
        return cls(b"\x00" * 128, 0, world_size, timeout=30)
    return make


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("cls", [nccl.NcclCommunicator, DirectNccl], ids=["staged", "direct"])
def test_every_collective_through_the_python_layer(fake, world_size, cls):
    c = fake(world_size, cls)
    P = world_size
    assert c.backend == "nccl" and c.world_size == P and c.local_size == P
    x = np.arange(1, 7, dtype=np.float64).reshape(2, 3)
    for op, want in (("sum", x * P), ("avg", x), ("max", x), ("prod", x ** P)):
        t = tensor.from_numpy(x.copy())
        assert c.all_reduce(t, op) is t
        np.testing.assert_array_equal(tensor.to_numpy(t), want, err_msg=op)
    t = tensor.from_numpy(x.copy())
    c.reduce(t, root=0, op="sum")
    np.testing.assert_array_equal(tensor.to_numpy(t), x * P)
    np.testing.assert_array_equal(tensor.to_numpy(c.all_gather(tensor.from_numpy(x))), np.stack([x] * P))
    np.testing.assert_array_equal(tensor.to_numpy(c.gather(tensor.from_numpy(x), 0)), np.stack([x] * P))
    big = np.arange(P * 4, dtype=np.float32).reshape(P * 2, 2)
    np.testing.assert_array_equal(tensor.to_numpy(c.reduce_scatter(tensor.from_numpy(big), "sum")), big[:2] * P)
    np.testing.assert_array_equal(tensor.to_numpy(c.scatter(tensor.from_numpy(big), 0)), big[:2])
    col = tensor.from_numpy(x.copy())[:, 1:]  # non-contiguous: through a contiguous copy, written back
    c.all_reduce(col, "sum")
    np.testing.assert_array_equal(tensor.to_numpy(col), x[:, 1:] * P)
    c.barrier() if cls is DirectNccl else None  # the real barrier allocates on the GPU
    assert c.broadcast_object({"a": [1, 2], "b": b"\x01"}) == {"a": [1, 2], "b": b"\x01"}
    assert c.all_gather_object("x") == ["x"] * P
    assert all(w.ordered for w in c._comm.log), [w.what for w in c._comm.log if not w.ordered]
    c.close()


def test_async_work_is_ordered_only_by_wait(fake):
    c = fake(2, DirectNccl)
    t = tensor.from_numpy(np.ones(4, np.float32))
    work = c.all_reduce(t, "sum", async_op=True)
    (w,) = c._comm.log
    assert not w.ordered and work.is_completed()  # queued; the compute stream is not ordered yet
    assert work.wait() is t and w.ordered and not w.synced  # wait() orders without blocking the host
    work2 = c.all_reduce(t, "sum", async_op=True)
    assert work2.wait(timeout=5) is t and c._comm.log[-1].synced  # an explicit timeout blocks the host too
    work2.synchronize()
    np.testing.assert_array_equal(tensor.to_numpy(t), np.full(4, 4.0))


def test_cpu_tensors_finish_on_the_host_even_when_asynchronous(fake):
    c = fake(2)  # staged: CPU tensors go to the device and back
    t = tensor.from_numpy(np.ones(3, np.int64))
    work = c.all_reduce(t, "sum", async_op=True)
    np.testing.assert_array_equal(tensor.to_numpy(t), [2, 2, 2])  # already back on the host
    assert all(w.synced and w.ordered for w in c._comm.log)
    assert work.wait() is t


def test_errors_break_the_communicator_and_close_is_idempotent(fake):
    c = fake(1)
    c.abort("by the test")
    with pytest.raises(dist.CommError, match="aborted: by the test"):
        c.all_reduce(tensor.from_numpy(np.ones(2, np.float32)))
    with pytest.raises(dist.CommError, match="aborted: by the test"):  # and every later call
        c.broadcast(tensor.from_numpy(np.ones(2, np.float32)))
    c.close()
    assert c._comm.closed  # a failed communicator is still released (its watchdog stopped)
    c2 = fake(1)
    c2.close()
    with pytest.raises(dist.CommError, match="used after close"):
        c2.all_reduce(tensor.from_numpy(np.ones(2, np.float32)))


def test_an_expired_explicit_wait_leaves_the_communicator_usable(fake):
    # wait(timeout=T) that runs out ends only that wait (the C++ side aborts nothing and says the communicator
    # stays usable); it once stored that error as the communicator's failure, so every later call raised it.
    c = fake(2, DirectNccl)
    t = tensor.from_numpy(np.ones(4, np.float32))
    work = c.all_reduce(t, "sum", async_op=True)

    def expires(timeout, abort_on_timeout):
        assert not abort_on_timeout
        raise dist.CommError("all_reduce: not finished after waiting 0.01 s; the communicator is still usable")
    c._comm.log[-1].synchronize = expires
    with pytest.raises(dist.CommError, match="still usable"):
        work.wait(timeout=0.01)
    assert c._broken is None
    c.all_reduce(t, "sum")  # works
    np.testing.assert_array_equal(tensor.to_numpy(t), np.full(4, 4.0))
    # a failure of the NCCL communicator itself still breaks it for good
    work = c.all_reduce(t, "sum", async_op=True)

    def failed(timeout, abort_on_timeout):
        c._comm.error = "all_reduce: NCCL error: remote process exited"
        raise dist.CommError(c._comm.error)
    c._comm.log[-1].synchronize = failed
    with pytest.raises(dist.CommError, match="remote process exited"):
        work.wait(timeout=5)
    with pytest.raises(dist.CommError, match="remote process exited"):
        c.all_reduce(t, "sum")
    c.close()


def test_open_communicators_are_closed_at_exit(fake):
    c = fake(1)
    assert c in nccl._open
    nccl._close_all()  # what atexit runs before interpreter teardown
    assert c._comm.closed and c not in nccl._open


def test_dtype_and_op_errors_come_before_anything_is_queued(fake):
    c = fake(1, nccl.NcclCommunicator)
    with pytest.raises(TypeError, match="cast with as_type"):
        c.all_reduce(tensor.from_numpy(np.ones(2, np.bool_)))
    with pytest.raises(TypeError, match="needs a floating dtype"):
        c.all_reduce(tensor.from_numpy(np.ones(2, np.int32)), "avg")
    assert c._comm.log == []


@pytest.mark.parametrize("threshold", [2097152, 100], ids=["one-bucket", "small-buckets"])
@pytest.mark.parametrize("cls", [nccl.NcclCommunicator, DirectNccl], ids=["staged", "direct"])
def test_distopt_needs_no_change(fake, threshold, cls):
    # Two replicas holding the same data: their average is each one's own gradient, so DistOpt (first-step
    # broadcast, fused asynchronous buckets, finiteness check) must give exactly the plain optimizer's step.
    c = fake(2, cls)
    dopt = opt.DistOpt(make_opt("sgd"), communicator=c)
    got = train(make_params(0), dopt, 5, threshold=threshold)
    want = reference("sgd", 5)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6, err_msg=k)
    assert all(w.ordered for w in c._comm.log)
