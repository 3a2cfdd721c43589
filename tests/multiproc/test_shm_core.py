"""The C++ shared-memory communicator (singa_lite._core.ShmComm) on 1-4 processes.

Each multi-process test runs a module-level worker function on P processes (spawn by default, fork for
a few) through `run_ranks` (shm_harness.py), which collects every rank's result or exception through a
Queue under a hard deadline and kills what is left, so this file can never hang. The correctness
matrix (shm_cases.py) runs once per P in one group of processes: every worker runs all cases, checks its
results against numpy's closed form and returns digests, which must agree bitwise across ranks. An
autouse fixture checks that no segment with this file's name prefix is left in /dev/shm after any test,
failed jobs included.
"""
from __future__ import annotations

import os
import signal
import socket
import stat
import threading
import time

import numpy as np
import pytest

from shm_cases import T, local_arg_cases, matrix_worker
from shm_harness import (SHM_DIR, leftovers, memfd_links, new_name, ok_values, rendezvous_listening, run_ranks,
                         wait_for_rendezvous)
from singa_lite import _core

CommError = _core.CommError


@pytest.fixture(autouse=True)
def no_segment_left():
    yield
    left = leftovers()
    for f in left:
        if not f.startswith("@"):
            _core.shm_unlink("/" + f)
    assert not left, f"segments left in {SHM_DIR}, or rendezvous sockets still listening: {left}"


# ---------------------------------------------------------------- correctness

@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_every_collective_dtype_and_size(P):
    if P == 1:  # one rank needs no other process
        results = {0: ("ok", matrix_worker(0, 1, new_name()))}
    else:
        results = run_ranks(matrix_worker, P, timeout=150)
    out = ok_values(results)
    for r in range(P):
        assert out[r][0] == [], "\n".join(out[r][0][:20])
    # Results every rank receives in full must agree bit for bit.
    shared = ("all_reduce", "broadcast", "all_gather")
    for key, digest in out[0][1].items():
        if isinstance(key, str) or key[1] in shared:
            for r in range(1, P):
                assert out[r][1].get(key) == digest, f"{key}: rank {r} differs from rank 0"


def test_threads_of_one_process_release_the_gil():
    """Two ranks in two threads: each blocking call must release the GIL or the pair would deadlock."""
    name = new_name()
    out = {}

    def rank1():
        with _core.ShmComm(name, 1, 2, 20.0) as c:
            x = np.full(1000, 2.0, np.float32)
            c.all_reduce(T(x), "sum")
            out[1] = x[0]

    th = threading.Thread(target=rank1)
    th.start()
    with _core.ShmComm(name, 0, 2, 20.0) as c:
        x = np.full(1000, 1.0, np.float32)
        c.all_reduce(T(x), "sum")
        out[0] = x[0]
    th.join(30)
    assert out == {0: 3.0, 1: 3.0}


@pytest.fixture(params=["memfd", "named"])
def transport(request, monkeypatch):
    """Runs a test under each transport (SINGA_LITE_SHM_TRANSPORT; processes started meanwhile inherit it)."""
    monkeypatch.setenv("SINGA_LITE_SHM_TRANSPORT", request.param)
    assert _core.shm_transport() == request.param
    return request.param


def test_segment_is_private_and_its_name_goes_once_all_joined(transport):
    name = new_name()
    path = os.path.join(SHM_DIR, name[1:])
    comms = {}
    th = threading.Thread(target=lambda: comms.setdefault(0, _core.ShmComm(name, 0, 2, 20.0)))
    th.start()
    wait_for_rendezvous(name)
    if transport == "named":
        mode = stat.S_IMODE(os.stat(path).st_mode)
    else:  # no name in /dev/shm at any time: the memory is a memfd that rank 0 serves from this process
        assert not os.path.exists(path)
        served = memfd_links(os.getpid(), name)
        assert len(served) == 1, served
        mode = stat.S_IMODE(os.stat(served[0]).st_mode)
    assert mode == 0o600, oct(mode)
    comms[1] = _core.ShmComm(name, 1, 2, 20.0)
    th.join(10)
    assert {c.transport for c in comms.values()} == {transport}
    # Every rank joined: no name, no socket, no descriptor; only the mappings hold the memory.
    assert not os.path.exists(path), "the name must be unlinked once every rank has joined"
    assert not rendezvous_listening(name) and memfd_links(os.getpid(), name) == []
    for c in comms.values():
        c.close()


