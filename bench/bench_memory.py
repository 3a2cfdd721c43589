"""Peak memory per rank of data-parallel training: singa_lite's DistOpt against PyTorch DDP (gloo), the same model,
batch and threads, 2 ranks of one host, each framework's job in fresh processes (a process's peak is for its whole
life, and neither framework's processes load the other), jobs alternating, repeated; medians reported.

    python bench/bench_memory.py                       # SINGA's MNIST CNN (batch 32) and ResNet-18 CIFAR (batch 16)
    python bench/bench_memory.py --models cnn --repeat 3

Per rank, from /proc/self/status:
- runtime: the resident set after importing the framework and joining the job, before the model exists;
- peak: the highest resident set of the process's life until the end of the measured steps (VmHWM, before and
  after its reset), what a scheduler's memory limit sees;
- step peak: the highest resident set during the measured steps (VmHWM reset through /proc/self/clear_refs after
  the warm-up steps), the steady state of training;
- training: step peak - runtime, the memory the model, its activations, gradients, optimizer state and the
  exchange take.
ratio = singa_lite / PyTorch (goal <= 0.8 on peak). For singa_lite also: the resident set between two steps,
where the last step's graph is still held (SINGA keeps it until the next forward, so that a second backward or an
export after backward works), and after releasing it (`engine.release_spent()`): what keeping the graph costs
between steps. It costs nothing at the step peak, since a step's activations are alive during its backward anyway.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MODELS = {"cnn": ((1, 28, 28), 32), "resnet18": ((3, 32, 32), 16)}  # input shape, batch per rank


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--models", default="cnn,resnet18", help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=5, help="measured steps per job (after 2 warm-up steps)")
    p.add_argument("--repeat", type=int, default=2, help="jobs per framework and model, alternating")
    p.add_argument("--timeout", type=float, default=600, help="seconds a job may take")
    return p.parse_args(argv)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set


def _batch(model: str, rank: int):
    import numpy as np

    shape, batch = MODELS[model]
    rng = np.random.default_rng(rank)
    return rng.standard_normal((batch, *shape)).astype(np.float32), rng.integers(0, 10, batch).astype(np.int32)


def singa_rank(rank, world, holder, model, steps, out):
    os.environ["OMP_NUM_THREADS"] = "1"
    from singa_lite import autograd, device, engine, opt, tensor

    device.set_num_threads(1)
    dopt = opt.DistOpt(opt.SGD(lr=0.01, momentum=0.9), nccl_id=holder, gpu_num=rank, gpu_per_node=world)
    runtime = _status_kib("VmRSS")
    from bench_models import SingaCNN, SingaResNet18

    net = SingaCNN() if model == "cnn" else SingaResNet18()
    x, y = _batch(model, rank)
    tx, ty = tensor.from_numpy(x), tensor.from_numpy(y)
    autograd.training = True

    def step():
        dopt.backward_and_update(autograd.softmax_cross_entropy(net.forward(tx), ty))

    for _ in range(2):
        step()
    before = _status_kib("VmHWM")  # import, set-up and warm-up
    _reset_peak()
    for _ in range(steps):
        step()
    step_peak = _status_kib("VmHWM")
    between = _status_kib("VmRSS")
    engine.release_spent()
    released = _status_kib("VmRSS")
    out.put((rank, {"runtime": runtime, "peak": max(before, step_peak), "step peak": step_peak,
                    "between steps": between, "graph released": released}))
    dopt.communicator.close()


def torch_rank(rank, world, init_file, model, steps, out):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as tdist

    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    runtime = _status_kib("VmRSS")
    from bench_models import torch_cnn, torch_resnet18, torch_sgd_step

    torch.manual_seed(0)
    net = torch.nn.parallel.DistributedDataParallel(torch_cnn(torch) if model == "cnn" else torch_resnet18(torch))
    x, y = _batch(model, rank)
    step = torch_sgd_step(torch, net, x, y)
    for _ in range(2):
        step()
    before = _status_kib("VmHWM")
    _reset_peak()
    for _ in range(steps):
        step()
    step_peak = _status_kib("VmHWM")
    out.put((rank, {"runtime": runtime, "peak": max(before, step_peak), "step peak": step_peak}))
    tdist.destroy_process_group()


def run_job(framework: str, model: str, a) -> list[dict]:
    """One job of `a.ranks` fresh processes (spawned: a forked child would start from this process's memory, and
    even through exec its ru_maxrss keeps the parent's, hence VmHWM, which exec resets); per rank its numbers."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        if framework == "singa_lite":
            from singa_lite import dist

            shared, target = dist.NcclIdHolder(), singa_rank
        else:
            shared, target = os.path.join(tmp, "init"), torch_rank
        procs = [ctx.Process(target=target, args=(r, a.ranks, shared, model, a.steps, out))
                 for r in range(a.ranks)]
        for p in procs:
            p.start()
        results, deadline = {}, time.monotonic() + a.timeout
        while len(results) < len(procs):
            try:
                r, numbers = out.get(timeout=1.0)
                results[r] = numbers
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    for p in procs:
                        p.kill()
                    raise RuntimeError(f"{framework} {model}: a rank failed (exit codes "
                                       f"{[p.exitcode for p in procs]}; its traceback is above) or the job "
                                       f"passed --timeout {a.timeout} s") from None
        for p in procs:
            p.join(timeout=120)
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"{framework} {model}: ranks exited with {[p.exitcode for p in procs]}")
    return [results[r] for r in range(a.ranks)]


