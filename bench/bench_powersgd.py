"""PowerSGD against the plain all-reduce on the digits CNN (issue 30 point 3): accuracy, bytes and step time.

    python bench/bench_powersgd.py --accuracy                 # 2 ranks (shm), 10 epochs, seeds 0-4
    sudo python bench/bench_powersgd.py --hosts               # 2 simulated hosts x 1 rank, tcp, 1 Gbit/s
    python bench/bench_powersgd.py --accuracy --hosts         # both

The model is SINGA's MNIST CNN (examples/train_cnn.py, 431 080 parameters) on scikit-learn's bundled digits
(1437 training and 360 test samples resized to 28x28, no download), SGD lr 0.05, momentum 0.9, weight decay
1e-5, batch 32 per rank: examples/mnist_dist.py's settings. Every variant is a comm hook registered on DistOpt
(``register_comm_hook``): plain = ``allreduce_hook`` (bit for bit the exchange without a hook), fp16 =
``fp16_compress_hook``, PowerSGD rank r = ``powerSGD_hook`` with ``PowerSGDState(matrix_approximation_rank=r,
start_powerSGD_iter=S)``; bytes are the hook state's counters (the payload this rank handed to collectives).

--accuracy: for each seed, each variant trains from the same initial parameters on the same data split and the
same batch order (examples/dist_training.py's loop, 2 ranks forked with an NcclIdHolder, shm backend) for
--epochs epochs; prints the test accuracy of each, the difference to plain in points (per seed, and of the
means), and bytes per step: over the whole run and once compression has started.

--hosts: builds the simulated hosts of the multi-host tests (tests/multihost/helpers/sim_hosts.py: network
namespaces, veths to a bridge; needs root and ``ip``), shapes every link to --rate (``tc netem rate .. delay
..``, or ``tbf`` where the kernel lacks netem), and runs one rank per host with the tcp backend (singa-run
--hostfile). Each rank builds every variant (own model and DistOpt on the one world communicator); blocks of
--steps training steps (forward, loss, backward, exchange, update) are interleaved, the order rotating each
round, --repeat rounds; rank 0 prints medians of the ms per step and the ratio to plain from the same run,
plus the bytes the host's eth0 really sent per step (/proc/net/dev in its namespace; TCP/IP headers included).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))
HELPERS = os.path.join(ROOT, "tests", "multihost", "helpers")

LR, MOMENTUM, WEIGHT_DECAY, BATCH = 0.05, 0.9, 1e-5, 32


def make_hook(variant: str, start_iter: int):
    """(state, hook) for a variant name: plain, fp16, psgd1, psgd2, psgd4 (psgd<r>: PowerSGD of rank r)."""
    from singa_lite.parallel import hooks

    if variant == "plain":
        return hooks.HookState(), hooks.allreduce_hook
    if variant == "fp16":
        return hooks.HookState(), hooks.fp16_compress_hook
    if variant.startswith("psgd"):
        rank, _, option = variant[4:].partition("-")
        if option not in ("", "noef"):
            raise ValueError(f"unknown variant {variant!r}")
        return (hooks.PowerSGDState(matrix_approximation_rank=int(rank), start_powerSGD_iter=start_iter,
                                    use_error_feedback=option != "noef"), hooks.powerSGD_hook)
    raise ValueError(f"unknown variant {variant!r}")


def label(variant: str) -> str:
    if variant.startswith("psgd"):
        rank, _, option = variant[4:].partition("-")
        return f"PowerSGD rank {rank}" + (", no EF" if option else "")
    return {"plain": "plain all-reduce", "fp16": "fp16_compress_hook"}[variant]


# ------------------------------------------------------------------------------------------ accuracy
def accuracy_rank(args, variant, seed, nccl_id, rank, world, queue) -> None:
    import dist_training
    from train_cnn import CNN

    from singa_lite import opt
    from singa_lite.data import data_partition, load_digits

    run = argparse.Namespace(world_size=world, threads=1, device="cpu", seed=seed, batch_size=BATCH,
                             epochs=args.epochs, dist_option="plain", threshold=2097152, checkpoint=None,
                             reshard=False, plot=None)
    sgd = opt.SGD(lr=args.lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    sgd, dev = dist_training.distributed_optimizer(run, sgd, nccl_id, rank, world)
    state, hook = make_hook(variant, args.start_iter)
    sgd.register_comm_hook(state, hook)
    quiet = open(os.devnull, "w") if not args.verbose else contextlib.nullcontext(sys.stdout)
    train_set, test_set = load_digits(seed)
    with quiet as out, contextlib.redirect_stdout(out):
        acc = dist_training.train_and_evaluate(run, sgd, dev, CNN(), train_set, test_set, "the bundled digits")
    steps = args.epochs * (len(data_partition(*train_set, rank, world)[1]) // BATCH)
    if rank == 0:
        queue.put((variant, seed, acc, state.bytes_sent, state.bytes_plain, steps, state.buckets,
                   getattr(state, "start_powerSGD_iter", 0)))


def run_accuracy(args) -> int:
    import multiprocessing

    from singa_lite import singa_wrap

    variants = args.variants.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    ctx = multiprocessing.get_context("fork")
    results = {}  # (variant, seed) -> (acc, sent, plain, steps, buckets, start)
    start = time.monotonic()
    for seed in seeds:
        for variant in variants:
            queue = ctx.Queue()
            nccl_id = singa_wrap.NcclIdHolder()
            procs = [ctx.Process(target=accuracy_rank, args=(args, variant, seed, nccl_id, r, 2, queue))
                     for r in range(2)]
            for p in procs:
                p.start()
            got = queue.get(timeout=600)
            for p in procs:
                p.join()
            if any(p.exitcode != 0 for p in procs):
                print(f"{variant} seed {seed}: a rank failed ({[p.exitcode for p in procs]})", file=sys.stderr)
                return 1
            results[(variant, seed)] = got[2:]
            print(f"  seed {seed} {label(variant):20s} test acc {got[2]:.4f}", flush=True)
    print(f"({time.monotonic() - start:.0f} s)\n")
    print(f"SINGA's MNIST CNN on the bundled digits (360 test samples: 1 point = 3.6 samples), 2 ranks (shm) x 1 "
          f"thread, batch {BATCH} per rank, SGD lr {args.lr} momentum {MOMENTUM}, {args.epochs} epochs; PowerSGD "
          f"from step {args.start_iter}; test accuracy after the last epoch, seeds {args.seeds}")
    header = " ".join(f"{'s' + str(s):>6s}" for s in seeds)
    print(f"{'variant':20s} {header} {'mean':>6s} {'diff pts (per seed)':>34s} {'mean diff':>9s} {'min diff':>8s}")
    plain = {s: results[("plain", s)][0] for s in seeds} if "plain" in variants else None
    for v in variants:
        accs = [results[(v, s)][0] for s in seeds]
        row = f"{label(v):20s} " + " ".join(f"{100 * a:6.2f}" for a in accs) + f" {100 * statistics.mean(accs):6.2f}"
        if plain and v != "plain":
            diffs = [100 * (results[(v, s)][0] - plain[s]) for s in seeds]
            row += f" {' '.join(f'{d:+.2f}' for d in diffs):>34s} {statistics.mean(diffs):+9.2f} {min(diffs):+8.2f}"
        print(row)
    print("\nbytes per step handed to collectives by each rank (the hook state's counters); 'compressed': the steps "
          "from start_powerSGD_iter on")
    print(f"{'variant':20s} {'steps':>6s} {'buckets':>8s} {'whole run':>11s} {'compressed':>11s} {'vs plain':>9s}")
    s0 = seeds[0]
    for v in variants:
        _, sent, plain_bytes, steps, buckets, start_iter = results[(v, s0)]
        per_plain = plain_bytes / steps
        # steps before start_iter send the plain buffer; the rest are the compressed steps
        compressed = (sent - start_iter * per_plain) / (steps - start_iter) if steps > start_iter else sent / steps
        print(f"{label(v):20s} {steps:6d} {buckets:8d} {sent / steps:11.0f} {compressed:11.0f} "
              f"{per_plain / compressed:8.1f}x")
    return 0


# ------------------------------------------------------------------------------------------ hosts
def tx_bytes(iface: str = "eth0") -> int:
    """Bytes sent on `iface` of this process's network namespace (/proc/net/dev is per namespace)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == iface:
                return int(rest.split()[8])
    return 0


