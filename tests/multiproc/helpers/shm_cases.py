"""Per-rank scenarios of the shm communicator's correctness tests (test_shm_core.py): every collective x
dtype x size against numpy's closed form, rounding, NaN, in-place calls, mismatched and bad arguments,
send/recv. A spawned rank imports this module to run `matrix_worker`; each scenario returns a list of
problems (empty when all is well) so that one run reports everything it found.
"""
from __future__ import annotations

import hashlib

import numpy as np

from singa_lite import _core

DTYPES = (np.float16, np.float32, np.float64, np.int32, np.int64)
OPS = ("sum", "avg", "max", "min", "prod")
SLOT = 1 << 20
BIG_BYTES = 3 << 20  # three slots (six chunks): exercises chunking


def T(a: np.ndarray):
    return _core.Tensor.from_buffer(a)


# ---------------------------------------------------------------- values and their closed forms

def values(rank: int, n: int, dtype, op: str = "sum") -> np.ndarray:
    """Rank- and position-dependent values whose reductions are exact in every dtype."""
    i = np.arange(n, dtype=np.int64)
    if op == "prod":
        v = 1 + (rank + i) % 3
    elif dtype == np.float16:
        v = (rank * 13 + i) % 31 - 8  # period 31: no chunk size is a multiple of it
    else:
        v = rank * 1000 + i % (1 << 20) - 500
    return v.astype(dtype)


def reference(stack: np.ndarray, op: str, dtype) -> np.ndarray:
    if op == "sum":
        return stack.astype(np.float64 if np.dtype(dtype).kind == "f" else np.int64).sum(0).astype(dtype)
    if op == "avg":  # sum and divide in the accumulation type (float32 for float16), round once
        acc = np.float32 if dtype == np.float16 else dtype
        return (stack.astype(acc).sum(0) / acc(stack.shape[0])).astype(dtype)
    if op == "max":
        return stack.max(0)
    if op == "min":
        return stack.min(0)
    return stack.astype(np.int64).prod(0).astype(dtype)


def big(dtype) -> int:
    return BIG_BYTES // np.dtype(dtype).itemsize


