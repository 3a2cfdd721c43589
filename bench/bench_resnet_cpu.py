"""ResNet-18 (CIFAR form: 3x3 stem, stages 64-128-256-512, batch norm, residual adds) or, with ``--model
transformer``, a transformer encoder layer (batch 16 x 128 tokens x 256 wide, 4 heads, feed-forward 1024, post-norm,
dropout 0.1, a per-token linear classifier) training steps on the CPU, singa_lite against PyTorch eager, each library
in a worker process of its own, same threads, same data (the models: bench_models.py).

One step = forward, cross-entropy, backward, SGD with momentum 0.9. The parent asks the two workers for a block
of steps in turn (singa_lite, torch, singa_lite, ...), sleeping a moment before each block, and reports medians
over blocks; ratio = singa_lite step / torch step (goal <= 0.8 for ResNet-18, <= 1.0 for the transformer).
Separate processes keep one library's idle thread pool from spinning against the other's. The convolutions'
(transformer: the matrix products') FLOP/s are reported against the best SGEMM rate measured in the torch worker
(2048^3, same threads): a measured ceiling, not the data-sheet peak.

    python bench/bench_resnet_cpu.py                        # batch 16, 2 threads, 7 blocks of 5 steps
    python bench/bench_resnet_cpu.py --threads 1 --repeat 9
    SINGA_LITE_ONEDNN=0 python bench/bench_resnet_cpu.py    # singa_lite's convolutions as im2col + GEMM
    python bench/bench_resnet_cpu.py --model transformer    # the encoder layer (--batch sets its batch)
    python bench/bench_resnet_cpu.py --variant SINGA_LITE_OPENMP_SPIN=keep   # a third worker: singa_lite with
                                                            # that environment, in the same rounds
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", choices=("resnet18", "transformer"), default="resnet18")
    p.add_argument("--threads", type=int, default=2, help="threads for both libraries")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--repeat", type=int, default=7, help="timed blocks per library")
    p.add_argument("--steps", type=int, default=5, help="training steps per block")
    p.add_argument("--gap", type=float, default=0.3, help="seconds of sleep before each block")
    p.add_argument("--variant", action="append", default=[], metavar="VAR=VALUE[,VAR=VALUE]",
                   help="another singa_lite worker with these environment variables, timed in the same rounds "
                        "(repeatable)")
    p.add_argument("--worker", choices=("singa", "torch"), help=argparse.SUPPRESS)
    return p.parse_args()


def worker(args):
    """Builds the model, warms up, says 'ready', then answers each line 'N' with the seconds of N steps."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import numpy as np

    sys.path.insert(0, HERE)
    from bench_models import TRANSFORMER

    rng = np.random.default_rng(0)
    cfg = dict(TRANSFORMER, batch=args.batch)
    if args.model == "transformer":
        x = rng.standard_normal((args.batch, cfg["seq"], cfg["d_model"])).astype(np.float32)
        y = rng.integers(0, cfg["classes"], args.batch * cfg["seq"]).astype(np.int32)
    else:
        x = rng.standard_normal((args.batch, 3, 32, 32)).astype(np.float32)
        y = rng.integers(0, 10, args.batch).astype(np.int32)
    extra = ""
    if args.worker == "torch":
        import torch

        from bench_models import torch_resnet18, torch_sgd_step, torch_transformer

        torch.set_num_threads(args.threads)
        net = torch_transformer(torch, cfg) if args.model == "transformer" else torch_resnet18(torch)
        net.train()
        step = torch_sgd_step(torch, net, x, y)
        a = torch.randn(2048, 2048)
        torch.mm(a, a)
        best = min(_timed(lambda: torch.mm(a, a), 1) for _ in range(5))
        extra = f" {2 * 2048 ** 3 / best:.6g}"
    else:
        from singa_lite import autograd, device, opt, tensor
        from singa_lite._runtime import onednn

        from bench_models import SingaResNet18, SingaTransformer

        device.set_num_threads(args.threads)
        net = SingaTransformer(cfg) if args.model == "transformer" else SingaResNet18()
        sgd = opt.SGD(lr=0.01, momentum=0.9)
        tx, ty = tensor.from_numpy(x), tensor.from_numpy(y)
        autograd.training = True

        def step():
            sgd(autograd.softmax_cross_entropy(net.forward(tx), ty))
        extra = " " + onednn.status().replace(" ", "_")
    for _ in range(3):
        step()
    print("ready" + extra, flush=True)
    for line in sys.stdin:
        c = time.process_time()
        wall = _timed(step, int(line))
        print(wall, (time.process_time() - c) / int(line), flush=True)


