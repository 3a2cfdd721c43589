"""Collective checks shared by every backend's tests: each function takes a Communicator and raises
AssertionError on a wrong result. Values depend on the rank and the position (so an offset, ordering or
wrong-rank bug cannot pass) and are small integers, exact in every dtype, so the expected results are
closed forms computed in numpy.

Used by tests/multiproc/jobs/mpi_job.py (under mpiexec) and tests/multiproc/test_dist_shm.py (multiprocessing workers).
"""
from __future__ import annotations

import numpy as np

from singa_lite import _core, tensor

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64]
SIZES = [0, 1, 7, 4099]
BIG = 4 * 1024 * 1024 + 3  # float32 elements: 16 MiB, beyond any staging buffer


def vals(rank: int, n: int, dtype, op: str = "sum") -> np.ndarray:
    i = np.arange(n)
    if op == "prod":
        v = 1 + (i + rank) % 2  # products of 1s and 2s stay small
    else:
        v = (i * 7 + rank * 5) % 97 - 13 * (rank % 2)  # signed, rank- and position-dependent, |v| < 110
    return v.astype(dtype)


def expected(P: int, n: int, dtype, op: str) -> np.ndarray:
    stack = np.stack([vals(r, n, np.float64, op) for r in range(P)]) if P else None
    result = {"sum": stack.sum(0), "avg": stack.sum(0) / P, "max": stack.max(0), "min": stack.min(0),
              "prod": stack.prod(0)}[op]
    return result.astype(dtype)


def T(a: np.ndarray):
    return tensor.from_numpy(np.ascontiguousarray(a))


def npy(t) -> np.ndarray:
    return tensor.to_numpy(t) if isinstance(t, tensor.Tensor) else np.asarray(t)


def same_on_all_ranks(comm, result: np.ndarray, what: str) -> None:
    rows = npy(comm.all_gather(T(result)))
    for r in range(comm.world_size):
        assert rows[r].tobytes() == result.tobytes(), f"{what}: rank {r} got different bits from rank {comm.rank}"


def check_all_reduce(comm, sizes=SIZES):
    P, r = comm.world_size, comm.rank
    for dt in DTYPES:
        for op in ("sum", "avg", "max", "min", "prod"):
            if op == "avg" and np.dtype(dt).kind == "i":
                continue
            for n in sizes:
                t = T(vals(r, n, dt, op))
                assert comm.all_reduce(t, op) is t
                got, want = npy(t), expected(P, n, dt, op)
                if op == "avg" and dt == np.float16:
                    np.testing.assert_allclose(got.astype(float), want.astype(float), rtol=1e-3, atol=1e-3)
                else:
                    np.testing.assert_array_equal(got, want, err_msg=f"all_reduce {op} {np.dtype(dt)} n={n}")
            same_on_all_ranks(comm, got, f"all_reduce {op} {np.dtype(dt)}")


def check_float16_avg_does_not_overflow(comm):
    # 40000 on every rank: the sum overflows float16 (max 65504) from two ranks on, the mean does not.
    t = T(np.full(33, 40000, np.float16))
    comm.all_reduce(t, "avg")
    np.testing.assert_array_equal(npy(t), np.full(33, 40000, np.float16))


def check_broadcast_and_reduce(comm, sizes=SIZES):
    P, r = comm.world_size, comm.rank
    for dt in DTYPES:
        for n in sizes:
            for root in range(P):
                t = T(vals(r, n, dt))
                comm.broadcast(t, root)
                np.testing.assert_array_equal(npy(t), vals(root, n, dt), err_msg=f"broadcast root {root}")
                t = T(vals(r, n, dt))
                comm.reduce(t, root, "sum")
                want = expected(P, n, dt, "sum") if r == root else vals(r, n, dt)
                np.testing.assert_array_equal(npy(t), want, err_msg=f"reduce root {root} {np.dtype(dt)} n={n}")


