"""The dist front door without a second process: backend choice and its errors, NcclIdHolder pickling with
every multiprocessing start method, the object codec."""
import multiprocessing as mp
import pickle

import pytest

from singa_lite import dist, singa_wrap
from singa_lite import comm
from singa_lite.comm import communicator, nccl
from singa_lite.comm import mpi as comm_mpi


def test_holder_pickles_and_keeps_its_name():
    h = dist.NcclIdHolder()
    h2 = pickle.loads(pickle.dumps(h))
    assert h2.shm_name == h.shm_name and h2.nccl_id == h.nccl_id
    assert h.shm_name.startswith("/singa_lite_") and "/" not in h.shm_name[1:]
    assert dist.NcclIdHolder().shm_name != h.shm_name
    assert h2._owner_pid is None  # a copy never removes the parent's segment name
    assert singa_wrap.NcclIdHolder is dist.NcclIdHolder


def _report_name(holder, rank, out):
    out.put((rank, holder.shm_name))


def _name_of(holder):
    return holder.shm_name


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_holder_reaches_processes_and_pools_with_every_start_method(method):
    ctx = mp.get_context(method)
    h = dist.NcclIdHolder()
    q = ctx.Queue()
    procs = [ctx.Process(target=_report_name, args=(h, r, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = sorted(q.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert got == [(0, h.shm_name), (1, h.shm_name)]
    with ctx.Pool(2) as pool:
        assert pool.map(_name_of, [h, h]) == [h.shm_name, h.shm_name]


def test_backend_choice_errors(monkeypatch):
    with pytest.raises(ValueError, match="backend must be one of mpi, shm, nccl, tcp, got 'gloo'"):
        dist.init(backend="gloo")
    monkeypatch.setenv("SINGA_LITE_COMM_BACKEND", "ucc")
    with pytest.raises(ValueError, match="from SINGA_LITE_COMM_BACKEND"):
        dist.init()
    monkeypatch.delenv("SINGA_LITE_COMM_BACKEND")
    if nccl.readiness():  # where NCCL runs, tests/gpu/test_nccl.py covers backend="nccl"
        with pytest.raises(dist.CommError, match="the nccl backend needs"):
            dist.init(backend="nccl")
    with pytest.raises(ValueError, match="NcclIdHolder is for processes started by multiprocessing"):
        dist.init(backend="mpi", holder=dist.NcclIdHolder())
    with pytest.raises(ValueError, match="needs the parent's NcclIdHolder"):
        dist.init(backend="shm", rank=0, world_size=2)
    with pytest.raises(ValueError, match="needs rank= and world_size="):
        dist.init(backend="shm", holder=dist.NcclIdHolder())
    with pytest.raises(TypeError, match="holder must be a NcclIdHolder"):
        dist.init(backend="shm", holder="abc", rank=0, world_size=1)


def test_automatic_backend(monkeypatch):
    for var in comm_mpi.MPI_LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    assert comm._auto_backend(dist.NcclIdHolder()) == "shm"
    monkeypatch.setenv("PMI_RANK", "0")
    assert comm._auto_backend(None) == "mpi"


def test_timeout_setting(monkeypatch):
    monkeypatch.setenv("SINGA_LITE_COMM_TIMEOUT", "12.5")
    assert dist.default_timeout() == 12.5
    monkeypatch.setenv("SINGA_LITE_COMM_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="SINGA_LITE_COMM_TIMEOUT must be a positive number"):
        dist.default_timeout()
    monkeypatch.delenv("SINGA_LITE_COMM_TIMEOUT")
    assert dist.default_timeout() == dist.DEFAULT_TIMEOUT


def test_object_codec_is_json_with_bytes():
    obj = {"a": [1, 2.5, None, True], "b": b"\x00\xff", "c": {"d": "e"}}
    assert communicator.decode_object(communicator.encode_object(obj, "x")) == obj
    assert communicator.decode_object(communicator.encode_object((1, 2), "x")) == [1, 2]
    with pytest.raises(TypeError, match="cannot send set"):
        communicator.encode_object({1, 2}, "x")
