"""all_reduce through the shm backend's C++ communicator alone, on processes started by multiprocessing
(no MPI needed). For the comparison with MPI_Allreduce in the same run, use bench/bench_comm.py.

    python bench/bench_shm_quick.py                      # 2 ranks at every size, 4 ranks at 1 MiB and 16 MiB
    python bench/bench_shm_quick.py --dtype float16      # the wire dtype of DistOpt's fp16 path
    mpiexec -n 2 python bench/bench_shm_quick.py --mpi   # MPI_Allreduce via mpi4py, same sizes and timing

Each size: a few warm-up calls, then 7 batches of back-to-back calls (200 MiB per batch, 2 to 1000 calls);
the time per call is the median over batches of batch time / calls. algbw = bytes / time;
busbw = algbw * 2 (P - 1) / P (nccl-tests' convention for all-reduce).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

import numpy as np

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]


def time_per_call(fn, barrier, nbytes: int, reps: int = 7) -> float:
    # The batch length depends only on the size, so every rank makes the same calls.
    calls = max(2, min(1000, (200 << 20) // max(nbytes, 1)))
    for _ in range(3):
        fn()
    per = []
    for _ in range(reps):
        barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls)
    return statistics.median(per)


def report(label: str, P: int, nbytes: int, t: float) -> str:
    algbw = nbytes / t / 1e9
    busbw = algbw * 2 * (P - 1) / P
    return (f"{label:13s} P={P} {nbytes / 1024:>9.0f} KiB  {t * 1e6:>10.1f} us  "
            f"algbw {algbw:6.2f} GB/s  busbw {busbw:6.2f} GB/s")


def shm_worker(rank: int, P: int, name: str, sizes, slot_bytes: int, dtype: str, q):
    from singa_lite import _core

    c = _core.ShmComm(name, rank, P, 120.0, slot_bytes)
    out = []
    for nbytes in sizes:
        x = np.ones(nbytes // np.dtype(dtype).itemsize, dtype)
        t = _core.Tensor.from_buffer(x)
        out.append((nbytes, time_per_call(lambda: c.all_reduce(t, "sum"), c.barrier, nbytes)))
    c.close()
    q.put((rank, out))


def run_shm(P: int, sizes, slot_bytes: int, dtype: str):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    name = f"/sl_bench_{os.getpid()}_{P}"
    procs = [ctx.Process(target=shm_worker, args=(r, P, name, sizes, slot_bytes, dtype, q)) for r in range(P)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=600) for _ in range(P))
    for p in procs:
        p.join()
    for nbytes, t in results[0]:
        print(report(f"shm {dtype}", P, nbytes, t), flush=True)


def run_mpi(sizes):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    P = comm.Get_size()
    for nbytes in sizes:
        x = np.ones(nbytes // 4, np.float32)
        y = np.empty_like(x)
        t = time_per_call(lambda: comm.Allreduce(x, y, op=MPI.SUM), comm.Barrier, nbytes)
        if comm.Get_rank() == 0:
            print(report("mpi", P, nbytes, t), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mpi", action="store_true", help="time MPI_Allreduce instead (run under mpiexec)")
    ap.add_argument("--ranks", type=int, nargs="*", default=[2, 4], help="shm world sizes (default 2 4)")
    ap.add_argument("--slot-bytes", type=int, default=1 << 20)
    ap.add_argument("--dtype", default="float32", choices=["float16", "float32", "float64", "int32", "int64"])
    args = ap.parse_args()
    if args.mpi:
        run_mpi(SIZES)
        return
    for P in args.ranks:
        run_shm(P, SIZES if P == 2 else [1 << 20, 16 << 20], args.slot_bytes, args.dtype)


if __name__ == "__main__":
    main()
