"""The cost of the replica check (singa_lite.parallel.replica_check) against a data-parallel training step of
the same model, on P ranks started here (multiprocessing, one host):

    python bench/bench_replica_check.py                       # SINGA's MNIST CNN, 2 ranks, shm, batch 32
    python bench/bench_replica_check.py --backend tcp --model mlp

One step = forward + loss + backward + DistOpt's gradient averaging + SGD (momentum 0.9) update. One check =
check_replicas(comm, model, sgd): blake2b over every parameter and momentum buffer, one all-gather of a
16-byte digest (replicas agree, so nothing more). Blocks of `--steps` steps and single checks are
interleaved, `--repeat` times, each timed between barriers; rank 0 reports the medians of the slowest rank's
times, and the cost the check adds per step at `--every` N: check / (N x step) (goal: <= 1 % at N = 100).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--world-size", type=int, default=2, help="ranks")
    p.add_argument("--backend", choices=("shm", "tcp"), default="shm", help="the communicator")
    p.add_argument("--model", choices=("cnn", "mlp"), default="cnn",
                   help="cnn: SINGA's MNIST CNN (431k parameters); mlp: the DDP exercises' tanh MLP (400k)")
    p.add_argument("--batch", type=int, default=32, help="batch per rank")
    p.add_argument("--steps", type=int, default=10, help="steps per timed block")
    p.add_argument("--repeat", type=int, default=9, help="timed blocks (and checks)")
    p.add_argument("--every", type=int, default=100, help="N: a check every N steps")
    p.add_argument("--json", default=None, help="also write the results to this file")
    return p.parse_args(argv)


def rank_main(rank, args, holder, port, queue):
    import numpy as np

    sys.path.insert(0, HERE)
    import bench_ranks
    from bench_models import SingaCNN, SingaMLP
    from singa_lite import autograd, opt, tensor
    from singa_lite.parallel.replica_check import check_replicas

    comm, store = bench_ranks.join(args.backend, holder, port, rank, args.world_size)
    rng = np.random.default_rng(rank)
    if args.model == "cnn":
        model, x = SingaCNN(), rng.standard_normal((args.batch, 1, 28, 28)).astype(np.float32)
    else:
        model, x = SingaMLP(), rng.standard_normal((args.batch, 1024)).astype(np.float32)
    y = tensor.from_numpy(np.eye(10 if args.model == "cnn" else 32, dtype=np.float32)[rng.integers(0, 10, args.batch)])
    sgd = opt.DistOpt(opt.SGD(lr=0.01, momentum=0.9), communicator=comm)
    tx = tensor.from_numpy(x)

    def step():
        autograd.training = True
        sgd(autograd.softmax_cross_entropy(model.forward(tx), y))

    def slowest(seconds):  # the step or check is as slow as its slowest rank
        return float(np.max(tensor.to_numpy(comm.all_gather(tensor.from_numpy(np.array([seconds]))))))

    for _ in range(3):  # warm-up: first-step broadcast, buffers, momentum created
        step()
    check_replicas(comm, model, sgd)
    steps, checks = [], []
    for _ in range(args.repeat):
        comm.barrier()
        t = time.perf_counter()
        for _ in range(args.steps):
            step()
        steps.append(slowest((time.perf_counter() - t) / args.steps))
        comm.barrier()
        t = time.perf_counter()
        check_replicas(comm, model, sgd)
        checks.append(slowest(time.perf_counter() - t))
    n_params = sum(p.size() for p in (sgd.opt.moments.values()))
    if rank == 0:
        queue.put({"steps": steps, "checks": checks, "parameters": int(n_params)})
    comm.barrier()
    comm.close()
    if store is not None:
        store.close()


def main(argv=None) -> int:
    args = parse_args(argv)
    from singa_lite import dist

    holder = dist.NcclIdHolder() if args.backend == "shm" else None
    server, port = None, 0
    if args.backend == "tcp":
        from singa_lite.comm.store import TcpStore
        server = TcpStore("127.0.0.1", 0, args.world_size, is_server=True, timeout=60)
        port = server.port
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, args, holder, port, queue)) for r in range(args.world_size)]
    for p in procs:
        p.start()
    try:
        result = queue.get(timeout=1800)
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
        if server is not None:
            server.close()
    step, check = statistics.median(result["steps"]), statistics.median(result["checks"])
    ratio = check / (args.every * step)
    summary = {"model": args.model, "backend": args.backend, "world_size": args.world_size, "batch": args.batch,
               "parameters": result["parameters"], "step_ms": step * 1e3, "check_ms": check * 1e3,
               "every": args.every, "cost_per_step": ratio, "steps_ms": [s * 1e3 for s in result["steps"]],
               "checks_ms": [c * 1e3 for c in result["checks"]]}
    print(f"{args.model} on {args.world_size} ranks ({args.backend}), {result['parameters']} parameters "
          f"(+ as many momentum values): step {step * 1e3:.2f} ms, check {check * 1e3:.2f} ms (medians of "
          f"{args.repeat}); at N = {args.every}: {100 * ratio:.3f} % of a step")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