def main(argv=None) -> int:
    a = parse_args(argv)
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise SystemExit(f"--models: unknown {unknown}; choose from {', '.join(MODELS)}")
    import importlib.util

    if importlib.util.find_spec("torch") is None:  # not imported here: only the ranks load a framework
        raise SystemExit("this benchmark compares against PyTorch DDP: pip install torch (CPU build)")
    rows = {}
    for model in models:
        for rep in range(a.repeat):
            order = ("singa_lite", "torch") if rep % 2 == 0 else ("torch", "singa_lite")
            for fw in order:
                for numbers in run_job(fw, model, a):
                    for k, v in numbers.items():
                        rows.setdefault((model, fw, k), []).append(v)
                print(f"  {model} {fw} job {rep + 1}: peak per rank "
                      f"{[round(v / 1024) for v in rows[(model, fw, 'peak')][-a.ranks:]]} MiB", flush=True)
    med = {k: statistics.median(v) / 1024 for k, v in rows.items()}  # MiB
    print(f"\nPeak memory per rank, {a.ranks} ranks x 1 thread, {a.steps} measured steps, medians of {a.repeat} "
          f"jobs per framework (MiB); ratio = singa_lite / PyTorch DDP gloo")
    print(f"{'model':9} {'framework':11} {'runtime':>8} {'peak':>8} {'step peak':>10} {'training':>9}")
    for model in models:
        for fw in ("singa_lite", "torch"):
            g = {k: med[(model, fw, k)] for k in ("runtime", "peak", "step peak")}
            print(f"{model:9} {fw:11} {g['runtime']:8.0f} {g['peak']:8.0f} {g['step peak']:10.0f} "
                  f"{g['step peak'] - g['runtime']:9.0f}")
        s, t = (med[(model, fw, "peak")] for fw in ("singa_lite", "torch"))
        st = med[(model, "singa_lite", "step peak")] - med[(model, "singa_lite", "runtime")]
        tt = med[(model, "torch", "step peak")] - med[(model, "torch", "runtime")]
        print(f"{model:9} ratio: peak {s / t:.2f}, training {st / tt:.2f}; singa_lite between steps "
              f"{med[(model, 'singa_lite', 'between steps')]:.0f} MiB with the last graph held, "
              f"{med[(model, 'singa_lite', 'graph released')]:.0f} MiB after release_spent()")
    return 0


if __name__ == "__main__":
    sys.exit(main())
