"""The mpi backend's C++ hot path (csrc/comm/mpi_hot.h) against its Python path, in one MPI job, for
tests/multiproc/test_mpi_hot_path.py: ``mpiexec -n 3 python mpi_hot_job.py``. Two communicators over the same
ranks, one made with the hot path (the default, where mpi4py speaks the MPICH ABI) and one with
SINGA_LITE_MPI_HOT_PATH=0, run the same all_reduce calls (every dtype and op, fused into the call check and
not, with inf, nan, signed zeros, overflow and values whose sum depends on the order); every result must be the
same bits. Prints ``HOT <rank> <on> <off>``, ``DIFF <rank> <case>`` for a difference, ``CHECKED <rank> <n>``,
``OTHER <rank> ok`` after the other collectives (which enter and wait through the hot path), and
``PROGRESS <rank> <watcher's board> <calls entered>``.

``mpi_hot_job.py timeout``: rank 1 never arrives at an all_reduce too big to ride in the check (MPI_Iallreduce
polled in C++): the others print ``TIMEOUT <rank> <seconds> <message>``. ``mpi_hot_job.py kinds``: rank 0 calls
that all_reduce, rank 1 a broadcast: ``RAISED <rank> <message>`` on both, then ``BROKEN <rank>`` when the
next call raises CommError (different kinds never pair up in MPI). ``mpi_hot_job.py count``: rank 1 passes one
element more: ``RAISED`` on both, then ``AFTER <rank> <values>`` from a matched all_reduce (the mismatched data
collectives paired up and were drained: the communicator goes on)."""
import os
import sys
import time

import numpy as np

from singa_lite import _core, tensor
from singa_lite.comm import mpi, mpi_hot
from singa_lite.comm._arrays import array
from singa_lite.comm.communicator import REDUCE_OPS

DTYPES = (tensor.float32, tensor.float64, tensor.int32, tensor.int64, tensor.float16, tensor.bfloat16)


def values(rank: int, n: int, dtype, seed: int) -> np.ndarray:
    """Rank `rank`'s data: random magnitudes over many exponents, and special values in the first slots."""
    rng = np.random.default_rng(seed * 131 + rank)
    if dtype in (tensor.int32, tensor.int64):  # large: sums and products wrap
        info = np.iinfo(np.int32 if dtype == tensor.int32 else np.int64)
        return rng.integers(info.min // 2, info.max // 2, n, dtype=info.dtype)
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)
    specials = [np.nan, -0.0, 0.0, np.inf, -np.inf, 3e38, -3e38, 6e4, 1e-30]
    for i, v in enumerate(specials[:n]):
        x[(i + rank) % n] = v
    return x


def make(x: np.ndarray, dtype):
    if dtype == tensor.bfloat16:
        return tensor.from_numpy(x.astype(np.float64)).as_type(tensor.bfloat16).data
    numpy_type = {tensor.float32: np.float32, tensor.float64: np.float64, tensor.float16: np.float16}.get(dtype)
    return _core.Tensor.from_buffer(np.ascontiguousarray(x.astype(numpy_type) if numpy_type else x))


def bits(t) -> bytes:
    return array(t).tobytes()  # bfloat16 as its uint16 bits


def main():
    hot = mpi.MpiCommunicator(timeout=60)
    os.environ[mpi_hot.HOT_PATH_VAR] = "0"
    cold = mpi.MpiCommunicator(timeout=60)
    rank = hot.rank
    print(f"HOT {rank} {hot._hot is not None} {cold._hot is not None}", flush=True)
    checked = 0
    for seed, n in enumerate((1, 9, 1000, 1024, 1500, 5000)):  # float32: fused up to 1024, not above
        for dtype in DTYPES:
            for op in REDUCE_OPS:
                if op == "avg" and dtype in (tensor.int32, tensor.int64):
                    continue
                x = values(rank, n, dtype, seed)
                a, b = make(x, dtype), make(x, dtype)
                hot.all_reduce(a, op=op)
                cold.all_reduce(b, op=op)
                if bits(a) != bits(b):
                    print(f"DIFF {rank} {dtype.name} {op} n={n}", flush=True)
                checked += 1
    # Not through the fast entry: a tensor.Tensor, a strided tensor, asynchronous work.
    x = values(rank, 300, tensor.float32, 99)
    a, b = tensor.from_numpy(x.astype(np.float32)), tensor.from_numpy(x.astype(np.float32))
    hot.all_reduce(a, op="avg")
    cold.all_reduce(b, op="avg")
    checked += 1
    if bits(a.data) != bits(b.data):
        print(f"DIFF {rank} tensor.Tensor", flush=True)
    m = np.arange(64, dtype=np.float32).reshape(8, 8) * (rank + 1)
    a, b = _core.Tensor.from_buffer(m.copy()).transpose([1, 0]), _core.Tensor.from_buffer(m.copy()).transpose([1, 0])
    hot.all_reduce(a)
    cold.all_reduce(b)
    checked += 1
    if bits(a.contiguous()) != bits(b.contiguous()):
        print(f"DIFF {rank} strided", flush=True)
    a, b = make(values(rank, 20000, tensor.float32, 7), tensor.float32), make(values(rank, 20000, tensor.float32, 7),
                                                                                tensor.float32)
    hot.all_reduce(a, async_op=True).wait()
    cold.all_reduce(b)
    checked += 1
    if bits(a) != bits(b):
        print(f"DIFF {rank} async", flush=True)
    print(f"CHECKED {rank} {checked}", flush=True)
    # The other collectives enter and wait through the hot path.
    t = _core.Tensor.from_buffer(np.full(5, float(rank), np.float32))
    hot.broadcast(t, root=1)
    gathered = np.asarray(hot.all_gather(_core.Tensor.from_buffer(np.full(3, rank, np.int64))))
    hot.barrier()
    ok = np.asarray(t).tolist() == [1.0] * 5 and gathered[:, 0].tolist() == list(range(hot.world_size))
    print(f"OTHER {rank} {'ok' if ok else 'wrong'}", flush=True)
    # The watcher's progress board (which rank died first) follows the calls counted in C++.
    board, slot = hot._progress
    print(f"PROGRESS {rank} {board[slot]} {int(hot._entered[0])}", flush=True)
    hot.close()
    cold.close()


def failures(case: str):
    comm = mpi.MpiCommunicator(timeout=2.0)
    rank = comm.rank
    print(f"HOT {rank} {comm._hot is not None}", flush=True)
    big = _core.Tensor.from_buffer(np.ones(5000, np.float32))  # 20 KB: not fused into the check
    if case == "timeout":
        if rank == 1:
            time.sleep(30)  # mpiexec ends it when the others abort the job
            return
        start = time.monotonic()
        try:
            comm.all_reduce(big)
        except _core.CommError as e:
            print(f"TIMEOUT {rank} {time.monotonic() - start:.1f} {e}", flush=True)
        return
    if case == "count":
        try:
            comm.all_reduce(_core.Tensor.from_buffer(np.ones(5000 + rank, np.float32)))
        except ValueError as e:
            print(f"RAISED {rank} {e}", flush=True)
        after = _core.Tensor.from_buffer(np.ones(3, np.float32))
        comm.all_reduce(after)
        print(f"AFTER {rank} {np.asarray(after).tolist()}", flush=True)
        return
    try:
        if rank == 0:
            comm.all_reduce(big)
        else:
            comm.broadcast(big)
    except ValueError as e:
        print(f"RAISED {rank} {e}", flush=True)
    try:
        comm.barrier()
    except _core.CommError:
        print(f"BROKEN {rank}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        failures(sys.argv[1])
    else:
        main()
