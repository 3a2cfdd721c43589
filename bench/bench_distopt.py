"""A data-parallel training step on P ranks: singa_lite's DistOpt against PyTorch DDP (gloo), same model,
same per-rank batch, same threads, in the same job. Run under mpiexec (which starts the ranks for both):

    mpiexec -n 2 python bench/bench_distopt.py                 # SINGA's MNIST CNN, batch 32 per rank
    mpiexec -n 2 python bench/bench_distopt.py --backend shm

One step = forward + loss + backward + gradient averaging + SGD (momentum 0.9) update. Blocks of steps
are interleaved (singa_lite variants, then torch, ...); rank 0 reports medians. ratio = singa time / torch
time (goal <= 0.8). Also timed: DistOpt without fusion (threshold=1: every tensor alone), without overlap
(the exchange starts after the whole backward pass), and with float16 on the wire; bytes on the wire per
step are reported for fp32 and fp16.

Overlap needs something idle to overlap with: on a machine whose cores all run ranks, the exchange costs
CPU time wherever it is placed. `--link-gbps` models a slower network instead (a cluster link rather than
shared memory): after each real all-reduce, the communication thread sleeps for the time a ring all-reduce
of that many bytes would take on such a link, 2 (P - 1) / P * bytes / bandwidth + 2 (P - 1) * latency,
using no core while it waits. The model applies to singa_lite only; torch's row is then not a peer.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--backend", choices=("mpi", "shm"), default="mpi", help="singa_lite's communicator")
    p.add_argument("--model", choices=("cnn", "mlp"), default="cnn",
                   help="cnn: SINGA's MNIST CNN (8 tensors); mlp: the DDP exercises' tanh MLP widened to 16 layers "
                        "of 256 (32 small tensors, where fusing them matters)")
    p.add_argument("--batch", type=int, default=32, help="batch per rank")
    p.add_argument("--steps", type=int, default=10, help="steps per timed block")
    p.add_argument("--repeat", type=int, default=7, help="timed blocks per variant")
    p.add_argument("--threads", type=int, default=None, help="threads per rank (default: cores / local ranks)")
    p.add_argument("--link-gbps", type=float, default=None,
                   help="model a network link of this many gigabits per second (see above; default: none)")
    p.add_argument("--link-latency-us", type=float, default=20.0, help="per-message latency of --link-gbps")
    return p.parse_args()


ARGS = parse_args()
from mpi4py import MPI  # noqa: E402

WORLD = MPI.COMM_WORLD
_local = WORLD.Split_type(MPI.COMM_TYPE_SHARED)
THREADS = ARGS.threads or max(1, (os.cpu_count() or 1) // _local.size)
for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(THREADS)

import numpy as np  # noqa: E402

try:
    import torch  # noqa: E402
    import torch.distributed as tdist  # noqa: E402
except ImportError:
    sys.exit("this benchmark compares against PyTorch DDP: pip install torch (CPU build)")

from singa_lite import autograd, device, dist, opt, tensor  # noqa: E402

from bench_models import SingaCNN, SingaMLP, torch_cnn, torch_mlp, torch_sgd_step  # noqa: E402

DEEP_MLP = (256,) * 16 + (10,)

device.set_num_threads(THREADS)
torch.set_num_threads(THREADS)


def model_slow_link(comm, gbps: float, latency_us: float) -> None:
    """After each all-reduce, sleep (in the communication thread, releasing the GIL) for what a ring
    all-reduce of the same payload would take on the modelled link."""
    real, P = comm._all_reduce, comm.world_size
    if gbps <= 0 or latency_us < 0:
        sys.exit("--link-gbps must be > 0 and --link-latency-us >= 0")

    def all_reduce_on_slow_link(t, op):
        real(t, op)
        time.sleep(2 * (P - 1) / P * t.nbytes * 8 / (gbps * 1e9) + 2 * (P - 1) * latency_us * 1e-6)
    comm._all_reduce = all_reduce_on_slow_link


def main():
    rank, P = WORLD.rank, WORLD.size
    rng = np.random.default_rng(rank)
    if ARGS.model == "cnn":
        x = rng.standard_normal((ARGS.batch, 1, 28, 28)).astype(np.float32)
        y = rng.integers(0, 10, ARGS.batch).astype(np.int32)
        singa_model, t_model = SingaCNN, torch_cnn(torch)
    else:
        x = rng.standard_normal((ARGS.batch, DEEP_MLP[0])).astype(np.float32)
        y = rng.integers(0, DEEP_MLP[-1], ARGS.batch).astype(np.int32)
        singa_model, t_model = (lambda: SingaMLP(DEEP_MLP)), torch_mlp(torch, DEEP_MLP)
    tx, ty = tensor.from_numpy(x), tensor.from_numpy(y)

    if ARGS.backend == "shm":
        name = dist.broadcast_bytes(dist.NcclIdHolder().shm_name.encode() if rank == 0 else None).decode()
        from singa_lite.comm.shm import ShmCommunicator
        comm = ShmCommunicator(name, rank, P)
    else:
        comm = dist.init(backend="mpi")
    if ARGS.link_gbps is not None:
        model_slow_link(comm, ARGS.link_gbps, ARGS.link_latency_us)
    autograd.training = True

    def singa_variant(method="backward_and_update", **kw):
        model = singa_model()
        dopt = opt.DistOpt(opt.SGD(lr=0.01, momentum=0.9), communicator=comm, overlap=kw.pop("overlap", True))

        def step():
            getattr(dopt, method)(autograd.softmax_cross_entropy(model.forward(tx), ty), **kw)
        return step, dopt

    variants = {
        "singa DistOpt": singa_variant(),
        "singa no fusion": singa_variant(threshold=1),
        "singa no overlap": singa_variant(overlap=False),
        "singa fp16": singa_variant("backward_and_update_half"),
    }

    port = WORLD.bcast(29500 + int(np.random.default_rng().integers(0, 2000)) if rank == 0 else None, root=0)
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=P)
    torch_step = torch_sgd_step(torch, torch.nn.parallel.DistributedDataParallel(t_model), x, y)

    steps = {k: v[0] for k, v in variants.items()}
    steps["torch DDP gloo"] = torch_step
    for fn in steps.values():
        for _ in range(3):
            fn()
    before = {k: v[1].bytes_sent for k, v in variants.items()}
    times = {k: [] for k in steps}
    for _ in range(ARGS.repeat):
        for k, fn in steps.items():
            WORLD.Barrier()
            t = time.perf_counter()
            for _ in range(ARGS.steps):
                fn()
            WORLD.Barrier()
            times[k].append((time.perf_counter() - t) / ARGS.steps)
    per_step = {k: (v[1].bytes_sent - before[k]) / (ARGS.repeat * ARGS.steps) for k, v in variants.items()}
    if rank == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        ref = med["torch DDP gloo"]
        what = "SINGA's MNIST CNN" if ARGS.model == "cnn" else f"a {len(DEEP_MLP) - 1}-layer tanh MLP"
        link = "" if ARGS.link_gbps is None else (f" over a modelled {ARGS.link_gbps:g} Gb/s, "
                                                   f"{ARGS.link_latency_us:g} us link (torch's row is not)")
        print(f"DistOpt step, {what}, batch {ARGS.batch} per rank, {P} ranks x {THREADS} threads, "
              f"singa_lite {comm.backend} backend{link} vs PyTorch {torch.__version__} DDP gloo; medians of "
              f"{ARGS.repeat} interleaved blocks of {ARGS.steps} steps")
        print(f"{'variant':18s} {'ms/step':>8s} {'vs torch':>9s} {'bytes sent/step':>16s}")
        for k, m in med.items():
            sent = f"{per_step[k]:16.0f}" if k in per_step else f"{'':16s}"
            print(f"{k:18s} {1e3 * m:8.2f} {m / ref:9.2f} {sent}")
    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
