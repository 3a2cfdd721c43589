"""The tcp backend (singa_lite/comm/tcp.py): ranks started by multiprocessing on loopback, meeting through the
TCP store (store.py) with no MPI and no holder. The collective checks and DistOpt scenarios are the ones every
backend runs (helpers/dist_cases.py, helpers/distopt_cases.py); failures: a killed rank, a timeout, an abort
and mismatched calls are named on every surviving rank, promptly."""
from __future__ import annotations

import os
import socket
import threading
import time

import numpy as np
import pytest

from singa_lite import tensor
from singa_lite.comm.communicator import CommError
from singa_lite.comm.store import TcpStore
from singa_lite.comm.tcp import FUSE_BYTES, TcpCommunicator

from dist_cases import T, check_all, npy, scenario_abort, scenario_killed, scenario_timeout  # noqa: E402

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def run_tcp(fn, world_size, *, rank0_serves=False, method="fork", timeout=120.0, comm_timeout=30.0, args=()):
    """Runs fn(comm, *args) on world_size processes joined by a TcpCommunicator. The store is served by this
    process, or (rank0_serves) by rank 0 at a port chosen here, as init_method="env" does. Returns
    ({rank: ("ok", value) | ("error", type name, message)}, seconds)."""
    from ranks import run_group

    server = None
    if rank0_serves:
        port = free_port()
    else:
        server = TcpStore(HOST, 0, world_size, is_server=True, timeout=30)
        port = server.port
    try:
        group = run_group(_rank_main, range(world_size), (fn, port, world_size, comm_timeout, rank0_serves, args),
                          ctx=method, timeout=timeout, strict=False, exit_grace=None, reraise=False)
    finally:
        if server is not None:
            server.close()
    out = {r: ("ok", value) if kind == "ok" else ("error", *value) for r, (kind, value) in group.results.items()}
    return out, group.seconds


def _rank_main(rank, fn, port, world_size, comm_timeout, rank0_serves, args):
    store = TcpStore(HOST, port, world_size, is_server=rank0_serves and rank == 0, timeout=30)
    comm = TcpCommunicator(store, rank, world_size, rank, world_size, timeout=comm_timeout)
    result = fn(comm, *args)
    if comm._broken is None:
        comm.barrier()  # rank 0 serves the store: it stays until every rank is done with it
    comm.close()
    store.close()
    return result


# ----------------------------------------------------------------------------------------- scenarios
def bf16(a: np.ndarray):
    return tensor.from_numpy(np.ascontiguousarray(a, np.float32)).as_type(tensor.bfloat16)


def from_bf16(t) -> np.ndarray:
    return tensor.to_numpy(t.as_type(tensor.float32))