def matrix_cases(P: int):
    """(collective, dtype, n, op, root) for every collective x dtype x size; n is the per-rank count."""
    root = P - 1  # not 0, so a root mix-up cannot pass
    for dtype in DTYPES:
        floating = np.dtype(dtype).kind == "f"
        for n in (0, 1, 7, 4099):
            for op in OPS:
                if op != "avg" or floating:
                    yield ("all_reduce", dtype, n, op, None)
            yield ("reduce", dtype, n, "sum", root)
            yield ("reduce", dtype, n, "max", 0)
            yield ("reduce_scatter", dtype, n, "sum", None)
            yield ("reduce_scatter", dtype, n, "prod", None)
        for n in (0, 1, 7, 4099, big(dtype)):
            yield ("broadcast", dtype, n, None, root)
            yield ("all_gather", dtype, n, None, None)
            yield ("gather", dtype, n, None, root)
            yield ("scatter", dtype, n, None, root)
        yield ("all_reduce", dtype, big(dtype), "sum", None)
        yield ("all_reduce", dtype, big(dtype), "max", None)
        yield ("reduce", dtype, big(dtype), "sum", root)
        yield ("reduce_scatter", dtype, big(dtype) // P, "sum", None)
    yield ("all_reduce", np.float16, big(np.float16), "avg", None)
    yield ("barrier", None, 0, None, None)


def run_case(c, rank, P, case):
    """Runs one case on this rank; returns (error or None, result digest or None)."""
    coll, dtype, n, op, root = case
    if coll == "barrier":
        c.barrier()
        return None, None
    kind = op or "sum"
    mine = values(rank, n, dtype, kind)
    every = np.stack([values(q, n, dtype, kind) for q in range(P)]) if n else np.zeros((P, 0), dtype)
    sentinel = 77
    if coll in ("all_reduce", "reduce"):
        t = mine.copy()
        if coll == "all_reduce":
            c.all_reduce(T(t), op)
            expected = reference(every, op, dtype)
        else:
            c.reduce(T(t), root, op)
            expected = reference(every, op, dtype) if rank == root else mine
        out = t
    elif coll == "broadcast":
        out = mine.copy()
        c.broadcast(T(out), root)
        expected = every[root]
    elif coll == "all_gather":
        out = np.full(P * n, sentinel, dtype)
        c.all_gather(T(out), T(mine))
        expected = every.reshape(-1)
    elif coll == "gather":
        out = np.full(P * n, sentinel, dtype) if rank == root else None
        c.gather(T(out) if out is not None else None, T(mine), root)
        if out is None:
            return None, None
        expected = every.reshape(-1)
    elif coll == "reduce_scatter":
        full = [values(q, P * n, dtype, kind) for q in range(P)]
        out = np.full(n, sentinel, dtype)
        c.reduce_scatter(T(out), T(full[rank]), op)
        expected = reference(np.stack(full), op, dtype)[rank * n:(rank + 1) * n]
    elif coll == "scatter":
        src = values(root, P * n, dtype) if rank == root else None
        out = np.full(n, sentinel, dtype)
        c.scatter(T(out), T(src) if src is not None else None, root)
        expected = values(root, P * n, dtype)[rank * n:(rank + 1) * n]
    else:
        raise AssertionError(coll)
    if out.dtype != expected.dtype or not np.array_equal(out, expected, equal_nan=out.dtype.kind == "f"):
        bad = np.flatnonzero(out != expected)[:5]
        return f"{case}: rank {rank} got {out[bad]} at {bad}, expected {expected[bad]}", None
    return None, hashlib.sha1(out.tobytes()).hexdigest()


def special_cases(c, rank, P):
    """float16 avg that would overflow if summed first; sums that round; NaN through max/min.
    Returns (errors, digests)."""
    errors, digests = [], {}
    big16 = np.full(5, 40000, np.float16)
    c.all_reduce(T(big16), "avg")
    if not (big16 == 40000).all():
        errors.append(f"float16 avg of 40000 gave {big16}")
    summed = np.full(5, 40000, np.float16)
    c.all_reduce(T(summed), "sum")
    if P > 1 and not np.isinf(summed).all():
        errors.append(f"float16 sum of {P} x 40000 should overflow to inf, gave {summed}")
    # Values that round: the result must be the fold over ranks 0..P-1 in order, in float32 for float16,
    # rounded once. 4099 elements: whole vector blocks and a scalar tail.
    for dtype in (np.float16, np.float32):
        rows = [np.random.default_rng(q).uniform(-1000, 1000, 4099).astype(dtype) for q in range(P)]
        acc_t = np.float32
        acc = rows[0].astype(acc_t)
        for row in rows[1:]:
            acc = acc + row.astype(acc_t)
        for op, expected in (("sum", acc.astype(dtype)), ("avg", (acc / acc_t(P)).astype(dtype))):
            x = rows[rank].copy()
            c.all_reduce(T(x), op)
            if not np.array_equal(x, expected):
                bad = np.flatnonzero(x != expected)[:3]
                errors.append(f"rounded {np.dtype(dtype)} {op}: got {x[bad]} at {bad}, expected {expected[bad]}")
    for op in ("max", "min"):
        for dtype in (np.float16, np.float32, np.float64):
            x = values(rank, 6, dtype)
            if rank == 0:
                x[0] = np.nan
            if rank == P - 1:
                x[1] = np.nan
            c.all_reduce(T(x), op)
            if not (np.isnan(x[:2]).all() and not np.isnan(x[2:]).any()):
                errors.append(f"{op} {np.dtype(dtype)} with NaN gave {x}")
            digests[f"nan-{op}-{np.dtype(dtype)}"] = hashlib.sha1(x.tobytes()).hexdigest()
    return errors, digests


def in_place_cases(c, rank, P):
    """The input given as this rank's block of the output (or the other way round), as torch's
    *_into_tensor calls allow; sizes span several chunks. Any other overlap is a ValueError."""
    errs = []
    n = 300_001  # float32: 1.2 MB per rank, several 512 KiB chunks, not a multiple of anything
    every = np.stack([values(q, n, np.float32) for q in range(P)])
    buf = np.zeros(P * n, np.float32)
    buf[rank * n:(rank + 1) * n] = every[rank]
    c.all_gather(T(buf), T(buf[rank * n:(rank + 1) * n]))
    if not np.array_equal(buf, every.reshape(-1)):
        errs.append("in-place all_gather")
    full = values(rank, P * n, np.float32)
    expected = reference(np.stack([values(q, P * n, np.float32) for q in range(P)]), "sum", np.float32)
    c.reduce_scatter(T(full[rank * n:(rank + 1) * n]), T(full), "sum")
    if not np.array_equal(full[rank * n:(rank + 1) * n], expected[rank * n:(rank + 1) * n]):
        errs.append("in-place reduce_scatter")
    root = P - 1
    buf = np.zeros(P * n, np.float32)
    buf[rank * n:(rank + 1) * n] = every[rank]
    c.gather(T(buf) if rank == root else None, T(buf[rank * n:(rank + 1) * n]), root)
    if rank == root and not np.array_equal(buf, every.reshape(-1)):
        errs.append("in-place gather")
    src = values(root, P * n, np.float32)
    out = src[rank * n:(rank + 1) * n] if rank == root else np.zeros(n, np.float32)
    c.scatter(T(out), T(src) if rank == root else None, root)
    if not np.array_equal(out, values(root, P * n, np.float32)[rank * n:(rank + 1) * n]):
        errs.append("in-place scatter")
    if P > 1:
        buf = np.zeros(P * 8, np.float32)
        errs.append(expect_raises(ValueError, lambda: c.all_gather(T(buf), T(buf[3:11])), "overlaps"))
    errs.append(still_in_step(c, rank, P))
    return [e for e in errs if e]


def expect_raises(kind, fn, *needles):
    try:
        fn()
    except kind as e:
        msg = str(e)
        missing = [s for s in needles if s not in msg]
        return f"message {msg!r} lacks {missing}" if missing else None
    except Exception as e:  # noqa: BLE001
        return f"expected {kind.__name__}, got {type(e).__name__}: {e}"
    return f"expected {kind.__name__}, nothing raised"


def still_in_step(c, rank, P):
    """An all_reduce whose result proves that every rank is at the same call again."""
    x = np.full(3, rank + 1, np.int64)
    c.all_reduce(T(x), "sum")
    return None if (x == P * (P + 1) // 2).all() else f"rank {rank}: ranks out of step after an error: {x}"


def mismatch_cases(c, rank, P):
    """Arguments that differ across ranks: every rank raises the same ValueError; the group stays usable."""
    errs = []
    last = P - 1
    x = np.zeros(10 + (rank == last), np.float32)
    errs.append(expect_raises(ValueError, lambda: c.all_reduce(T(x), "sum"),
                              f"rank {last} passed all_reduce of 11 float32", "rank 0 passed all_reduce of 10 float32"))
    errs.append(still_in_step(c, rank, P))
    y = np.zeros(4, np.float32)
    call = (lambda: c.barrier()) if rank == 0 else (lambda: c.all_reduce(T(y), "sum"))
    errs.append(expect_raises(ValueError, call, "rank 0 passed barrier", f"rank {last} passed all_reduce"))
    errs.append(still_in_step(c, rank, P))
    errs.append(expect_raises(ValueError, lambda: c.broadcast(T(y), rank % 2), "rank 1 passed broadcast of 4 float32 "
                              "elements with root 1", "rank 0 passed broadcast of 4 float32 elements with root 0"))
    z = np.zeros(4, np.float64 if rank == last else np.float32)
    errs.append(expect_raises(ValueError, lambda: c.all_reduce(T(z), "max"), "float64", "float32"))
    errs.append(still_in_step(c, rank, P))
    return [e for e in errs if e]


def p2p_cases(c, rank, P):
    """A ring (rank r sends to r + 1) at sizes up to several channels, then tag / size mismatches."""
    errs = []
    nxt, prv = (rank + 1) % P, (rank - 1) % P
    for n in (0, 5, 300_000):  # 1.2 MB: several times the channel
        out = (np.arange(n, dtype=np.float32) + rank * 7)
        got = np.full(n, -1, np.float32)
        if rank == 0:  # one rank sends first: messages above the channel size need a matching recv running
            c.send(T(out), nxt, 11)
            c.recv(T(got), prv, 11)
        else:
            c.recv(T(got), prv, 11)
            c.send(T(out), nxt, 11)
        if not np.array_equal(got, np.arange(n, dtype=np.float32) + prv * 7):
            errs.append(f"ring of {n}: rank {rank} got wrong data")
    if rank == 0:
        c.send(T(np.arange(4, dtype=np.int32)), 1, 1)
    elif rank == 1:
        got = np.zeros(4, np.int32)
        errs.append(expect_raises(ValueError, lambda: c.recv(T(got), 0, 2), "tag 1", "tag 2"))
        errs.append(expect_raises(ValueError, lambda: c.recv(T(np.zeros(5, np.int32)), 0, 1), "4 int32", "5 int32"))
        c.recv(T(got), 0, 1)  # the message stayed queued for the matching recv
        if not np.array_equal(got, np.arange(4)):
            errs.append(f"recv after a tag mismatch got {got}")
    errs.append(still_in_step(c, rank, P))
    return [e for e in errs if e]


def local_arg_cases(c, rank, P):
    """Bad arguments raise locally on every rank before anything is shared; the group stays in step."""
    f = np.zeros(8, np.float32)
    errs = [
        expect_raises(ValueError, lambda: c.all_reduce(T(np.zeros((4, 4), np.float32)[:, 1]), "sum"), "not contiguous"),
        expect_raises(TypeError, lambda: c.all_reduce(T(np.zeros(4, np.bool_)), "sum"), "bool"),
        expect_raises(TypeError, lambda: c.all_reduce(T(np.zeros(4, np.int32)), "avg"), "avg", "int32"),
        expect_raises(ValueError, lambda: c.all_reduce(T(f), "mean"), "'sum', 'avg', 'max', 'min', 'prod'", "mean"),
        expect_raises(ValueError, lambda: c.broadcast(T(f), P), "root must be in [0, "),
        expect_raises(ValueError, lambda: c.reduce(T(f), -1, "sum"), "root"),
        expect_raises(ValueError, lambda: c.all_gather(T(np.zeros(P * 8 + 1, np.float32)), T(f)), "world_size"),
        expect_raises(TypeError, lambda: c.all_gather(T(np.zeros(P * 8, np.float64)), T(f)), "dtypes differ"),
        expect_raises(ValueError, lambda: c.reduce_scatter(T(f), T(np.zeros(8, np.float32)), "sum"),
                      "world_size") if P > 1 else None,
        expect_raises(ValueError, lambda: c.gather(None, T(f), rank), "None"),
        expect_raises(ValueError, lambda: c.scatter(T(f), None, rank), "None"),
        expect_raises(ValueError, lambda: c.send(T(f), rank, 0), "this rank"),
        expect_raises(ValueError, lambda: c.recv(T(f), P, 0), "src must be in"),
    ]
    errs.append(still_in_step(c, rank, P))
    return [e for e in errs if e]


def matrix_worker(rank, P, name):
    c = _core.ShmComm(name, rank, P, 60.0, SLOT)
    errors, digests = [], {}
    for i, case in enumerate(matrix_cases(P)):
        err, digest = run_case(c, rank, P, case)
        if err:
            errors.append(err)
        if digest:
            digests[(i, case[0])] = digest
    e, d = special_cases(c, rank, P)
    errors += e
    digests.update(d)
    errors += local_arg_cases(c, rank, P)
    errors += in_place_cases(c, rank, P)
    if P > 1:
        errors += mismatch_cases(c, rank, P)
        errors += p2p_cases(c, rank, P)
    c.close()
    return errors, digests
