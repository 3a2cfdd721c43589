"""Draws one training step of a singa_lite timeline (timeline.json from ``singa-run --timeline``, or per-rank
files) as a PNG: one row for each rank's training thread and one for its communication track.

    singa-run -np 2 --backend shm --timeline /tmp/tl examples/mnist_dist.py --launcher singa-run --epochs 1
    python tools/plot_timeline.py /tmp/tl/timeline.json --step 10 -o docs/timeline_cnn_2ranks.png

Needs matplotlib (not a dependency of singa_lite: pip install matplotlib).
"""
from __future__ import annotations

import argparse
import json
import sys

COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "launch": "#000000", "wait": "#C44E52",
          "update": "#55A868", "comm": "#8172B3", "gap": "#BBBBBB"}
LABELS = {"forward": "forward op", "backward": "backward op", "launch": "bucket launch", "wait": "wait (synchronize)",
          "update": "update", "comm": "all-reduce (comm thread)", "gap": "between steps (data loading)"}


def load(paths) -> list:
    events = []
    for p in paths:
        with open(p) as f:
            events.extend(e for e in json.load(f)["traceEvents"] if e.get("ph") == "X")
    return events


def window(events, step: int, margin: float) -> tuple[float, float]:
    """The span of step `step` over all ranks, widened by `margin` of its length before and after."""
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "step" and e["args"]["step"] == step]
    if not spans:
        last = max((e["args"]["step"] for e in events if e["cat"] == "step"), default=None)
        sys.exit(f"plot_timeline: no step {step} in the trace (its steps: 0..{last})")
    t0, t1 = min(s for s, _ in spans), max(e for _, e in spans)
    pad = (t1 - t0) * margin
    return t0 - pad, t1 + pad


def plot(events, step: int, out: str, margin: float = 0.15) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lo, hi = window(events, step, margin)
    ranks = sorted({e["pid"] for e in events})
    rows = []  # (pid, is_comm) top to bottom
    for r in ranks:
        rows += [(r, False), (r, True)]
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.55 * len(rows)), dpi=110)
    seen = set()
    for i, (pid, comm) in enumerate(rows):
        y = len(rows) - 1 - i
        for e in events:
            if e["pid"] != pid or (e["tid"] >= 1) != comm or e["cat"] == "step":
                continue
            s, d = e["ts"], e["dur"]
            if s + d < lo or s > hi:
                continue
            cat = e["cat"]
            height = 0.3 if cat == "launch" else 0.7
            ax.barh(y, max(d, (hi - lo) * 0.0015) / 1000, left=(s - lo) / 1000, height=height,
                    color=COLORS.get(cat, "#999999"), edgecolor="white", linewidth=0.3,
                    label=None if cat in seen else LABELS.get(cat, cat))
            seen.add(cat)
            if cat in ("comm",) and d / (hi - lo) > 0.08:
                ax.text((s - lo + d / 2) / 1000, y, f"{e['args']['bytes'] / 1e6:.2f} MB", ha="center",
                        va="center", fontsize=7, color="white")
        for e in events:  # the step's own span, as a thin line above the training-thread row
            if e["pid"] == pid and not comm and e["cat"] == "step" and e["args"]["step"] == step:
                ax.plot([(e["ts"] - lo) / 1000, (e["ts"] + e["dur"] - lo) / 1000], [y + 0.45] * 2, color="black",
                        linewidth=1)
                ax.text((e["ts"] - lo) / 1000, y + 0.5, f"step {step}: {e['dur'] / 1000:.1f} ms", fontsize=7,
                        va="bottom")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {p} {'comm' if c else 'compute'}" for p, c in reversed(rows)])
    ax.set_xlim(0, (hi - lo) / 1000)
    ax.set_ylim(-0.6, len(rows) - 0.2)
    ax.set_xlabel("ms")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=4, fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+", help="timeline.json (merged) or per-rank timeline files")
    p.add_argument("--step", type=int, default=5, help="which step to draw (default 5: past the warm-up)")
    p.add_argument("-o", "--out", default="timeline.png", help="the PNG to write")
    args = p.parse_args(argv)
    plot(load(args.traces), args.step, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
