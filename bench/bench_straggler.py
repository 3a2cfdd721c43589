"""The cost of the straggler report (comm/straggler.py, parallel/step_stats.py) against a data-parallel training
step, on P ranks started here (multiprocessing, one host):

    python bench/bench_straggler.py                          # SINGA's MNIST CNN, 2 ranks, shm, batch 32
    python bench/bench_straggler.py --model tiny             # a step of about a millisecond: the worst case
    python bench/bench_straggler.py --backend tcp --model mlp
    python bench/bench_straggler.py --world-size 1 --model tiny   # the bookkeeping alone, without a peer
    python bench/bench_straggler.py --micro                        # a collective with and without its log

One step = forward + loss + backward + DistOpt's gradient averaging + SGD (momentum 0.9) update. Three ways of
running the same DistOpt, in blocks of `--steps` steps interleaved `--repeat` times (the order rotating), each
block timed between barriers:

- off: no step phases timed, no collective timed (``step_stats=False``, no arrival log on the communicator);
- off again: the same, a second time: how far two identical blocks of a round differ here (the noise floor);
- on: the phases of every step and the duration of every collective recorded (DistOpt's default);
- report: the same, and every `--every` steps the ranks compare them (one all-gather) as ``report_every=N`` /
  ``singa-run --report N`` do (rank 0 prints each table, to /dev/null here).

Rank 0 reports the medians of the slowest rank's step times, the median over the rounds of each round's ratio to
"off" (the modes of a round ran one after the other, so the machine's slower and faster spells cancel: short
blocks, many rounds), the median time of one report's gather, and the cost of a report every `--at` steps: the
"on" ratio plus the report mode's excess over it scaled from N = `--every` (goal: <= 1 % of a step at N = 100,
singa-run --report's default).
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
MODES = ("off", "off again", "on", "report")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--world-size", type=int, default=2, help="ranks")
    p.add_argument("--backend", choices=("shm", "tcp"), default="shm", help="the communicator")
    p.add_argument("--model", choices=("cnn", "mlp", "tiny"), default="cnn",
                   help="cnn: SINGA's MNIST CNN (431k parameters); mlp: the DDP exercises' tanh MLP (400k); tiny: "
                        "16-32-4 linear layers (the cost against a step of about a millisecond)")
    p.add_argument("--batch", type=int, default=32, help="batch per rank")
    p.add_argument("--steps", type=int, default=None, help="steps per timed block (default: --every, so that each "
                   "block of the report mode holds one report)")
    p.add_argument("--at", type=int, default=100, help="also give the cost of a report every this many steps, from "
                   "the measured one every --every")
    p.add_argument("--repeat", type=int, default=60, help="rounds: timed blocks of each mode")
    p.add_argument("--every", type=int, default=10, help="N: the report mode compares the ranks every N steps")
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("--micro", action="store_true", help="time the pieces alone in this process instead: a "
                   "collective with and without an arrival log, one clock charge")
    args = p.parse_args(argv)
    if args.steps is None:
        args.steps = args.every
    return args


def rank_main(rank, args, holder, port, queue):
    import numpy as np

    sys.path.insert(0, HERE)
    import bench_ranks
    from bench_models import SingaCNN, SingaMLP
    from singa_lite import autograd, layer, opt, tensor
    from singa_lite.comm import arrivals

    comm, store = bench_ranks.join(args.backend, holder, port, rank, args.world_size)
    rng = np.random.default_rng(rank)
    classes = 10
    if args.model == "cnn":
        model, x = SingaCNN(), rng.standard_normal((args.batch, 1, 28, 28)).astype(np.float32)
        forward = model.forward
    elif args.model == "mlp":
        model, x = SingaMLP(), rng.standard_normal((args.batch, 1024)).astype(np.float32)
        forward, classes = model.forward, 32
    else:
        l1, act, l2 = layer.Linear(32), layer.ReLU(), layer.Linear(4)
        x, classes = rng.standard_normal((args.batch, 16)).astype(np.float32), 4

        def forward(t):
            return l2(act(l1(t)))
    y = tensor.from_numpy(np.eye(classes, dtype=np.float32)[rng.integers(0, classes, args.batch)])
    sgd = opt.DistOpt(opt.SGD(lr=0.01, momentum=0.9), communicator=comm)
    stats, log = sgd.reducer.stats, comm.arrivals
    tx = tensor.from_numpy(x)
    gathers = []  # seconds of each report's gather (and tables), timed inside the report mode's blocks
    gather = stats.gather

    def timed_gather(*a, **k):
        t = time.perf_counter()
        try:
            return gather(*a, **k)
        finally:
            gathers.append(time.perf_counter() - t)
    stats.gather = timed_gather

    def step():
        autograd.training = True
        sgd(autograd.softmax_cross_entropy(forward(tx), y))

    def mode(name):
        on = not name.startswith("off")
        sgd.reducer.stats, comm.arrivals = (stats, log) if on else (None, None)
        stats.every = args.every if name == "report" else None
        if on and stats.cursor is not None:
            stats.cursor = None  # the time of other modes' blocks is nobody's step: the clock starts again
            stats.step_over(completed=False)

    def slowest(seconds):  # a block is as slow as its slowest rank
        return float(np.max(tensor.to_numpy(comm.all_gather(tensor.from_numpy(np.array([seconds]))))))

    assert isinstance(log, arrivals.ArrivalLog)
    for name in MODES:  # warm-up: first-step broadcast, buffers, momentum created
        mode(name)
        for _ in range(3):
            step()
    times = {m: [] for m in MODES}
    for i in range(args.repeat):
        for k in range(len(MODES)):
            name = MODES[(i + k) % len(MODES)]
            mode(name)
            comm.barrier()
            t = time.perf_counter()
            for _ in range(args.steps):
                step()
            times[name].append(slowest((time.perf_counter() - t) / args.steps))
    mode("report")
    reports = stats.reports
    worst = slowest(statistics.median(gathers)) if gathers else 0.0
    if rank == 0:
        queue.put({"times": times, "reports": reports, "gather": worst})
    comm.barrier()
    comm.close()
    if store is not None:
        store.close()


def micro(repeat: int) -> None:
    """The pieces alone, in this process (a tcp world of one rank): a small all_reduce, in line and asynchronous,
    with and without an arrival log, interleaved; one StepStats.charge."""
    import numpy as np

    from singa_lite import dist, tensor
    from singa_lite.comm import arrivals

    comm = dist.init(backend="tcp", timeout=60)
    t = tensor.from_numpy(np.ones(100, np.float32))
    log = arrivals.ArrivalLog()

    def block(n, asynchronous):
        t0 = time.perf_counter()
        for _ in range(n):
            if asynchronous:
                comm.all_reduce(t, async_op=True).wait()
            else:
                comm.all_reduce(t)
        return (time.perf_counter() - t0) / n

    for asynchronous in (False, True):
        off, on = [], []
        for _ in range(repeat):
            comm.arrivals = None
            off.append(block(1000, asynchronous))
            comm.arrivals = log
            on.append(block(1000, asynchronous))
            log.taken(log.first + len(log.durations))
        comm.arrivals = None
        extra = statistics.median(b - a for a, b in zip(off, on))
        print(f"all_reduce of 100 floats, {'asynchronous' if asynchronous else 'in line'}: "
              f"{statistics.median(off) * 1e6:.2f} us without a log, {extra * 1e6:+.2f} us with one (median of "
              f"{repeat} rounds' differences)")
    from singa_lite.parallel.step_stats import FORWARD, StepStats

    stats = StepStats(comm)
    stats.step_over()  # the clock starts
    n = 100000
    t0 = time.perf_counter()
    for _ in range(n):
        stats.charge(FORWARD)
    print(f"StepStats.charge: {(time.perf_counter() - t0) / n * 1e6:.3f} us a call (5 calls a step)")
    comm.close()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.micro:
        micro(args.repeat)
        return 0
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
    stderr = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # the report mode's tables (the ranks inherit this stderr)
    try:
        for p in procs:
            p.start()
    finally:
        os.dup2(stderr, 2)
    try:
        result = queue.get(timeout=1800)
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
        if server is not None:
            server.close()
    med = {m: statistics.median(result["times"][m]) for m in MODES}
    # each round's modes ran one after the other: their ratios cancel the machine's slower and faster spells
    ratio = {m: statistics.median(t / o for t, o in zip(result["times"][m], result["times"]["off"])) for m in MODES}
    extra = {m: statistics.median(t - o for t, o in zip(result["times"][m], result["times"]["off"])) for m in MODES}
    # a report every `at` steps: the bookkeeping of every step, plus the report's part spread over `at` steps
    at = (ratio["on"] - 1) + (ratio["report"] - ratio["on"]) * args.every / args.at
    summary = {"model": args.model, "backend": args.backend, "world_size": args.world_size, "batch": args.batch,
               "steps": args.steps, "repeat": args.repeat, "every": args.every, "reports": result["reports"],
               "gather_ms": result["gather"] * 1e3, "at": args.at, "cost_at": at,
               **{f"{m.replace(' ', '_')}_ms": med[m] * 1e3 for m in MODES},
               **{f"{m.replace(' ', '_')}_ratio": ratio[m] for m in MODES if m != "off"},
               **{f"{m.replace(' ', '_')}_extra_us": extra[m] * 1e6 for m in MODES if m != "off"},
               "times_ms": {m: [t * 1e3 for t in v] for m, v in result["times"].items()}}
    print(f"{args.model} on {args.world_size} ranks ({args.backend}), batch {args.batch}: step off "
          f"{med['off'] * 1e3:.3f} ms, on {med['on'] * 1e3:.3f} ms, report every {args.every} "
          f"{med['report'] * 1e3:.3f} ms (medians of {args.repeat} blocks of {args.steps} steps); per round, off "
          f"again / off {100 * (ratio['off again'] - 1):+.2f} % ({extra['off again'] * 1e6:+.1f} us), on / off "
          f"{100 * (ratio['on'] - 1):+.2f} % ({extra['on'] * 1e6:+.1f} us), report / off "
          f"{100 * (ratio['report'] - 1):+.2f} % ({extra['report'] * 1e6:+.1f} us) (medians); one report "
          f"{result['gather'] * 1e3:.3f} ms (median of {result['reports']}); so at N = {args.at}: "
          f"{100 * at:+.2f} % of a step")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