def _timed(fn, n):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def main():
    args = parse_args()
    if args.worker:
        return worker(args)
    sys.path.insert(0, HERE)
    from bench_models import TRANSFORMER, resnet18_conv_flops, transformer_flops

    cmd = [sys.executable, os.path.abspath(__file__), "--threads", str(args.threads), "--batch", str(args.batch),
           "--model", args.model]
    workers, info = {}, {}
    kinds = {"singa": ("singa", {}), "torch": ("torch", {})}
    for v in args.variant:
        pairs = [kv.split("=", 1) for kv in v.split(",")]
        if not all(len(kv) == 2 and kv[0] for kv in pairs):
            raise SystemExit(f"--variant wants VAR=VALUE[,VAR=VALUE], got {v!r}")
        kinds[f"singa[{v}]"] = ("singa", dict(pairs))
    for name, (kind, env) in kinds.items():  # one at a time: their warm-ups do not overlap
        workers[name] = subprocess.Popen(cmd + ["--worker", kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True, env={**os.environ, **env})
        first = workers[name].stdout.readline().split()
        assert first and first[0] == "ready", f"the {name} worker did not start"
        info[name] = first[1] if len(first) > 1 else ""
    load_before = os.getloadavg()
    times = {name: [] for name in workers}
    cpu = {name: [] for name in workers}
    try:
        for _ in range(args.repeat):
            for name, w in workers.items():
                time.sleep(args.gap)
                w.stdin.write(f"{args.steps}\n")
                w.stdin.flush()
                wall, used = w.stdout.readline().split()
                times[name].append(float(wall))
                cpu[name].append(float(used))
    finally:
        for w in workers.values():
            w.stdin.close()
            w.wait(timeout=120)
    load_after = os.getloadavg()
    s, t = statistics.median(times["singa"]), statistics.median(times["torch"])
    ratios = sorted(a / b for a, b in zip(times["singa"], times["torch"]))
    if args.model == "transformer":
        cfg = dict(TRANSFORMER, batch=args.batch)
        _, step_flops = transformer_flops(cfg)
        title, what = (f"Transformer encoder layer, batch {args.batch} x {cfg['seq']} tokens x {cfg['d_model']}, "
                       f"{cfg['nhead']} heads, FF {cfg['dim_feedforward']}, dropout {cfg['dropout']}"), "matmul"
    else:
        _, step_flops = resnet18_conv_flops(args.batch)
        title, what = f"ResNet-18 CIFAR, batch {args.batch}", "conv"
    gemm = float(info["torch"])
    print(f"{title}, {args.threads} threads each, {args.repeat} blocks of {args.steps} "
          f"steps, interleaved; {os.cpu_count()} CPUs; load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after")
    if args.model == "resnet18":
        print(f"singa_lite convolutions: {info['singa'].replace('_', ' ')}")
    print(f"SGEMM 2048^3 ceiling (torch.mm, best of 5): {gemm / 1e9:.0f} GFLOP/s; {what} FLOPs per step "
          f"{step_flops / 1e9:.2f} G")
    for name, key, med in (("singa_lite", "singa", s), ("torch", "torch", t)):
        blocks = ", ".join(f"{1e3 * v:.0f}" for v in sorted(times[key]))
        print(f"{name:10s} {1e3 * med:8.1f} ms/step (blocks {blocks}); "
              f"{what} FLOPs / step time = {step_flops / med / 1e9:.0f} GFLOP/s = {step_flops / med / gemm:.0%} "
              f"of the SGEMM ceiling")
    # Per round too: a burst of load from other processes that hits one block of a round moves that round's
    # ratio only; the median over rounds is the figure the docs quote.
    per_round = statistics.median(ratios)
    goal = 0.8 if args.model == "resnet18" else 1.0
    verdict = "PASS" if per_round <= goal else "above goal"
    # CPU seconds per step (all threads): what other processes' load changes least; both libraries' OpenMP
    # threads spin a little after parallel work, which counts here.
    cs, ct = statistics.median(cpu["singa"]), statistics.median(cpu["torch"])
    print(f"CPU time per step (all threads): singa_lite {1e3 * cs:.0f} ms, torch {1e3 * ct:.0f} ms, "
          f"ratio {cs / ct:.3f}")
    print(f"ratio singa_lite / torch: of the medians {s / t:.3f}; median per round {per_round:.3f} (goal <= {goal}: "
          f"{verdict}); per round {', '.join(f'{r:.2f}' for r in ratios)}")
    for name in list(workers)[2:]:
        v = statistics.median(times[name])
        r = statistics.median(a / b for a, b in zip(times[name], times["torch"]))
        print(f"{name}: {1e3 * v:.1f} ms/step, CPU {1e3 * statistics.median(cpu[name]):.0f} ms; ratio / torch: of the "
              f"medians {v / t:.3f}, median per round {r:.3f}; against the default singa_lite worker {v / s:.3f}")


if __name__ == "__main__":
    main()
