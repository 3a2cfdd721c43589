"""All-reduce latency and bandwidth: singa_lite's mpi, shm and tcp backends against a raw mpi4py Allreduce of
the same buffers, in the same MPI job. Run under mpiexec (the shm communicator's segment name is
broadcast over MPI, and so is the port of the tcp backend's store on loopback, so the same ranks run all
of them):

    mpiexec -n 2 python bench/bench_comm.py
    mpiexec -n 4 python bench/bench_comm.py --sizes 1M 16M --repeat 9

For each size, blocks of calls are timed in turn (raw, mpi, shm, raw, mpi, shm, ...) and medians reported,
as rank 0's time per call (all ranks synchronise before each block). algbw = bytes / time; busbw = algbw *
2 (P - 1) / P, the bytes each rank's link carries in a ring all-reduce (nccl-tests' definition). ratio = raw
time / backend time (> 1: faster than raw mpi4py). Goals: mpi >= 0.9x raw, shm >= 1.0x raw from 1 MiB on.

The mpi backend checks every call's signature across ranks (verify=True, the default); "mpi nocheck" is the
same backend with verify=False, and "check" = mpi time / nocheck time - 1, the cost of that check (goal:
<= 10 % at 4 KiB). The mpi backend's per-call work runs in C++ where mpi4py speaks the MPICH ABI (see
singa_lite/comm/mpi.py); --python-path adds "singa mpipy", the same backend made with SINGA_LITE_MPI_HOT_PATH=0.
Goals of issue 18.5: mpi >= 0.8x raw at 4 KiB, >= 0.95x from 64 KiB.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

from singa_lite import _core, dist

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(s: str) -> int:
    return int(s[:-1]) * UNITS[s[-1].upper()] if s[-1].upper() in UNITS else int(s)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sizes", nargs="+", default=["4K", "64K", "1M", "4M", "16M", "64M"],
                   help="message sizes in bytes (K/M suffixes)")
    p.add_argument("--repeat", type=int, default=7, help="timed blocks per implementation and size")
    p.add_argument("--target", type=float, default=0.05, help="seconds per timed block (sets calls per block)")
    p.add_argument("--no-shm", action="store_true", help="skip the shm backend")
    p.add_argument("--no-tcp", action="store_true", help="skip the tcp backend")
    p.add_argument("--python-path", action="store_true",
                   help="also run the mpi backend's Python path (SINGA_LITE_MPI_HOT_PATH=0) as 'singa mpipy'")
    return p.parse_args()


def time_block(fn, calls: int, comm) -> float:
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    comm.Barrier()
    return (time.perf_counter() - t) / calls


def main():
    args = parse_args()
    world = MPI.COMM_WORLD
    P, rank = world.size, world.rank
    impls = {"raw mpi4py": None, "singa mpi": dist.init(backend="mpi"),
             "singa nocheck": dist.init(backend="mpi", verify=False)}
    if args.python_path:
        from singa_lite.comm.mpi import HOT_PATH_VAR, MpiCommunicator
        os.environ[HOT_PATH_VAR] = "0"
        impls["singa mpipy"] = MpiCommunicator()
        del os.environ[HOT_PATH_VAR]
    if not args.no_shm and hasattr(_core, "ShmComm"):
        name = dist.broadcast_bytes(dist.NcclIdHolder().shm_name.encode() if rank == 0 else None).decode()
        from singa_lite.comm.shm import ShmCommunicator
        impls["singa shm"] = ShmCommunicator(name, rank, P)
    if not args.no_tcp:  # the tcp backend on loopback: rank 0 serves the store, its port goes out over MPI
        from singa_lite.comm.store import TcpStore
        from singa_lite.comm.tcp import TcpCommunicator
        store = TcpStore("127.0.0.1", 0, P, is_server=True) if rank == 0 else None
        port = world.bcast(store.port if rank == 0 else None, root=0)
        store = store or TcpStore("127.0.0.1", port, P, is_server=False)
        impls["singa tcp"] = TcpCommunicator(store, rank, P, rank, P)
    if rank == 0:
        print(f"all-reduce, float32 sum, {P} ranks, {MPI.Get_library_version().splitlines()[0].strip()}; "
              f"medians of {args.repeat} interleaved blocks")
        print(f"{'bytes':>9s} " + " ".join(f"{k + ' us':>14s} {'busbw GB/s':>10s}" for k in impls)
              + "  " + " ".join(f"{'ratio ' + k.split()[1]:>10s}" for k in impls if k != "raw mpi4py")
              + f" {'check':>7s}")
    for size in map(parse_size, args.sizes):
        a = np.ones(size // 4, np.float32)
        t = _core.Tensor.from_buffer(a)  # every implementation reduces the same memory
        fns = {"raw mpi4py": lambda: world.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)}
        for k, c in impls.items():
            if c is not None:
                fns[k] = (lambda c=c: c.all_reduce(t))
        for fn in fns.values():  # warm up, then size the blocks from the raw call
            fn()
        once = time_block(fns["raw mpi4py"], 3, world)
        calls = int(world.bcast(max(1, min(10000, int(args.target / max(once, 1e-7)))), root=0))
        times = {k: [] for k in fns}
        for _ in range(args.repeat):
            for k, fn in fns.items():
                times[k].append(time_block(fn, calls, world))
        if rank == 0:
            med = {k: statistics.median(v) for k, v in times.items()}
            busbw = {k: size / m * 2 * (P - 1) / P / 1e9 for k, m in med.items()}
            ratios = [med["raw mpi4py"] / m for k, m in med.items() if k != "raw mpi4py"]
            print(f"{size:9d} " + " ".join(f"{1e6 * med[k]:14.1f} {busbw[k]:10.2f}" for k in med) + "  "
                  + " ".join(f"{r:10.2f}" for r in ratios)
                  + f" {100 * (med['singa mpi'] / med['singa nocheck'] - 1):+6.1f}%", flush=True)


if __name__ == "__main__":
    main()