def test_join_errors_duplicate_rank_and_different_parameters(transport):
    """A rank joining twice and a rank with another world size fail at once; the job itself goes on."""
    name = new_name()
    comms = {}
    th = threading.Thread(target=lambda: comms.setdefault(0, _core.ShmComm(name, 0, 2, 20.0)))
    th.start()
    wait_for_rendezvous(name)
    with pytest.raises(ValueError, match="created for world_size 2 .* this rank passed world_size 3"):
        _core.ShmComm(name, 1, 3, 5.0)
    with pytest.raises(ValueError, match="slot_bytes"):
        _core.ShmComm(name, 1, 2, 5.0, 1 << 21)
    time.sleep(0.2)  # rank 0 claims its place microseconds after creating the segment
    with pytest.raises(CommError, match="rank 0 has already joined"):
        _core.ShmComm(name, 0, 2, 5.0)
    comms[1] = _core.ShmComm(name, 1, 2, 20.0)
    th.join(10)
    x = np.ones(3, np.float32)
    th = threading.Thread(target=lambda: comms[0].all_reduce(T(np.ones(3, np.float32))))
    th.start()
    comms[1].all_reduce(T(x))
    th.join(10)
    assert (x == 2).all()
    for c in comms.values():
        c.close()


def test_a_transport_other_than_memfd_or_named_is_refused(monkeypatch):
    monkeypatch.setenv("SINGA_LITE_SHM_TRANSPORT", "tmpfs")
    with pytest.raises(ValueError, match="SINGA_LITE_SHM_TRANSPORT must be 'memfd' or 'named', got 'tmpfs'"):
        _core.ShmComm(new_name(), 0, 1, 5.0)


