"""What recording a timeline costs: the same training steps with the timeline off and on, in alternating
blocks within one process (so the machine's load drifts equally over both), medians printed by rank 0.

    python tools/bench_timeline.py                                  # one process: op call + CNN step
    singa-run -np 2 --backend shm tools/bench_timeline.py --steps   # 2 ranks: DistOpt CNN steps

The numbers in docs/benchmarks.md ("A timeline of one step") come from these two commands.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

from train_cnn import CNN  # noqa: E402

from singa_lite import autograd, opt, tensor, timeline  # noqa: E402


def blocks(run, n: int, repeats: int, out: str, rank: int):
    """Alternating blocks of n calls of run() off and on; returns (off, on) seconds per call."""
    off, on = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            run()
        off.append((time.perf_counter() - t0) / n)
        timeline.start(out, rank=rank, max_events=10 ** 7)
        t0 = time.perf_counter()
        for _ in range(n):
            run()
        on.append((time.perf_counter() - t0) / n)
        timeline.stop()
    return off, on


def report(what: str, off, on, unit: float, name: str) -> None:
    print(f"{what}: off {statistics.median(off) * unit:.2f} {name}, on {statistics.median(on) * unit:.2f} {name} "
          f"(medians of {len(off)} blocks; off {[round(v * unit, 2) for v in off]}, "
          f"on {[round(v * unit, 2) for v in on]})", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", action="store_true", help="only the CNN steps (what a multi-rank run measures)")
    p.add_argument("--repeats", type=int, default=6)
    args = p.parse_args()
    out = os.path.join(tempfile.mkdtemp(prefix="sl_tl_bench_"), "")
    distributed = "RANK" in os.environ
    rank = 0
    if not args.steps:
        x = tensor.from_numpy(np.random.rand(2, 4).astype(np.float32))
        off, on = blocks(lambda: autograd.relu(x), 20000, args.repeats, out, rank)
        report("op call (relu, 2x4)", off, on, 1e6, "us")
    model = CNN()
    sgd = opt.DistOpt(opt.SGD(lr=0.05, momentum=0.9)) if distributed else opt.SGD(lr=0.05, momentum=0.9)
    rank = sgd.global_rank if distributed else 0
    rng = np.random.default_rng(rank)
    x = tensor.from_numpy(rng.random((32, 1, 28, 28)).astype(np.float32))
    y = tensor.from_numpy(np.eye(10, dtype=np.float32)[rng.integers(0, 10, 32)])
    autograd.training = True

    def step():
        sgd.backward_and_update(autograd.softmax_cross_entropy(model.forward(x), y))
        timeline.mark_step()

    for _ in range(5):  # warm-up (and DistOpt's first step, which compares the models)
        step()
    off, on = blocks(step, 10, args.repeats, out, rank)
    if rank == 0:
        ranks = os.environ.get("WORLD_SIZE", "1")
        report(f"CNN step, batch 32, {ranks} rank(s)", off, on, 1e3, "ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