def check_bfloat16(comm):
    """bfloat16 through every collective, fused and ring sizes; values whose sums are exact in bfloat16."""
    P, r = comm.world_size, comm.rank
    for n in (5, FUSE_BYTES // 2 + 7, 3 * FUSE_BYTES):
        def vals(q, n=n):
            return ((np.arange(n) * 3 + q * 5) % 17 - 8).astype(np.float32)  # |v| <= 8: sums over 3 ranks exact
        rows = np.stack([vals(q) for q in range(P)])
        for op, want in (("sum", rows.sum(0)), ("max", rows.max(0)), ("min", rows.min(0)), ("avg", rows.mean(0))):
            t = bf16(vals(r))
            comm.all_reduce(t, op)
            tol = 1e-2 if op == "avg" else 0
            np.testing.assert_allclose(from_bf16(t), want, rtol=tol, atol=tol, err_msg=f"bf16 {op} n={n}")
        t = bf16((1 + (np.arange(n) + r) % 2).astype(np.float32))
        comm.all_reduce(t, "prod")
        np.testing.assert_array_equal(from_bf16(t), np.prod([1 + (np.arange(n) + q) % 2 for q in range(P)], 0))
        t = bf16(vals(r))
        comm.reduce(t, P - 1, "sum")
        np.testing.assert_array_equal(from_bf16(t), rows.sum(0) if r == P - 1 else vals(r))
        t = bf16(vals(r))
        comm.broadcast(t, P - 1)
        np.testing.assert_array_equal(from_bf16(t), vals(P - 1))
        g = comm.all_gather(bf16(vals(r)))
        np.testing.assert_array_equal(from_bf16(g), rows)
        m = n // P * P
        rs = comm.reduce_scatter(bf16(vals(r)[:m]), "sum")
        np.testing.assert_array_equal(from_bf16(rs), rows[:, :m].sum(0)[r * (m // P):(r + 1) * (m // P)])


def check_big_float16_and_ops(comm):
    """The ring path (beyond FUSE_BYTES) for every op and dtype, and reduce / reduce_scatter there."""
    P, r = comm.world_size, comm.rank
    n = FUSE_BYTES // 2 + 11  # > FUSE_BYTES in every dtype of 2 bytes or more
    for dt in (np.float16, np.float32, np.float64, np.int32, np.int64):
        for op in ("sum", "avg", "max", "min", "prod"):
            if op == "avg" and np.dtype(dt).kind == "i":
                continue
            def vals(q, op=op):
                return ((1 + (np.arange(n) + q) % 2) if op == "prod" else (np.arange(n) * 7 + q * 5) % 31 - 15)
            rows = np.stack([vals(q) for q in range(P)]).astype(np.float64)
            want = {"sum": rows.sum(0), "avg": rows.mean(0), "max": rows.max(0), "min": rows.min(0),
                    "prod": rows.prod(0)}[op]
            t = T(vals(r).astype(dt))
            comm.all_reduce(t, op)
            tol = 2e-3 if op == "avg" and dt == np.float16 else 0
            np.testing.assert_allclose(npy(t).astype(np.float64), want.astype(dt).astype(np.float64), rtol=tol,
                                       atol=tol, err_msg=f"all_reduce {op} {np.dtype(dt)}")
            t = T(vals(r).astype(dt))
            comm.reduce(t, 0, op)
            np.testing.assert_allclose(npy(t).astype(np.float64), want.astype(dt) if r == 0 else vals(r).astype(dt),
                                       rtol=tol, atol=tol, err_msg=f"reduce {op} {np.dtype(dt)}")


def scenario_collectives(comm):
    check_all(comm, big=comm.world_size <= 2)
    check_bfloat16(comm)
    check_big_float16_and_ops(comm)
    return comm.rank


def scenario_distopt(comm):
    import distopt_cases
    return distopt_cases.run_all(comm)


def scenario_mismatch_then_go_on(comm):
    t = T(np.zeros(10 + (comm.rank == 1), np.float32))
    try:
        comm.all_reduce(t)
    except ValueError as e:
        message = str(e)
    else:
        raise AssertionError("mismatched sizes were not detected")
    try:
        comm.broadcast(T(np.zeros(3, np.float32)), root=comm.rank % 2)
    except ValueError as e:
        message2 = str(e)
    else:
        raise AssertionError("mismatched roots were not detected")
    try:  # another collective altogether, with a big tensor (no data in the header) on the other ranks
        if comm.rank == 2:
            comm.barrier()
        else:
            comm.all_reduce(T(np.zeros(FUSE_BYTES, np.float32)))
    except ValueError as e:
        message3 = str(e)
    else:
        raise AssertionError("a barrier against an all_reduce was not detected")
    if comm.rank < 2:  # a recv of another size than was sent
        if comm.rank == 0:
            comm.send(T(np.zeros(4, np.float32)), 1, tag=9)
        else:
            with pytest.raises(ValueError, match=r"rank 0 sent 4 float32, this rank receives 5 float32"):
                comm.recv(T(np.zeros(5, np.float32)), 0, tag=9)
    t = T(np.full(FUSE_BYTES, comm.rank, np.float32))  # the communicator goes on after a mismatch
    comm.all_reduce(t)
    assert (npy(t) == sum(range(comm.world_size))).all()
    return message, message2, message3


def scenario_point_to_point(comm):
    """Tags matched out of order, and messages sent before a collective kept for the recv after it."""
    r = comm.rank
    if r == 0:
        comm.send(T(np.arange(5, dtype=np.float32)), 1, tag=1)
        comm.send(T(np.arange(3, dtype=np.int64)), 1, tag=2)
        comm.send(T(np.full(200_000, 7, np.float64)), 1, tag=3)
        comm.barrier()
        return "sent"
    if r == 1:
        b = T(np.zeros(3, np.int64))
        comm.recv(b, 0, tag=2)
        c = T(np.zeros(200_000, np.float64))
        comm.barrier()  # tag 3's message came before the barrier's header: kept for this recv
        comm.recv(c, 0, tag=3)
        a = T(np.zeros(5, np.float32))
        comm.recv(a, 0, tag=1)
        assert npy(a).tolist() == [0, 1, 2, 3, 4] and npy(b).tolist() == [0, 1, 2] and (npy(c) == 7).all()
        return "received"
    comm.barrier()
    return "idle"


def scenario_split(comm):
    """Two splits in turn (evens, then odds): each member's place in its part and a sum over the part."""
    evens = comm.split(comm.rank % 2 == 0)
    odds = comm.split(comm.rank % 2 == 1)
    assert (evens is None) != (odds is None)
    part = evens or odds
    total = float(npy(part.all_reduce(T(np.array([comm.rank], np.float32))))[0])
    part.close()
    return part.rank, part.world_size, part.local_rank, part.local_size, total


# ----------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("world_size,rank0_serves,method", [(2, True, "spawn"), (3, False, "fork")])
def test_every_collective_and_dtype(world_size, rank0_serves, method):
    out, _ = run_tcp(scenario_collectives, world_size, rank0_serves=rank0_serves, method=method)
    assert out == {r: ("ok", r) for r in range(world_size)}, out


@pytest.mark.parametrize("world_size", [2, 3])
def test_distopt_on_tcp(world_size):
    # DistOpt's k ranks == 1 rank in every mode, as on the shm and mpi backends
    out, _ = run_tcp(scenario_distopt, world_size, timeout=240)
    for r in range(world_size):
        assert out[r][0] == "ok", out
        assert "equivalence_sgd" in out[r][1] and "buckets_leave_during_backward" in out[r][1], out


def test_split_makes_a_mesh_of_the_members_on_the_same_store():
    out, _ = run_tcp(scenario_split, 4)
    # one host: every member is local; the evens sum 0 + 2, the odds 1 + 3
    assert out == {r: ("ok", (r // 2, 2, r // 2, 2, 2.0 if r % 2 == 0 else 4.0)) for r in range(4)}, out


def test_mismatched_calls_name_every_rank_and_the_communicator_goes_on():
    out, _ = run_tcp(scenario_mismatch_then_go_on, 3)
    for r in range(3):
        assert out[r][0] == "ok", out
        sizes, roots, kinds = out[r][1]
        assert "rank 1 called all_reduce(65536 float32, op=sum)" in kinds and "rank 2 called barrier()" in kinds, kinds
        assert "rank 0 called all_reduce(10 float32, op=sum)" in sizes and \
            "rank 1 called all_reduce(11 float32, op=sum)" in sizes, sizes
        assert "rank 0 called broadcast(3 float32, root=0)" in roots and "rank 1 called broadcast(3 float32, root=1)" \
            in roots, roots


def test_point_to_point_tags():
    out, _ = run_tcp(scenario_point_to_point, 3)
    assert out == {0: ("ok", "sent"), 1: ("ok", "received"), 2: ("ok", "idle")}, out


def test_a_killed_rank_is_named_promptly_by_the_others():
    start = time.monotonic()
    out, _ = run_tcp(scenario_killed, 3, comm_timeout=60.0, args=(1,))
    for r in (0, 2):
        assert out[r][:2] == ("error", "CommError"), out
        assert "rank 1 (127.0.0.1:" in out[r][2] and "died" in out[r][2], out[r]
        assert f"host {socket.gethostname()})" in out[r][2], out[r]
    assert 1 not in out
    assert time.monotonic() - start < 20  # far below the 60 s timeout: process start-up included


def test_a_timeout_names_the_late_rank():
    start = time.monotonic()
    out, _ = run_tcp(scenario_timeout, 3, comm_timeout=1.0, args=(1,), timeout=30)
    for r in (0, 2):
        assert out[r][:2] == ("error", "CommError"), out
        assert "not finished after 1 s" in out[r][2] and "rank 1 (127.0.0.1:" in out[r][2], out[r]
        assert f"on host {socket.gethostname()}" in out[r][2], out[r]
    assert time.monotonic() - start < 20


def test_abort_reaches_every_rank():
    out, _ = run_tcp(scenario_abort, 3)
    assert out[1] == ("ok", "aborted")
    for r in (0, 2):
        assert out[r][:2] == ("error", "CommError") and "boom from rank 1" in out[r][2], out


# --------------------------------------------------------------- in one process (threads as ranks)
def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_rank_that_never_connects_is_named_and_nothing_leaks():
    before = open_fds()
    store = TcpStore(HOST, 0, 3, is_server=True, timeout=5)
    start = time.monotonic()
    with pytest.raises(CommError, match=r"ranks 1, 2 did not connect within 0.5 s"):
        TcpCommunicator(store, 0, 3, 0, 1, timeout=0.5)
    assert time.monotonic() - start < 3
    store.close()
    assert open_fds() == before


def make_mesh(stores, timeout=10):
    """One TcpCommunicator per store, made by one thread each (as the ranks' processes would)."""
    comms = [None] * len(stores)

    def make(r):
        comms[r] = TcpCommunicator(stores[r], r, len(stores), r, len(stores), timeout=timeout)
    threads = [threading.Thread(target=make, args=(r,)) for r in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert all(c is not None for c in comms)
    return comms


def test_later_communicators_on_the_same_store_do_not_meet_earlier_keys():
    server = TcpStore(HOST, 0, 2, is_server=True, timeout=5)
    stores = [server, TcpStore(HOST, server.port, 2, is_server=False, timeout=5)]
    first = make_mesh(stores)
    for c in first:
        c.close()
    second, third = make_mesh(stores), make_mesh(stores)
    for group in (second, third):
        works = [c.all_reduce(T(np.full(4, c.rank + 1.0, np.float32)), async_op=True) for c in group]
        assert all((npy(w.wait(10)) == 3).all() for w in works)
        for c in group:
            c.close()
    for s in stores[::-1]:
        s.close()
    # the one-rank job of dist.init(backend="tcp") gets a store of its own
    from singa_lite import dist
    c = dist.init(backend="tcp", timeout=5)
    assert c.backend == "tcp" and (npy(c.all_reduce(T(np.ones(3, np.float32)))) == 1).all()
    c.close()
    with pytest.raises(ValueError, match="needs a rendezvous store.*init_method='env'"):
        dist.init(backend="tcp", rank=0, world_size=2)


def test_close_releases_every_socket():
    before = open_fds()
    store = TcpStore(HOST, 0, 3, is_server=True, timeout=5)
    stores = [store] + [TcpStore(HOST, store.port, 3, is_server=False, timeout=5) for _ in range(2)]
    comms = make_mesh(stores)
    assert open_fds() > before + 6  # the mesh: two sockets per rank at least
    for c in comms:
        c.close()
    for s in stores:
        s.close()
    time.sleep(0.1)  # the store's serving threads close their connections
    assert open_fds() == before
    with pytest.raises(CommError, match="after close"):
        comms[0].barrier()


def test_a_failed_communicator_still_releases_its_sockets_on_close():
    before = open_fds()
    server = TcpStore(HOST, 0, 2, is_server=True, timeout=5)
    stores = [server, TcpStore(HOST, server.port, 2, is_server=False, timeout=5)]
    comms = make_mesh(stores)
    comms[1].abort("stop here")
    with pytest.raises(CommError, match="rank 1 aborted: stop here"):
        comms[0].barrier()
    for c in comms:
        c.close()
    for s in stores[::-1]:
        s.close()
    time.sleep(0.1)
    assert open_fds() == before


def test_a_rank_on_the_master_host_publishes_master_addr():
    # MASTER_ADDR as a name: the store connection's local address is loopback, which no other host could
    # reach, so the rank listens on every interface and its peers reach it at MASTER_ADDR
    server = TcpStore("localhost", 0, 2, is_server=True, timeout=5)
    stores = [server, TcpStore("localhost", server.port, 2, is_server=False, timeout=5)]
    comms = make_mesh(stores)
    for r, c in enumerate(comms):
        address = server.get(f"{c._prefix}/addr/{r}").decode()
        assert address.startswith("localhost:") and c._peers[1 - r].address.startswith("localhost:"), address
    works = [c.all_reduce(T(np.full(3, 2.0, np.float32)), async_op=True) for c in comms]
    assert all((npy(w.wait(10)) == 4).all() for w in works)
    for c in comms:
        c.close()
    for s in stores[::-1]:
        s.close()


def test_a_host_that_is_not_ours_is_a_clear_error():
    before = open_fds()
    store = TcpStore(HOST, 0, 2, is_server=True, timeout=5)
    with pytest.raises(CommError, match=r"cannot listen on 192\.0\.2\.1 .*host= must be an address"):
        TcpCommunicator(store, 0, 2, 0, 1, timeout=1, host="192.0.2.1")  # TEST-NET-1: never a local address
    store.close()
    assert open_fds() == before


def test_bad_arguments():
    with pytest.raises(ValueError, match="0 <= rank < world_size"):
        TcpCommunicator(None, 2, 2)
    with pytest.raises(TypeError, match="rank must be an int"):
        TcpCommunicator(None, "0", 2)
