"""Soak test of DistOpt: many training steps on 2 ranks, watching for leaks. After a warm-up, resident memory
must grow by less than 1 %, and the open file descriptors and shared-memory segments of every rank must stay
the same; after the job, no segment may be left in /dev/shm. Exits 1 when any of that fails.

    python bench/soak_distopt.py --backend shm               # starts 2 ranks itself (multiprocessing + holder)
    python bench/soak_distopt.py --backend mpi               # starts mpiexec -n 2 itself
    mpiexec -n 2 python bench/soak_distopt.py --backend mpi  # or under a launcher (no after-job check then)
    singa-run -np 2 bench/soak_distopt.py --backend shm

--mode all cycles plain, half, partial and sparse (top-k and threshold) step by step; a single mode runs only
that one. The model is a small MLP, so that 10,000 steps take a few minutes. Every --every steps a rank samples
its resident set (/proc/self/statm), its open fds (/proc/self/fd) and the shared-memory segments it holds
(distinct /dev/shm files it maps or has open: its own, not those of other jobs on the machine). Rank 0 prints
one row per rank: RSS at the end of the warm-up and at the end, growth, maximum; fds and segments first
(warm-up end), last and maximum.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

MODES = ("plain", "half", "partial", "sparse-topk", "sparse-threshold")
SHM_DIR = "/dev/shm"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--backend", choices=("shm", "mpi"), default="shm")
    p.add_argument("--mode", choices=("all", "plain", "half", "partial", "sparse"), default="all",
                   help="DistOpt step (sparse: top-k and threshold in turn; all: every mode in turn)")
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--warmup", type=int, default=1000, help="steps before the reference sample")
    p.add_argument("--every", type=int, default=100, help="sample every this many steps")
    p.add_argument("--world-size", type=int, default=2, help="ranks, when this script starts them")
    p.add_argument("--max-growth", type=float, default=1.0, help="largest allowed RSS growth after warm-up, %%")
    p.add_argument("--batch", type=int, default=32, help="per rank")
    args = p.parse_args(argv)
    if not 0 <= args.warmup < args.steps or args.every < 1 or args.world_size < 1:
        p.error("need 0 <= --warmup < --steps, --every >= 1 and --world-size >= 1")
    return args


# ---------------------------------------------------------------- what a rank samples
def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir itself holds open


def shm_segments() -> set:
    """The /dev/shm files this process maps or holds open (including unlinked ones: "(deleted)")."""
    held = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith(SHM_DIR + "/"):
                held.add(parts[5].rstrip())
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(SHM_DIR + "/"):
            held.add(target)
    return held


def shm_listing() -> set:
    return {n for n in os.listdir(SHM_DIR) if n.startswith(("singa_lite", "mpich", "sem.singa_lite"))}


# ---------------------------------------------------------------- one rank
def soak(comm, args) -> bool:
    """Trains for args.steps steps on this rank; rank 0 prints the table. True when every check held."""
    import numpy as np

    from singa_lite import autograd, device, opt, tensor

    device.set_num_threads(max(1, (os.cpu_count() or 1) // comm.local_size))
    rank = comm.rank
    sizes = (64, 128, 128, 10)
    dev = device.get_default_device()
    dev.SetRandSeed(0)
    layers = [autograd.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])]

    def forward(x):
        for layer in layers[:-1]:
            x = autograd.relu(layer(x))
        return layers[-1](x)

    # A small fusion threshold: every step sends several buckets, as a larger model would.
    dopt = opt.DistOpt(opt.SGD(lr=0.01, momentum=0.9), communicator=comm)
    rng = np.random.default_rng(rank)
    xs = rng.standard_normal((16, args.batch, sizes[0])).astype(np.float32)
    ys = rng.integers(0, sizes[-1], (16, args.batch)).astype(np.int32)
    modes = MODES if args.mode == "all" else [m for m in MODES if m.startswith(args.mode)]
    autograd.training = True

    samples = []  # (step, rss, fds, segments)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        out = forward(tensor.from_numpy(xs[step % 16]))
        loss = autograd.softmax_cross_entropy(out, tensor.from_numpy(ys[step % 16]))
        mode = modes[step % len(modes)]
        if mode == "plain":
            dopt.backward_and_update(loss, threshold=4096)
        elif mode == "half":
            dopt.backward_and_update_half(loss, threshold=4096)
        elif mode == "partial":
            dopt.backward_and_partial_update(loss, threshold=4096)
        else:
            dopt.backward_and_sparse_update(loss, threshold=4096, spars=0.05 if mode == "sparse-topk" else 0.01,
                                            topK=mode == "sparse-topk", corr=True)
        loss.item()
        if step >= args.warmup and (step - args.warmup) % args.every == 0 or step == args.steps:
            samples.append((step, rss_bytes(), open_fds(), sorted(shm_segments())))
    elapsed = time.perf_counter() - start
    dopt.wait()

    rows = comm.all_gather_object({"rank": rank, "samples": samples, "seconds": elapsed,
                                   "loss": float(loss.item())})
    ok = True
    if rank == 0:
        print(f"DistOpt soak: {comm.world_size} ranks, {comm.backend} backend, modes {', '.join(modes)}, "
              f"{args.steps} steps ({args.warmup} warm-up), MLP {sizes}, batch {args.batch} per rank, "
              f"{elapsed:.1f} s ({1e3 * elapsed / args.steps:.2f} ms/step)")
        print(f"{'rank':>4} {'RSS warm MiB':>12} {'RSS end MiB':>11} {'growth %':>8} {'RSS max MiB':>11} "
              f"{'fds first/last/max':>18} {'shm first/last/max':>18}  result")
    for row in rows:
        s = row["samples"]
        rss = [x[1] for x in s]
        fds = [x[2] for x in s]
        segs = [len(x[3]) for x in s]
        growth = 100.0 * (rss[-1] - rss[0]) / rss[0]
        problems = []
        if growth >= args.max_growth:
            problems.append(f"RSS grew {growth:.2f} %")
        if len(set(fds)) > 1:
            problems.append(f"fds changed: {sorted(set(fds))}")
        if len({tuple(x[3]) for x in s}) > 1:
            problems.append(f"segments changed: {s[0][3]} -> {s[-1][3]}")
        ok = ok and not problems
        if rank == 0:
            mib = 1 << 20
            print(f"{row['rank']:>4} {rss[0] / mib:>12.1f} {rss[-1] / mib:>11.1f} {growth:>8.2f} "
                  f"{max(rss) / mib:>11.1f} {f'{fds[0]}/{fds[-1]}/{max(fds)}':>18} "
                  f"{f'{segs[0]}/{segs[-1]}/{max(segs)}':>18}  {'; '.join(problems) or 'ok'}", flush=True)
    comm.barrier()
    return ok


# ---------------------------------------------------------------- launchers
def _mp_rank(args, holder, rank, world_size):
    from singa_lite import dist

    comm = dist.init(backend="shm", holder=holder, rank=rank, world_size=world_size)
    ok = soak(comm, args)
    comm.close()
    sys.exit(0 if ok else 1)


def start_ranks(args) -> int:
    """Starts the ranks (shm: multiprocessing sharing a holder; mpi: mpiexec), waits, then checks that the
    job left nothing in /dev/shm. Returns the exit code."""
    before = shm_listing()
    if args.backend == "shm":
        import multiprocessing as mp

        from singa_lite import dist

        ctx = mp.get_context("spawn")
        holder = dist.NcclIdHolder()
        procs = [ctx.Process(target=_mp_rank, args=(args, holder, r, args.world_size))
                 for r in range(args.world_size)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        codes = [p.exitcode for p in procs]
    else:
        here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        mpiexec = here if os.path.exists(here) else shutil.which("mpiexec")
        if mpiexec is None:
            sys.exit("no mpiexec: pip install 'singa_lite[mpi]' (the MPICH wheel provides one)")
        codes = [subprocess.call([mpiexec, "-n", str(args.world_size), sys.executable, os.path.abspath(__file__),
                                  *sys.argv[1:]])]
    time.sleep(0.5)  # MPICH's process manager removes its segments as its last act
    left = sorted(shm_listing() - before)
    print(f"after the job: rank exit codes {codes}; segments left in {SHM_DIR}: {left or 'none'}")
    return 0 if all(c == 0 for c in codes) and not left else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    from singa_lite import dist

    if dist.launched_by_singa_run() or dist.launched_by_mpiexec():
        comm = dist.init(backend=args.backend)
        ok = soak(comm, args)
        comm.close()
        return 0 if ok else 1
    return start_ranks(args)


if __name__ == "__main__":
    sys.exit(main())
