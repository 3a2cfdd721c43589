"""One training step (forward + backward + SGD update) of singa_lite against PyTorch eager on the CPU,
same model, same data, same thread count, measured in the same run.

Cases: SINGA's MNIST CNN (conv 20@5x5, pool, conv 50@5x5, pool, fc 500, fc 10) at batch 64 and 256, and
the MLP of the DDP exercises (1024 -> 256 -> 256 -> 256 -> 32, tanh) at batch 64; ``loop_b64``: the CNN in
the loop users write, with numpy augmentation and accuracy around each step (bench/train_loop.py: each
library in a process of its own, PyTorch twice: as it comes, and given singa_lite's numpy-BLAS setting). Blocks
of steps are
interleaved (singa_lite, torch, singa_lite, ...) with a short sleep before each, so machine noise hits
both; medians over blocks are reported. ratio = torch step time / singa_lite step time (> 1: singa_lite
faster); the goal is ratio >= 1.0 (singa_lite's step at most PyTorch's).

    python bench/bench_train.py                    # all cases
    python bench/bench_train.py --threads 1 --repeat 9
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--threads", type=int, default=None, help="threads for both libraries (default: all cores)")
    p.add_argument("--repeat", type=int, default=7, help="timed blocks per library per case")
    p.add_argument("--steps", type=int, default=10, help="training steps per timed block")
    p.add_argument("--gap", type=float, default=0.2, help="seconds of sleep before each block")
    p.add_argument("--filter", default="", help="run only cases whose name contains this")
    p.add_argument("--only", choices=("singa", "torch"), default=None,
                   help="time one library alone (run once per library, in separate processes): no idle workers "
                        "of the other library's thread pool share the cores; no ratio is printed")
    return p.parse_args()


ARGS = parse_args()
if ARGS.threads:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)

# The environment the user started us with: singa_lite's import sets OPENBLAS_THREAD_TIMEOUT for numpy's OpenBLAS
# (singa_lite/_runtime/threads.py), and the loop's PyTorch worker must not inherit that fix unasked.
USER_ENV = dict(os.environ)

import numpy as np  # noqa: E402

try:
    import torch  # noqa: E402
except ImportError:
    sys.exit("this benchmark compares against PyTorch: pip install torch (CPU build); it is not a dependency "
             "of singa_lite")

from singa_lite import autograd, device, opt, tensor  # noqa: E402

from bench_models import SingaCNN, SingaMLP, torch_cnn, torch_mlp, torch_sgd_step  # noqa: E402

if ARGS.threads:
    device.set_num_threads(ARGS.threads)
    torch.set_num_threads(ARGS.threads)


# ---------------------------------------------------------------- cases (models: bench_models.py)
def make_case(name, batch):
    rng = np.random.default_rng(0)
    if name == "cnn":
        x = rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)
        y = rng.integers(0, 10, batch).astype(np.int32)
        s_model, t_model = SingaCNN(), torch_cnn(torch)
    else:
        x = rng.standard_normal((batch, 1024)).astype(np.float32)
        y = rng.integers(0, 32, batch).astype(np.int32)
        s_model, t_model = SingaMLP(), torch_mlp(torch)
    sgd = opt.SGD(lr=0.01, momentum=0.9)
    tx, ty = tensor.from_numpy(x), tensor.from_numpy(y)

    def singa_step():
        autograd.training = True
        loss = autograd.softmax_cross_entropy(s_model.forward(tx), ty)
        sgd(loss)

    return singa_step, torch_sgd_step(torch, t_model, x, y)


def time_block(step, n):
    t = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t) / n


def time_loops(batch):
    """The loop with numpy work around each step (bench/train_loop.py): one worker process per library, blocks
    interleaved; prints loop, step and numpy times, loop / (step + numpy), and singa_lite's loop / torch's.

    Two PyTorch workers: ``torch`` as a user gets it, and ``torch+t4``, given the one setting singa_lite applies
    to numpy's OpenBLAS at import (OPENBLAS_THREAD_TIMEOUT=4: its idle threads sleep at once instead of
    spinning against the next step). Without it numpy's spinning BLAS threads and PyTorch's pool take turns
    on the cores, and PyTorch's loop costs well over the sum of its parts (docs/benchmarks/training.md)."""
    import subprocess

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_loop.py")
    extra = ["--threads", str(ARGS.threads)] if ARGS.threads else []
    from singa_lite._runtime.threads import SPIN_DEFAULT, SPIN_VAR  # the setting singa_lite gives numpy's OpenBLAS

    fixed = {**USER_ENV, SPIN_VAR: USER_ENV.get(SPIN_VAR, SPIN_DEFAULT)}
    kinds = {"singa": ("singa", USER_ENV), "torch": ("torch", USER_ENV), "torch+t4": ("torch", fixed)}
    workers = {}
    for name, (lib, env) in kinds.items():
        if ARGS.only in (None, lib):
            workers[name] = subprocess.Popen([sys.executable, script, lib, "--batch", str(batch), *extra],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            assert workers[name].stdout.readline().strip() == "ready", f"the {name} loop worker did not start"

    def ask(name, what):
        time.sleep(ARGS.gap)
        workers[name].stdin.write(f"{what} {ARGS.steps}\n")
        workers[name].stdin.flush()
        return float(workers[name].stdout.readline())

    times = {(name, what): [] for name in workers for what in ("loop", "step", "numpy")}
    try:
        for _ in range(ARGS.repeat):
            for what in ("loop", "step", "numpy"):
                for name in workers:
                    times[name, what].append(ask(name, what))
    finally:
        for w in workers.values():
            w.stdin.close()
            w.wait(timeout=60)
    med = {k: statistics.median(v) for k, v in times.items()}
    for name in workers:
        loop, parts = med[name, "loop"], med[name, "step"] + med[name, "numpy"]
        # Also per round: a slow phase of the machine that hits one block of a round (docs/benchmarks/training.md)
        # then moves one ratio, not the medians of two columns.
        per_round = statistics.median(lp / (st + nu) for lp, st, nu in
                                      zip(times[name, "loop"], times[name, "step"], times[name, "numpy"]))
        print(f"loop_b{batch} {name:8s} loop {1e3 * loop:7.2f} ms  step {1e3 * med[name, 'step']:6.2f} + numpy "
              f"{1e3 * med[name, 'numpy']:5.2f} ms  loop/sum {loop / parts:4.2f}, per round {per_round:4.2f}"
              + (" (goal <= 1.15)" if name == "singa" else ""))
    for torch_name in ("torch", "torch+t4"):
        if "singa" in workers and torch_name in workers:
            ratios = sorted(s / t for s, t in zip(times["singa", "loop"], times[torch_name, "loop"]))
            print(f"loop_b{batch} singa_lite loop / {torch_name} loop "
                  f"{med['singa', 'loop'] / med[torch_name, 'loop']:.2f} (goal <= 0.6; per round "
                  f"{', '.join(f'{r:.2f}' for r in ratios)})")


def main():
    cases = [("cnn_b64", "cnn", 64), ("cnn_b256", "cnn", 256), ("mlp_b64", "mlp", 64), ("loop_b64", "loop", 64)]
    print(f"singa_lite vs PyTorch {torch.__version__} eager, one training step (forward + backward + SGD)")
    print(f"threads: singa_lite {device.get_num_threads()}, torch {torch.get_num_threads()}; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; {ARGS.repeat} blocks of "
          f"{ARGS.steps} steps, interleaved")
    print(f"{'case':10s} {'torch ms':>9s} {'singa ms':>9s} {'ratio':>6s} {'per-block ratios':s}")
    for name, kind, batch in cases:
        if ARGS.filter not in name:
            continue
        if kind == "loop":
            time_loops(batch)
            continue
        singa_step, torch_step = make_case(kind, batch)
        if ARGS.only:
            step = singa_step if ARGS.only == "singa" else torch_step
            for _ in range(3):
                step()
            times = []
            for _ in range(ARGS.repeat):
                time.sleep(ARGS.gap)
                times.append(time_block(step, ARGS.steps))
            print(f"{name:10s} {ARGS.only} alone {1e3 * statistics.median(times):9.2f} ms  (blocks: "
                  f"{', '.join(f'{1e3 * t:.2f}' for t in sorted(times))})")
            continue
        for _ in range(3):
            singa_step()
            torch_step()
        s_times, t_times = [], []
        for _ in range(ARGS.repeat):
            time.sleep(ARGS.gap)
            s_times.append(time_block(singa_step, ARGS.steps))
            time.sleep(ARGS.gap)
            t_times.append(time_block(torch_step, ARGS.steps))
        s_med, t_med = statistics.median(s_times), statistics.median(t_times)
        ratios = sorted(t / s for s, t in zip(s_times, t_times))
        verdict = "PASS" if t_med / s_med >= 1.0 else "BELOW"
        print(f"{name:10s} {1e3 * t_med:9.2f} {1e3 * s_med:9.2f} {t_med / s_med:6.2f} "
              f"{', '.join(f'{r:.2f}' for r in ratios)}  {verdict}")
    autograd.training = False


if __name__ == "__main__":
    main()