def test_a_rendezvous_that_times_out_says_when_another_transport_holds_the_name(monkeypatch):
    # Ranks of one job that use different transports never meet; the one that times out finds the other's trace
    # (made by hand here, so that no other rank's timer decides what is left when this one looks).
    name = new_name()
    fd = os.open(os.path.join(SHM_DIR, name[1:]), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.close(fd)
    try:
        monkeypatch.setenv("SINGA_LITE_SHM_TRANSPORT", "memfd")
        with pytest.raises(CommError, match="rank 1 of 2 did not join.*some ranks use SINGA_LITE_SHM_TRANSPORT=named"):
            _core.ShmComm(name, 0, 2, 0.5)
    finally:
        _core.shm_unlink(name)
    name = new_name()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(_core.shm_rendezvous_address(name))
        server.listen()
        monkeypatch.setenv("SINGA_LITE_SHM_TRANSPORT", "named")
        with pytest.raises(CommError, match="rank 1 of 2 did not join.*serves this name over the memfd transport"):
            _core.ShmComm(name, 0, 2, 0.5)


# ---------------------------------------------------------------- local errors (no other process needed)

def test_bad_arguments_raise_before_communicating():
    with _core.ShmComm(new_name(), 0, 1, 5.0) as c:
        errs = [e for e in local_arg_cases(c, 0, 1) if e]
        assert errs == []
        assert c.rank == 0 and c.world_size == 1 and c.timeout == 5.0 and not c.aborted
        c.timeout = 2.5
        assert c.timeout == 2.5
        with pytest.raises(ValueError, match="timeout must be a positive"):
            c.timeout = 0
    for bad in ("noslash", "/", "/a/b", "/" + "x" * 200):
        with pytest.raises(ValueError, match="segment name"):
            _core.ShmComm(bad, 0, 1)
    with pytest.raises(ValueError, match="rank must be in"):
        _core.ShmComm(new_name(), 1, 1)
    with pytest.raises(ValueError, match="world_size must be in"):
        _core.ShmComm(new_name(), 0, 0)
    with pytest.raises(ValueError, match="slot_bytes must be in"):
        _core.ShmComm(new_name(), 0, 1, 5.0, 100)
    _core.shm_unlink(new_name())  # a missing name is fine
    with pytest.raises(ValueError, match="segment name"):
        _core.shm_unlink("bad")


def test_closed_communicator_raises():
    c = _core.ShmComm(new_name(), 0, 1, 5.0)
    c.close()
    c.close()  # idempotent
    assert c.closed
    with pytest.raises(CommError, match="closed"):
        c.barrier()
    with pytest.raises(CommError, match="closed"):
        c.all_reduce(T(np.zeros(3, np.float32)))
    c.abort("after close")  # a no-op: used on error paths that may run after close
    assert issubclass(CommError, RuntimeError)


# ---------------------------------------------------------------- failures: nothing may hang

def timeout_worker(rank, P, name):
    c = _core.ShmComm(name, rank, P, 1.0)
    c.barrier()
    x = np.ones(16, np.float32)
    if rank == P - 1:
        time.sleep(3.0)  # misses the all_reduce
        t0 = time.monotonic()
        try:
            c.all_reduce(T(x))
        except CommError as e:
            return "late", str(e), time.monotonic() - t0
        return "late", "no error", 0.0
    t0 = time.monotonic()
    try:
        c.all_reduce(T(x))
    except CommError as e:
        return "waiting", str(e), time.monotonic() - t0
    return "waiting", "no error", 0.0


def test_timeout_names_the_missing_rank():
    P = 3
    out = ok_values(run_ranks(timeout_worker, P))
    for r in range(P - 1):
        role, msg, took = out[r]
        assert "all_reduce #2" in msg and f"rank {P - 1}" in msg, msg
        assert took < 4.0, (took, msg)
    role, msg, took = out[P - 1]
    assert "aborted by rank" in msg and took < 0.5, msg  # the late rank fails at once


def died_worker(rank, P, name, how):
    c = _core.ShmComm(name, rank, P, 60.0)  # a long timeout: the death must be noticed, not timed out
    c.barrier()
    x = np.ones(1 << 20, np.float32)
    if rank == 1:
        time.sleep(0.3)  # the others are inside the all_reduce by now
        if how == "exit":
            os._exit(1)
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        c.all_reduce(T(x))
    except CommError as e:
        return str(e), time.monotonic() - t0
    return "no error", 0.0


@pytest.mark.parametrize("how,ctx", [("exit", "spawn"), ("sigkill", "fork")])
def test_dead_rank_is_named_quickly(how, ctx):
    # The dead rank is not reaped until the others report: it stays a zombie, which must count as dead.
    out = ok_values(run_ranks(died_worker, 3, how, ctx=ctx, silent=(1,)))
    for r in (0, 2):
        msg, took = out[r]
        assert "rank 1" in msg and "died" in msg, msg
        assert took < 10.0, took
        assert took < 2.0, f"noticed only after {took:.2f} s"


def abort_worker(rank, P, name):
    c = _core.ShmComm(name, rank, P, 30.0)
    c.barrier()
    if rank == 1:
        time.sleep(0.3)
        c.abort("boom")
        assert c.aborted and "boom" in c.abort_reason
        try:
            c.barrier()
        except CommError as e:
            return str(e), 0.0
        return "no error", 0.0
    t0 = time.monotonic()
    try:
        c.all_reduce(T(np.ones(8, np.float32)))
    except CommError as e:
        took = time.monotonic() - t0
        try:  # every later call fails at once
            c.barrier()
        except CommError as again:
            assert "boom" in str(again)
        return str(e), took
    return "no error", 0.0


def test_abort_reaches_every_rank():
    out = ok_values(run_ranks(abort_worker, 3, ctx="fork"))
    for r in (0, 2):
        msg, took = out[r]
        assert "boom" in msg and "rank 1" in msg, msg
        assert took < 2.0
    assert "this rank (1) aborted the job: boom" in out[1][0]


def left_worker(rank, P, name):
    c = _core.ShmComm(name, rank, P, 30.0)
    c.barrier()
    if rank == 1:
        time.sleep(0.3)
        c.close()
        return "closed", 0.0
    t0 = time.monotonic()
    try:
        c.all_reduce(T(np.ones(8, np.float32)))
    except CommError as e:
        return str(e), time.monotonic() - t0
    return "no error", 0.0


def test_rank_that_left_is_named_quickly():
    out = ok_values(run_ranks(left_worker, 2))
    msg, took = out[0]
    assert "rank 1" in msg and "left" in msg, msg
    assert took < 2.0


def join_worker(rank, P, name):
    t0 = time.monotonic()
    try:
        _core.ShmComm(name, rank, P, 1.0)
    except CommError as e:
        return str(e), time.monotonic() - t0
    return "no error", 0.0


def test_rendezvous_timeout_names_missing_ranks_and_removes_the_segment():
    out = ok_values(run_ranks(join_worker, 3, ranks=[0, 1]))
    for r in (0, 1):
        msg, took = out[r]
        assert "rank 2" in msg and ("did not join" in msg or "aborted" in msg), msg
        assert took < 4.0
    # the autouse fixture checks that the creator removed the segment


def interrupt_worker(rank, P, name):
    c = _core.ShmComm(name, rank, P, 60.0)
    c.barrier()
    x = np.ones(8, np.float32)
    if rank == 0:  # Ctrl-C while waiting for rank 1, which is late
        # Python's own Ctrl-C handler, whatever disposition the process inherited: a process started while its
        # parent had SIGINT ignored (a background job of a shell, nohup) inherits the ignore across exec.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sent = []

        def ctrl_c():
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)
        threading.Timer(0.3, ctrl_c).start()
        try:
            c.all_reduce(T(x))
        except KeyboardInterrupt:
            return "KeyboardInterrupt", time.monotonic() - sent[0]
        return "no error", sent
    # Rank 1 is late on purpose: it joins only once rank 0 has given up (the abort is in the segment), so the
    # test never depends on how fast a loaded machine runs rank 0's timer. Bounded: rank 0's wait lasts 60 s.
    deadline = time.monotonic() + 90.0
    while not c.aborted and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        c.all_reduce(T(x))
    except CommError as e:
        return str(e), 0.0
    return "no error", 0.0


def test_ctrl_c_interrupts_a_waiting_rank_and_aborts_the_job():
    out = ok_values(run_ranks(interrupt_worker, 2, timeout=120))
    what, took = out[0]
    # Interrupted at the next check of the waiting loop (every 40 ms), not at the 60 s timeout: the bound only
    # tells those two apart.
    assert what == "KeyboardInterrupt" and took < 10.0, out[0]
    assert "aborted by rank 0" in out[1][0] and "interrupted" in out[1][0], out[1][0]