def hosts_worker(args) -> None:
    import numpy as np
    from train_cnn import CNN

    from singa_lite import autograd, device, dist, opt, tensor
    from singa_lite.data import data_partition, load_digits

    device.set_num_threads(1)  # one rank per simulated host, 2 ranks on the machine's cores
    world = dist.init(backend="tcp", timeout=120)
    rank, P = world.rank, world.world_size
    (train_x, train_y), _ = load_digits(0)
    x, y = data_partition(train_x, train_y, rank, P)
    batches = [(tensor.from_numpy(x[i:i + BATCH]), tensor.from_numpy(y[i:i + BATCH]))
               for i in range(0, len(y) - BATCH + 1, BATCH)]
    variants = args.variants.split(",")
    runs = {}
    for v in variants:
        model = CNN()
        dopt = opt.DistOpt(opt.SGD(lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY), communicator=world)
        state, hook = make_hook(v, 1)  # compression from the second step: the warm-up steps cover the plain one
        dopt.register_comm_hook(state, hook)
        autograd.training = False
        model.forward(batches[0][0])
        dopt.broadcast_parameters({f"{k}.{n}": t for k, layer in vars(model).items() if hasattr(layer, "get_params")
                                   for n, t in layer.get_params().items()})
        runs[v] = [model, dopt, state, 0]
    autograd.training = True

    def step(v):
        model, dopt, _, i = runs[v]
        bx, by = batches[i % len(batches)]
        runs[v][3] = i + 1
        dopt.backward_and_update(autograd.softmax_cross_entropy(model.forward(bx), by))

    for v in variants:  # warm-up: buffers, PowerSGD's memory and first Q
        for _ in range(3):
            step(v)
    times = {v: [] for v in variants}
    wire = {v: [] for v in variants}
    sent = {v: [] for v in variants}
    for r in range(args.repeat):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            before, hook_before = tx_bytes(), runs[v][2].bytes_sent
            world.barrier()
            t = time.perf_counter()
            for _ in range(args.steps):
                step(v)
            world.barrier()
            took = (time.perf_counter() - t) / args.steps
            slowest = float(tensor.to_numpy(world.all_reduce(tensor.from_numpy(np.array([took])), "max"))[0])
            times[v].append(slowest)
            wire[v].append((tx_bytes() - before) / args.steps)
            sent[v].append((runs[v][2].bytes_sent - hook_before) / args.steps)
    if rank == 0:
        ref = statistics.median(times["plain"]) if "plain" in times else None
        print(f"{P} ranks, one per simulated host, tcp backend, {device.get_num_threads()} thread each; the digits "
              f"CNN, batch {BATCH} per rank; medians of {args.repeat} interleaved blocks of {args.steps} steps "
              f"(the slowest rank's time)")
        print(f"{'variant':20s} {'ms/step':>8s} {'(min-max)':>13s} {'vs plain':>9s} {'hook B/step':>12s} "
              f"{'eth0 tx B/step':>15s}")
        for v in variants:
            m = statistics.median(times[v])
            ratio = f"{m / ref:9.2f}" if ref else f"{'':9s}"
            print(f"{label(v):20s} {1e3 * m:8.2f} {f'({1e3 * min(times[v]):.0f}-{1e3 * max(times[v]):.0f})':>13s} "
                  f"{ratio} {statistics.median(sent[v]):12.0f} {statistics.median(wire[v]):15.0f}", flush=True)