def check_gathers_and_scatters(comm, sizes=SIZES):
    P, r = comm.world_size, comm.rank
    for dt in DTYPES:
        for n in sizes:
            g = comm.all_gather(T(vals(r, n, dt)))
            np.testing.assert_array_equal(npy(g), np.stack([vals(q, n, dt) for q in range(P)]).reshape(P, n))
            full = np.stack([vals(q + 10 * r, n, dt) for q in range(P)]).reshape(P * n)
            rs = comm.reduce_scatter(T(full), "sum")
            want = sum(np.stack([vals(q + 10 * k, n, np.float64) for q in range(P)])[r] for k in range(P))
            np.testing.assert_array_equal(npy(rs), np.asarray(want).astype(dt).reshape(n),
                                          err_msg=f"reduce_scatter {np.dtype(dt)} n={n}")
            root = n % P
            got = comm.gather(T(vals(r, n, dt)), root)
            if r == root:
                np.testing.assert_array_equal(npy(got), np.stack([vals(q, n, dt) for q in range(P)]).reshape(P, n))
            else:
                assert got is None
            sc = comm.scatter(T(np.stack([vals(q + 100 * r, n, dt) for q in range(P)]).reshape(P * n)), root)
            np.testing.assert_array_equal(npy(sc), vals(r + 100 * root, n, dt), err_msg=f"scatter root {root}")


def check_send_recv(comm, sizes=SIZES + [300_001]):
    P, r = comm.world_size, comm.rank
    if P == 1:
        return
    for n in sizes:
        for dt in (np.float32, np.int64, np.float16):
            dst, src = (r + 1) % P, (r - 1) % P
            out = T(np.zeros(n, dt))
            if r % 2 == 0:  # even ranks send first: no cycle of blocked senders whatever the transport
                comm.send(T(vals(r, n, dt)), dst, tag=n % 5)
                comm.recv(out, src, tag=n % 5)
            else:
                comm.recv(out, src, tag=n % 5)
                comm.send(T(vals(r, n, dt)), dst, tag=n % 5)
            np.testing.assert_array_equal(npy(out), vals(src, n, dt))


def check_views_raw_tensors_async_objects(comm):
    P, r = comm.world_size, comm.rank
    # a strided view is reduced in place, its base's other elements untouched
    base = np.full((6, 5), -1.0, np.float32)
    base[::2, 1] = vals(r, 3, np.float32)
    tb = T(base)
    view = tb.data.slice(0, 0, 6, 2).slice(1, 1, 2, 1)
    comm.all_reduce(view)
    got = npy(tb)
    np.testing.assert_array_equal(got[::2, 1], expected(P, 3, np.float32, "sum"))
    assert (np.delete(got.reshape(-1), np.arange(6 * 5).reshape(6, 5)[::2, 1].reshape(-1)) == -1).all()
    # raw C++ tensors (t.data, as SINGA scripts pass them) go in and come out raw
    raw = _core.Tensor.from_buffer(vals(r, 5, np.float64))
    assert isinstance(comm.all_gather(raw), _core.Tensor)
    # asynchronous: several in flight, completed in order
    ts = [T(vals(r + k, 1000, np.float32)) for k in range(4)]
    works = [comm.all_reduce(t, async_op=True) for t in ts]
    for k, (t, w) in enumerate(zip(ts, works)):
        assert w.wait(60) is t
        np.testing.assert_array_equal(npy(t), sum(vals(q + k, 1000, np.float64) for q in range(P)).astype(np.float32))
    comm.barrier()
    # metadata
    assert comm.broadcast_object({"step": 3, "name": f"rank{r}", "blob": b"\x00\xff"} if r == 0 else None) == \
        {"step": 3, "name": "rank0", "blob": b"\x00\xff"}
    assert comm.all_gather_object([r, "x" * r]) == [[q, "x" * q] for q in range(P)]


