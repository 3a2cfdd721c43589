"""ZeRO sharding (DistOpt(zero_stage=0|1|2), singa_lite/parallel/zero.py) on an MLP of about 50 M parameters
with Adam, P ranks of the shm backend started by multiprocessing. For each stage: the optimizer state each rank
holds (DistOpt.memory_report()), its ratio to stage 0's / P, the peak RSS of each rank's process, and the step
time (forward + backward + exchange + update + the parameters' broadcast), with its ratio to stage 0's measured
in the same run. Peak RSS is over the whole run; the high-water mark after the two untimed steps (Linux's
VmHWM, reset then through /proc/self/clear_refs) is the steady state's: a first step holds every gradient at
every stage (its exchange waits for the whole backward pass). Each stage runs in fresh processes (a process's
peak RSS only grows); stages run in the order of --order (stage 0 at both ends by default, so that a drift of
the machine's load shows), and a stage run twice reports the median of its runs' medians.

    python bench/bench_zero.py                       # 2 ranks, 12 layers of 2048 x 2048 (50.4 M parameters)
    python bench/bench_zero.py --ranks 3 --steps 4
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
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--layers", type=int, default=12, help="linear layers of width x width")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--batch", type=int, default=16, help="batch per rank")
    p.add_argument("--steps", type=int, default=5, help="timed steps per run (after 2 untimed ones)")
    p.add_argument("--order", default="0,1,2,0", help="the stages, in the order run")
    p.add_argument("--threads", type=int, default=1, help="threads per rank")
    return p.parse_args()


def rank_main(rank, holder, world, stage, a, out):
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    import resource

    import numpy as np

    from singa_lite import autograd, dist, opt, tensor

    comm = dist.init(backend="shm", holder=holder, rank=rank, world_size=world, timeout=600)
    rng = np.random.default_rng(0)
    params = {}
    for i in range(a.layers):
        w = (rng.standard_normal((a.width, a.width), dtype=np.float32) / np.sqrt(a.width)).astype(np.float32)
        params[f"W{i}"] = tensor.Tensor(data=w, requires_grad=True, stores_grad=True, name=f"W{i}")
        params[f"b{i}"] = tensor.Tensor(data=np.zeros(a.width, np.float32), requires_grad=True, stores_grad=True,
                                        name=f"b{i}")
    d = opt.DistOpt(opt.Adam(lr=1e-4), communicator=comm, zero_stage=stage)
    autograd.training = True
    times = []
    for step in range(a.steps + 2):
        x = tensor.from_numpy(rng.standard_normal((a.batch, a.width), dtype=np.float32))
        y = tensor.from_numpy(rng.integers(0, a.width, a.batch).astype(np.int32))
        comm.barrier()
        t0 = time.perf_counter()
        h = x
        for i in range(a.layers):
            h = autograd.add_bias(autograd.matmul(h, params[f"W{i}"]), params[f"b{i}"])
            if i < a.layers - 1:
                h = autograd.relu(h)
        d.backward_and_update(autograd.softmax_cross_entropy(h, y))
        comm.barrier()
        if step >= 2:
            times.append(time.perf_counter() - t0)
        if step == 1:  # the steady state's high-water mark from here (the first step holds every gradient)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
    report = d.memory_report()
    n = sum(p.size() for p in params.values())
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    out.put((rank, {"report": report, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "hwm": hwm,
                    "median": statistics.median(times), "params": n}))
    comm.close()


def run_stage(stage, a):
    import multiprocessing as mp

    from singa_lite import dist

    ctx = mp.get_context("spawn")
    holder, out = dist.NcclIdHolder(), ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, holder, a.ranks, stage, a, out)) for r in range(a.ranks)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=3600) for _ in procs)
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            sys.exit(f"stage {stage}: rank process ended with {p.exitcode}")
    return [results[r] for r in range(a.ranks)]


def main():
    a = parse_args()
    order = [int(s) for s in a.order.split(",")]
    runs = {}
    for stage in order:
        t0 = time.time()
        runs.setdefault(stage, []).append(run_stage(stage, a))
        print(f"# stage {stage} run done in {time.time() - t0:.0f} s", flush=True)
    mib = 1 << 20
    first = runs[order[0]][0][0]
    print(f"MLP: {a.layers} layers of {a.width} x {a.width}, {first['params'] / 1e6:.1f} M parameters "
          f"({first['report']['parameters'] / mib:.0f} MiB), Adam, {a.ranks} ranks (shm), batch {a.batch} per "
          f"rank, {a.threads} thread(s) per rank, {a.steps} timed steps per run; order {a.order}")
    base = runs[0]
    base_state = max(r["report"]["optimizer_state"] for r in base[0])
    base_time = statistics.median(statistics.median(r["median"] for r in run) for run in base)
    print("| stage | optimizer state per rank (MiB) | / (stage 0's / P) | gradients kept (MiB) | comm buffers (MiB) "
          "| peak RSS per rank (MiB) | RSS high-water after step 2 (MiB) | step (s, median) | / stage 0 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for stage in sorted(runs):
        last = runs[stage][-1]
        states = [r["report"]["optimizer_state"] for r in last]
        step = statistics.median(statistics.median(r["median"] for r in run) for run in runs[stage])
        rss = [max(run[k]["rss"] for run in runs[stage]) for k in range(a.ranks)]
        hwm = [max(run[k]["hwm"] for run in runs[stage]) for k in range(a.ranks)]
        print(f"| {stage} | {' / '.join(f'{s / mib:.0f}' for s in states)} | "
              f"{max(states) / (base_state / a.ranks):.2f} | "
              f"{' / '.join(str(r['report']['gradients'] // mib) for r in last)} | "
              f"{' / '.join(str(r['report']['communication_buffers'] // mib) for r in last)} | "
              f"{' / '.join(f'{x / mib:.0f}' for x in rss)} | {' / '.join(f'{x / mib:.0f}' for x in hwm)} | "
              f"{step:.3f} | {step / base_time:.2f} |")
    for stage in sorted(runs):
        print(f"stage {stage} step medians per run: "
              + ", ".join(f"{statistics.median(r['median'] for r in run):.3f}" for run in runs[stage]))


if __name__ == "__main__":
    main()