def run_hosts(args) -> int:
    sys.path.insert(0, HELPERS)
    import sim_hosts

    problem = sim_hosts.why_not()
    if problem:
        print(f"--hosts skipped: cannot simulate hosts here: {problem}", file=sys.stderr)
        return 2
    sim_hosts.remove_stale()
    with sim_hosts.SimCluster(2) as cluster, tempfile.TemporaryDirectory() as tmp:
        shaping = ("unshaped (veths at memory speed)" if args.no_shaping
                   else sim_hosts.slow_links(cluster, rate=args.rate, delay=args.delay))
        hostfile = cluster.hostfile(os.path.join(tmp, "hosts"), slots=1)
        argv = [os.path.abspath(__file__), "--hosts-worker", "--variants", args.hosts_variants, "--steps",
                str(args.steps), "--repeat", str(args.repeat)]
        print(f"2 simulated hosts x 1 rank, every link: {shaping}", flush=True)
        command = ["ip", "netns", "exec", cluster.ns("launcher"), sim_hosts.WRAPPER, "--here", "launcher",
                   sys.executable, "-m", "singa_lite.run", "--hostfile", hostfile, "--launcher-exec",
                   sim_hosts.WRAPPER, "--master-addr", cluster.address["h0"], "--backend", "tcp", "--no-prefix",
                   *argv]
        code, out, seconds = cluster.run(command, timeout=1800)
        print(out, end="")
        print(f"({seconds:.0f} s)")
        return code


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--accuracy", action="store_true", help="train 10 epochs per variant and seed (2 ranks, shm)")
    p.add_argument("--hosts", action="store_true", help="step time on 2 simulated hosts (root, ip, tc)")
    p.add_argument("--variants", default="plain,psgd1,psgd2,psgd4,fp16",
                   help="--accuracy's variants: plain, fp16, psgd<r> (PowerSGD of rank r), psgd<r>-noef (without "
                        "error feedback)")
    p.add_argument("--seeds", default="0,1,2,3,4", help="--accuracy: data split, initial parameters, batch order")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--lr", type=float, default=LR)
    p.add_argument("--start-iter", type=int, default=10,
                   help="--accuracy: PowerSGD's start_powerSGD_iter (plain all-reduce for the first steps)")
    p.add_argument("--verbose", action="store_true", help="--accuracy: print every run's epochs")
    p.add_argument("--hosts-variants", default="plain,fp16,psgd1,psgd2,psgd4", help="--hosts' variants")
    p.add_argument("--rate", default="1gbit", help="--hosts: every link's rate")
    p.add_argument("--delay", default="100us", help="--hosts: every link's one-way delay (netem)")
    p.add_argument("--no-shaping", action="store_true", help="--hosts: leave the links unshaped (a control)")
    p.add_argument("--steps", type=int, default=10, help="--hosts: steps per timed block")
    p.add_argument("--repeat", type=int, default=9, help="--hosts: interleaved rounds")
    p.add_argument("--hosts-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.hosts_worker:
        hosts_worker(args)
        return 0
    if not (args.accuracy or args.hosts):
        p.error("choose --accuracy, --hosts or both")
    code = 0
    if args.accuracy:
        code = run_accuracy(args)
    if args.hosts and code == 0:
        code = run_hosts(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