def check_local_errors(comm):
    import pytest

    P = comm.world_size
    f32 = T(np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="bool"):
        comm.all_reduce(tensor.from_numpy(np.zeros(3, bool)))
    with pytest.raises(ValueError, match="op must be one of"):
        comm.all_reduce(f32, "mean")
    with pytest.raises(TypeError, match="floating dtype"):
        comm.all_reduce(T(np.zeros(3, np.int32)), "avg")
    with pytest.raises(ValueError, match="root must be a rank"):
        comm.broadcast(f32, P)
    if P > 1:
        with pytest.raises(ValueError, match="multiple of world_size"):
            comm.reduce_scatter(T(np.zeros(P * 2 + 1, np.float32)))
    with pytest.raises(TypeError, match="tensor.Tensor or a raw tensor"):
        comm.all_reduce(np.zeros(3))
    with pytest.raises(ValueError, match="this rank itself"):
        comm.send(f32, comm.rank)
    with pytest.raises(TypeError, match="JSON"):
        comm.all_gather_object(object())  # every rank fails the same way, before anything is sent
    with pytest.raises(ValueError, match="timeout"):
        comm.timeout = 0


def check_all(comm, big: bool = True):
    check_local_errors(comm)
    check_all_reduce(comm)
    check_float16_avg_does_not_overflow(comm)
    check_broadcast_and_reduce(comm)
    check_gathers_and_scatters(comm)
    check_send_recv(comm)
    check_views_raw_tensors_async_objects(comm)
    if big:  # one large all-reduce: many staging chunks
        t = T(vals(comm.rank, BIG, np.float32))
        comm.all_reduce(t)
        np.testing.assert_array_equal(npy(t), expected(comm.world_size, BIG, np.float32, "sum"))
    comm.barrier()


# ---------------------------------------------------------------- multiprocessing groups (shm backend tests)
def run_ranks(fn, world_size: int, method: str = "spawn", timeout: float = 60.0, comm_timeout: float = 30.0,
              args=()):
    """Runs fn(comm, *args) on `world_size` processes that share one NcclIdHolder, as a SINGA script does.
    Returns ({rank: ("ok", value) | ("error", type name, message)}, holder, seconds). A rank that dies without
    reporting is missing from the results; processes that do not report within `timeout` are killed: the test
    fails instead of hanging (ranks.run_group)."""
    from ranks import run_group
    from singa_lite import dist

    holder = dist.NcclIdHolder()
    group = run_group(_rank_main, range(world_size), (fn, holder, world_size, comm_timeout, args), ctx=method,
                      timeout=timeout, strict=False, exit_grace=None, reraise=True)
    out = {r: ("ok", value) if kind == "ok" else ("error", *value) for r, (kind, value) in group.results.items()}
    return out, holder, group.seconds


def _rank_main(rank, fn, holder, world_size, comm_timeout, args):
    from singa_lite import dist

    comm = dist.init(backend="shm", holder=holder, rank=rank, world_size=world_size, timeout=comm_timeout)
    return fn(comm, *args)


def scenario_collectives(comm):
    check_all(comm, big=comm.world_size <= 2)
    return comm.rank


def scenario_timeout(comm, late_rank):
    import time

    if comm.rank == late_rank:
        time.sleep(comm.timeout * 4)
        return "slept"
    comm.all_reduce(T(np.ones(8, np.float32)))


def scenario_killed(comm, dead_rank):
    import os
    import signal

    comm.barrier()
    if comm.rank == dead_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    comm.all_reduce(T(np.ones(8, np.float32)))


def scenario_user_error(comm, bad_rank):
    comm.barrier()
    if comm.rank == bad_rank:
        raise RuntimeError("bug in user code")
    comm.all_reduce(T(np.ones(8, np.float32)))


def scenario_abort(comm):
    comm.barrier()
    if comm.rank == 1:
        comm.abort("boom from rank 1")
        return "aborted"
    comm.all_reduce(T(np.ones(8, np.float32)))


def scenario_mismatch(comm):
    t = T(np.zeros(10 + (comm.rank == 1), np.float32))
    try:
        comm.all_reduce(t)
    except (ValueError, comm_error()) as e:
        return str(e)
    raise AssertionError("mismatched sizes were not detected")


def comm_error():
    from singa_lite import dist
    return dist.CommError


def scenario_distopt(comm):
    import distopt_cases
    return distopt_cases.run_all(comm)
