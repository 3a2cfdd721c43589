"""Distributed matrix multiply C = A @ B with singa_lite's collectives, two ways (the DDP exercises, exercise 2).

    python examples/dist_matmul.py --world-size 3                    # multiprocessing, shm backend
    mpiexec -n 2 python examples/dist_matmul.py --launcher mpi       # MPI (mpi backend)
    python examples/dist_matmul.py --world-size 4 --m 1000 --k 777 --n 300 --dtype float64

partition-by-row:        rank 0 scatters A's rows and broadcasts B; every rank computes its rows
                         A_r @ B; rank 0 gathers the rows of C.
partition-by-reduction:  rank 0 scatters A's columns and B's rows; every rank computes the partial
                         product A[:, K_r] @ B[K_r, :], shape (m, n); all_reduce("sum") gives every rank C.

Sizes that the world size does not divide are padded with zeros (collectives move equal blocks): A gets
zero rows up to the next multiple of the world size (their rows of C are zero and dropped after the
gather), or A zero columns and B zero rows (they add nothing to the sum). At most world_size - 1 rows or
columns are padded. Rank 0 checks both results against the single-process product A @ B: it prints the
largest absolute difference and fails when an entry differs by more than the rounding bound of a float
sum of k + world_size terms, (k + world_size) * eps * (|A| @ |B|), and prints the times (best of --repeat,
each between two barriers).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dist_training import LAUNCHERS, launch  # noqa: E402

from singa_lite import device, dist, tensor  # noqa: E402

DTYPES = ("float32", "float64")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--launcher", choices=LAUNCHERS, default="multiprocessing",
                   help="mpi: the script was started by mpiexec; multiprocessing: it starts --world-size ranks")
    p.add_argument("--world-size", type=int, default=2, help="ranks to start (multiprocessing launcher)")
    p.add_argument("--start-method", choices=("auto", "fork", "spawn"), default="auto",
                   help="how the multiprocessing launcher starts ranks (auto: fork; the ranks use the CPU)")
    p.add_argument("--m", type=int, default=512, help="rows of A and C")
    p.add_argument("--k", type=int, default=384, help="columns of A, rows of B (the reduction axis)")
    p.add_argument("--n", type=int, default=256, help="columns of B and C")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--repeat", type=int, default=3, help="runs of each strategy; the best time is printed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="threads per rank (default: cores / ranks on this host)")
    args = p.parse_args(argv)
    if min(args.world_size, args.m, args.k, args.n, args.repeat) < 1:
        p.error("--world-size, --m, --k, --n and --repeat must be >= 1")
    return args


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def zero_padded(t: tensor.Tensor, shape) -> tensor.Tensor:
    """t in the top-left corner of a zero tensor of `shape` (t itself when it has that shape)."""
    if tuple(t.shape) == tuple(shape):
        return t
    out = tensor.zeros(shape, dtype=t.dtype)
    out[:t.shape[0], :t.shape[1]] = t
    return out


def by_row(comm, A, B, m: int, k: int, n: int, dtype):
    """The DDP exercises' partition-by-row. A and B hold the data on rank 0 (placeholders elsewhere); returns C on
    rank 0, None on the other ranks."""
    world = comm.world_size
    rows = round_up(m, world)
    # scatter and broadcast need the same shape on every rank; only rank 0's values are sent
    A_rows = zero_padded(A, (rows, k)) if comm.rank == 0 else tensor.zeros((rows, k), dtype=dtype)
    A_r = comm.scatter(A_rows)  # (rows / world, k)
    comm.broadcast(B)
    C_r = tensor.matmul(A_r, B)  # (rows / world, n)
    C = comm.gather(C_r)  # rank 0: (world, rows / world, n)
    return None if C is None else C.reshape((rows, n))[:m]


def by_reduction(comm, A, B, m: int, k: int, n: int, dtype):
    """The DDP exercises' partition-by-reduction: returns C on every rank."""
    world = comm.world_size
    kp = round_up(k, world)
    if comm.rank == 0:
        # column block r of A becomes row block r, so that scatter (which splits the first axis) sends it
        A_cols = tensor.concatenate(tensor.split(zero_padded(A, (m, kp)), world, axis=1), axis=0)
        B_rows = zero_padded(B, (kp, n))
    else:
        A_cols = tensor.zeros((world * m, kp // world), dtype=dtype)
        B_rows = tensor.zeros((kp, n), dtype=dtype)
    A_r = comm.scatter(A_cols)  # (m, kp / world): A[:, K_r]
    B_r = comm.scatter(B_rows)  # (kp / world, n): B[K_r, :]
    C = tensor.matmul(A_r, B_r)  # this rank's partial sum, (m, n)
    comm.all_reduce(C, op="sum")
    return C


def timed(comm, fn, repeat: int):
    """(result of the last run, best wall time in seconds); each run starts and ends with a barrier."""
    best, result = float("inf"), None
    for _ in range(repeat):
        comm.barrier()
        start = time.perf_counter()
        result = fn()
        comm.barrier()
        best = min(best, time.perf_counter() - start)
    return result, best


def check(name: str, C, ref: np.ndarray, bound: np.ndarray, seconds: float) -> bool:
    if tuple(C.shape) != ref.shape:
        print(f"{name:24s} MISMATCH: C has shape {tuple(C.shape)}, expected {ref.shape}", flush=True)
        return False
    err = np.abs(tensor.to_numpy(C).astype(np.float64) - ref)
    ok = bool((err <= bound).all())
    print(f"{name:24s} max abs error {err.max():.3e} (bound {bound.max():.3e})  "
          f"{1e3 * seconds:8.2f} ms  {'ok' if ok else 'MISMATCH'}", flush=True)
    return ok


def run(args, holder=None, rank=None, world_size=None) -> bool:
    """One rank: both strategies, checked on rank 0. Returns False on rank 0 when a result is wrong."""
    comm = dist.init(holder=holder, rank=rank, world_size=world_size)
    threads = args.threads or max(1, (os.cpu_count() or 1) // comm.local_size)  # ranks on this host share it
    device.set_num_threads(threads)
    m, k, n, dtype = args.m, args.k, args.n, tensor.to_dtype(args.dtype)
    world = comm.world_size
    if comm.rank == 0:
        rng = np.random.default_rng(args.seed)
        A = tensor.from_numpy(rng.uniform(-1, 1, (m, k)).astype(args.dtype))
        B = tensor.from_numpy(rng.uniform(-1, 1, (k, n)).astype(args.dtype))
        print(f"C = A @ B, A {m}x{k}, B {k}x{n}, {args.dtype}; {world} ranks ({comm.backend} backend, "
              f"{threads} threads each)", flush=True)
        pad_m, pad_k = round_up(m, world) - m, round_up(k, world) - k
        if pad_m or pad_k:
            print(f"uneven split: zero padding of {pad_m} row(s) of A for partition-by-row, {pad_k} column(s) "
                  f"of A and row(s) of B for partition-by-reduction", flush=True)
    else:
        A = None
        B = tensor.zeros((k, n), dtype=dtype)  # filled by the broadcast

    C_row, t_row = timed(comm, lambda: by_row(comm, A, B, m, k, n, dtype), args.repeat)
    C_red, t_red = timed(comm, lambda: by_reduction(comm, A, B, m, k, n, dtype), args.repeat)
    ok = True
    if comm.rank == 0:
        start = time.perf_counter()
        C_ref = tensor.matmul(A, B)  # the single-process product
        t_ref = time.perf_counter() - start
        ref = tensor.to_numpy(C_ref).astype(np.float64)
        # rounding error bound of a float sum of k + world terms (any order), relative to |A| @ |B|
        eps = np.finfo(args.dtype).eps
        bound = (k + world) * eps * (np.abs(tensor.to_numpy(A)).astype(np.float64)
                                     @ np.abs(tensor.to_numpy(B)).astype(np.float64))
        ok = check("partition-by-row", C_row, ref, bound, t_row)
        ok = check("partition-by-reduction", C_red, ref, bound, t_red) and ok
        print(f"{'single process':24s} {'':46s}{1e3 * t_ref:8.2f} ms", flush=True)
        print("both strategies match the single-process product" if ok else
              "MISMATCH: a distributed result differs from the single-process product", flush=True)
    comm.close()
    return ok


def _rank_main(args, holder=None, rank=None, world_size=None) -> None:
    if not run(args, holder, rank, world_size):
        sys.exit(1)


def main(argv=None) -> int:
    return launch(parse_args(argv), _rank_main)


if __name__ == "__main__":
    sys.exit(main())
