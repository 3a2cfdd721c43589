#!/usr/bin/env python
"""Benchmarks of singa_lite's C++ CPU core against numpy, on the same data, in the same process.

Cases: float32 matmul (square 256..2048), one float64 matmul, A.T @ B with A.T passed as a view;
element-wise add / mul on 1e6 and 1e7 float32 (fresh output and out= preallocated) and one broadcast
(row vector + matrix, fresh and out=); sum of 1e6 / 1e7 float32 and sum over axis 0 / -1 of a (4096, 2048)
matrix; and one extra "mixed" case: matmul 512 then add 1e6 (out=), alternating, as in a training step.

Method: every case is checked against numpy once, both sides are warmed up, the number of calls per
timed block is chosen so that a block takes >= --target seconds, then blocks alternate
singa_lite, numpy, singa_lite, numpy, ... (--repeat blocks each) so that machine noise hits both alike.
A case reports the median seconds per call of each side and ratio = speed_singa / speed_numpy
(= median_t_numpy / median_t_singa; > 1 means singa_lite is faster), with the range of the per-block
ratios as a noise indicator, and "other load": the share of the machine's CPU time that other
processes used while the blocks ran (a contaminated case shows it). Goals: matmul (and the
GEMM-dominated mixed case) >= 0.95, element-wise and reductions >= 1.0. singa_lite's kernels run at the
instruction-set level build_info()["cpu_isa"] reports (SINGA_LITE_ISA=baseline|avx2|avx512 lowers it; the
environment section of --out shows it).

Thread counts: by default both libraries use all cores (OpenBLAS and OpenMP defaults). --threads N
sets OMP_NUM_THREADS / OPENBLAS_NUM_THREADS before numpy and singa_lite are imported and calls
_core.set_num_threads(N). numpy's element-wise ops and reductions are single-threaded whatever N is.

Typical use:
    python bench/bench_core.py --json run1.json --out run1.md
    python bench/bench_core.py --merge run1.json run2.json run3.json --out table.md
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time

GOAL_MATMUL = 0.95  # the same OpenBLAS on both sides: parity within noise
GOAL_STREAM = 1.0   # issue 18.6: element-wise and reductions at least numpy's speed


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="singa_lite vs numpy CPU benchmarks (matmul, element-wise, reductions). "
        "Ratios are speed_singa / speed_numpy: > 1 means singa_lite is faster.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--repeat", type=int, default=7, help="timed blocks per library per case (medians are reported)")
    p.add_argument("--target", type=float, default=0.05,
                   help="minimum seconds per timed block; sets the inner iteration count")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per library before calibration")
    p.add_argument("--gap", type=float, default=0.2,
                   help="seconds to sleep before each timed block. An idle OpenBLAS worker spins for ~0.1 s "
                   "after its last call; without a gap the other library's spinning pool takes a core from "
                   "the block that follows (on 2 cores this halved both libraries' GEMM speed)")
    p.add_argument("--quick", action="store_true",
                   help="smaller run: --repeat 3, --target 0.02, largest sizes skipped")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for both libraries (sets OMP_NUM_THREADS / OPENBLAS_NUM_THREADS before "
                   "import and calls _core.set_num_threads); default: library defaults (all cores)")
    p.add_argument("--filter", default=None, help="regular expression: run only the cases whose name matches")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--out", metavar="FILE", default=None, help="write the environment and a markdown table here")
    p.add_argument("--json", metavar="FILE", default=None, help="write raw results (all block times) as JSON")
    p.add_argument("--merge", nargs="+", metavar="JSON", default=None,
                   help="do not measure: combine earlier --json runs (median over runs) into one table")
    p.add_argument("--no-numpy-hugepage", action="store_true",
                   help="diagnostic: stop numpy from madvising huge pages for its large allocations")
    args = p.parse_args(argv)
    if args.quick:
        if args.repeat == 7:
            args.repeat = 3
        if args.target == 0.05:
            args.target = 0.02
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    return args


ARGS = parse_args() if __name__ == "__main__" else None

# Thread settings must be in the environment before numpy / OpenBLAS / libgomp load.
if ARGS is not None and ARGS.threads is not None and not ARGS.merge:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)

import numpy as np  # noqa: E402


# ---------------------------------------------------------------- environment
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "unknown"


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    keep = ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl"]
                    return " ".join(k for k in keep if k in flags)
    except OSError:
        pass
    return "unknown"


def read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "unavailable"


def loaded_openblas_runtime() -> list[dict]:
    """Every OpenBLAS loaded in this process, with the core it picked at run time and its thread count."""
    import ctypes
    paths = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and "openblas" in parts[-1].lower() and parts[-1] not in paths:
                    paths.append(parts[-1])
    except OSError:
        return []
    out = []
    for path in paths:
        entry = {"path": path}
        try:
            lib = ctypes.CDLL(path)  # already loaded: returns the same handle
        except OSError as e:
            entry["error"] = str(e)
            out.append(entry)
            continue
        for suffix in ("64_", ""):
            for prefix in ("scipy_openblas", "openblas"):
                cfg = getattr(lib, f"{prefix}_get_config{suffix}", None)
                nth = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                if cfg is not None and "config" not in entry:
                    cfg.restype = ctypes.c_char_p
                    entry["config"] = cfg().decode()
                if nth is not None and "num_threads" not in entry:
                    nth.restype = ctypes.c_int
                    entry["num_threads"] = nth()
        out.append(entry)
    return out


def numpy_blas_info() -> dict:
    cfg = getattr(np.__config__, "CONFIG", None)
    if isinstance(cfg, dict):
        blas = dict(cfg.get("Build Dependencies", {}).get("blas", {}))
        simd = cfg.get("SIMD Extensions", {})
        return {"name": blas.get("name"), "version": blas.get("version"),
                "openblas configuration (build time)": blas.get("openblas configuration"),
                "simd baseline": simd.get("baseline"), "simd found": simd.get("found")}
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        np.show_config()
    return {"show_config": buf.getvalue()}


def environment(core, singa_lite, args) -> dict:
    bi = singa_lite.build_info()
    so = getattr(core, "__file__", "")
    env = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "python": sys.version.split()[0],
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "nproc": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "transparent_hugepage": read_text("/sys/kernel/mm/transparent_hugepage/enabled"),
        "loadavg_start": read_text("/proc/loadavg"),
        "numpy_version": np.__version__,
        "numpy_blas": numpy_blas_info(),
        "numpy_madvise_hugepage": _numpy_hugepage_state(),
        "singa_lite_version": bi.get("version"),
        "singa_lite_blas": bi.get("blas"),
        "singa_lite_compiler": bi.get("compiler"),
        "singa_lite_build_type": bi.get("build_type"),
        "singa_lite_openmp": bi.get("openmp"),
        "singa_lite_cpu_isa": bi.get("cpu_isa"),
        "singa_lite_core_so": so,
        "singa_lite_core_so_mtime": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.path.getmtime(so)))
        if so and os.path.exists(so) else None,
        "singa_lite_core_so_sha256": _sha256_prefix(so),
        "env_OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "env_OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"),
        # Read after importing singa_lite, which may set defaults for the spin-wait of libgomp / OpenBLAS
        # (numpy's OpenBLAS was loaded before, so it keeps whatever was set when the script started).
        "env_thread_tuning": {k: os.environ.get(k) for k in
                              ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT", "OMP_PROC_BIND")},
        "threads_option": args.threads,
        "singa_lite_omp_threads": core.get_num_threads(),
        "openblas_runtime": loaded_openblas_runtime(),
        "settings": {"repeat": args.repeat, "target_s": args.target, "warmup": args.warmup, "gap_s": args.gap,
                     "quick": args.quick, "filter": args.filter},
    }
    return env


def _sha256_prefix(path):
    import hashlib
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:12]
    except OSError:
        return None


def _numpy_hugepage_state():
    mod = getattr(getattr(np, "_core", None), "multiarray", None) or getattr(np.core, "multiarray", None)
    getter = getattr(mod, "_get_madvise_hugepage", None)
    return bool(getter()) if getter else None


def _set_numpy_hugepage(on: bool) -> None:
    mod = getattr(getattr(np, "_core", None), "multiarray", None) or getattr(np.core, "multiarray", None)
    setter = getattr(mod, "_set_madvise_hugepage", None)
    if setter is None:
        raise SystemExit("--no-numpy-hugepage: this numpy has no _set_madvise_hugepage")
    setter(on)


# ---------------------------------------------------------------- cases
class Case:
    def __init__(self, name, group, shape, dtype, kind, goal, setup, work, quick=True):
        self.name = name        # unique id, matched by --filter
        self.group = group      # matmul / elementwise / reduction
        self.shape = shape      # text for the table
        self.dtype = dtype
        self.kind = kind        # "flop" (GFLOP/s) or "byte" (GB/s)
        self.goal = goal
        self.setup = setup      # () -> (f_singa, f_numpy, check); check() -> (ok, detail)
        self.work = work        # flops or bytes per call
        self.quick = quick      # included in --quick


def build_cases(core):
    T = core.Tensor.from_buffer
    rng = np.random.default_rng(0)
    cases = []

    def close(got, want, rtol, atol_scale=1.0):
        got = np.asarray(got)
        want = np.asarray(want)
        if got.shape != want.shape:
            return False, f"shape {got.shape} != {want.shape}"
        atol = rtol * atol_scale
        err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if got.size else 0.0
        ok = bool(np.allclose(got, want, rtol=rtol, atol=atol))
        return ok, f"max abs err {err:.3g}"

    # ---- matmul
    def mm_setup(n, dtype, trans_a=False):
        def setup():
            a = rng.standard_normal((n, n)).astype(dtype)
            b = rng.standard_normal((n, n)).astype(dtype)
            ta, tb = T(a), T(b)
            if trans_a:
                av = a.T                            # numpy: a transposed view (BLAS gets a trans flag)
                tav = ta.transpose([1, 0])          # singa_lite: the same strided view, no copy
                f_s = lambda: core.matmul(tav, tb)  # noqa: E731
                f_n = lambda: av @ b                # noqa: E731
            else:
                f_s = lambda: core.matmul(ta, tb)   # noqa: E731
                f_n = lambda: a @ b                 # noqa: E731
            rtol = 1e-3 if dtype == np.float32 else 1e-9
            return f_s, f_n, lambda: close(f_s(), f_n(), rtol, atol_scale=math.sqrt(n))
        return setup

    for n in (256, 512, 1024, 2048):
        cases.append(Case(f"matmul_f32_{n}", "matmul", f"{n}x{n} @ {n}x{n}", "float32", "flop", GOAL_MATMUL,
                          mm_setup(n, np.float32), 2.0 * n ** 3, quick=n <= 1024))
    cases.append(Case("matmul_f64_1024", "matmul", "1024x1024 @ 1024x1024", "float64", "flop", GOAL_MATMUL,
                      mm_setup(1024, np.float64), 2.0 * 1024 ** 3))
    cases.append(Case("matmul_f32_1024_AT", "matmul", "A.T @ B, 1024 (A.T a view)", "float32", "flop",
                      GOAL_MATMUL, mm_setup(1024, np.float32, trans_a=True), 2.0 * 1024 ** 3))

    # ---- element-wise
    def ew_setup(op, n, preallocated):
        def setup():
            a = rng.standard_normal(n).astype(np.float32)
            b = rng.standard_normal(n).astype(np.float32)
            ta, tb = T(a), T(b)
            np_op = {"add": np.add, "mul": np.multiply}[op]
            sl_op = {"add": core.add, "mul": core.mul}[op]
            if preallocated:
                c_n = np.ones(n, np.float32)      # touched: no page faults inside the timing
                c_s = np.ones(n, np.float32)
                tc = T(c_s)
                f_s = lambda: sl_op(ta, tb, out=tc)   # noqa: E731
                f_n = lambda: np_op(a, b, out=c_n)    # noqa: E731

                def check():
                    f_s()
                    f_n()
                    return close(c_s, c_n, 1e-6)
            else:
                f_s = lambda: sl_op(ta, tb)   # noqa: E731
                f_n = lambda: np_op(a, b)     # noqa: E731

                def check():
                    return close(f_s(), f_n(), 1e-6)
            return f_s, f_n, check
        return setup

    for op in ("add", "mul"):
        for n, label in ((10 ** 6, "1e6"), (10 ** 7, "1e7")):
            for pre in (False, True):
                name = f"{op}_f32_{label}" + ("_out" if pre else "")
                what = f"({label},) {'out= preallocated' if pre else 'fresh output'}"
                cases.append(Case(name, "elementwise", what, "float32", "byte", GOAL_STREAM,
                                  ew_setup(op, n, pre), 3.0 * 4 * n, quick=n <= 10 ** 6))

    M, N = 4096, 2048

    def bcast_setup(preallocated):
        def setup():
            x = rng.standard_normal((M, N)).astype(np.float32)
            row = rng.standard_normal(N).astype(np.float32)
            tx, trow = T(x), T(row)
            if preallocated:
                c_n = np.ones((M, N), np.float32)
                c_s = np.ones((M, N), np.float32)
                tc = T(c_s)
                f_s = lambda: core.add(trow, tx, out=tc)   # noqa: E731
                f_n = lambda: np.add(row, x, out=c_n)      # noqa: E731

                def check():
                    f_s()
                    f_n()
                    return close(c_s, c_n, 1e-6)
                return f_s, f_n, check
            f_s = lambda: core.add(trow, tx)   # noqa: E731
            f_n = lambda: np.add(row, x)       # noqa: E731
            return f_s, f_n, lambda: close(f_s(), f_n(), 1e-6)
        return setup

    # The out= variant separates the broadcast kernel from the cost of allocating a 32 MiB output.
    for pre in (False, True):
        cases.append(Case("add_bcast_row_f32" + ("_out" if pre else ""), "elementwise",
                          f"({N},) + ({M}, {N}) {'out= preallocated' if pre else 'fresh output'}", "float32",
                          "byte", GOAL_STREAM, bcast_setup(pre), (2.0 * M * N + N) * 4))

    # ---- reductions
    def sum_full_setup(n):
        def setup():
            a = rng.random(n, dtype=np.float32)
            ta = T(a)
            f_s = lambda: core.sum(ta)   # noqa: E731
            f_n = lambda: a.sum()        # noqa: E731
            return f_s, f_n, lambda: close(np.asarray(f_s()), f_n(), 1e-5)
        return setup

    for n, label in ((10 ** 6, "1e6"), (10 ** 7, "1e7")):
        cases.append(Case(f"sum_f32_{label}", "reduction", f"({label},) -> scalar", "float32", "byte", GOAL_STREAM,
                          sum_full_setup(n), 4.0 * n, quick=n <= 10 ** 6))

    def max_full_setup(n):  # both dispatch to AVX2 / AVX-512 loops; ours is also split over threads
        def setup():
            a = rng.standard_normal(n, dtype=np.float32)
            ta = T(a)
            f_s = lambda: core.max(ta, [0], False)   # noqa: E731
            f_n = lambda: a.max()                    # noqa: E731
            return f_s, f_n, lambda: close(np.asarray(f_s()), f_n(), 0.0)
        return setup

    cases.append(Case("max_f32_4e5", "reduction", "(4e5,) -> scalar", "float32", "byte", GOAL_STREAM,
                      max_full_setup(400_000), 4.0 * 400_000))

    def sum_axis_setup(axis):
        def setup():
            x = rng.random((M, N), dtype=np.float32)
            tx = T(x)
            f_s = lambda: core.sum(tx, axes=[axis])   # noqa: E731
            f_n = lambda: x.sum(axis=axis)            # noqa: E731
            return f_s, f_n, lambda: close(f_s(), f_n(), 1e-5)
        return setup

    for axis in (0, -1):
        out_n = N if axis == 0 else M
        cases.append(Case(f"sum_f32_axis{axis}", "reduction", f"({M}, {N}) axis={axis}", "float32", "byte",
                          GOAL_STREAM, sum_axis_setup(axis), 4.0 * (M * N + out_n)))
    # ---- mixed (not one of the required cases): a training-like alternation of a GEMM and an
    # element-wise op. In singa_lite the GEMM runs on OpenBLAS's thread pool and the element-wise op on
    # libgomp's; this shows whether the two pools get in each other's way (numpy has one pool only).
    def mixed_setup():
        n, m = 512, 10 ** 6
        a = rng.standard_normal((n, n)).astype(np.float32)
        x = rng.standard_normal(m).astype(np.float32)
        y = rng.standard_normal(m).astype(np.float32)
        c_n, c_s = np.ones(m, np.float32), np.ones(m, np.float32)
        ta, tx, ty, tc = T(a), T(x), T(y), T(c_s)

        def f_s():
            core.matmul(ta, ta)
            core.add(tx, ty, out=tc)

        def f_n():
            a @ a
            np.add(x, y, out=c_n)

        def check():
            ok1, d1 = close(core.matmul(ta, ta), a @ a, 1e-3, atol_scale=math.sqrt(n))
            f_s()
            f_n()
            ok2, d2 = close(c_s, c_n, 1e-6)
            return ok1 and ok2, f"{d1}; {d2}"
        return f_s, f_n, check

    cases.append(Case("mixed_matmul512_add1e6", "mixed", "matmul 512 f32, then add (1e6,) out= (GFLOP/s of the GEMM)",
                      "float32", "flop", GOAL_MATMUL, mixed_setup, 2.0 * 512 ** 3))
    return cases


# ---------------------------------------------------------------- timing
def machine_busy_s():
    """Seconds of CPU time spent by the whole machine (all processes, all CPUs), or None off Linux."""
    try:
        with open("/proc/stat") as f:
            v = f.readline().split()[1:]
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in v[:7])
    steal = int(v[7]) if len(v) > 7 else 0
    return (user + nice + system + irq + softirq + steal) / ticks


def self_busy_s():
    t = os.times()
    return t.user + t.system


class LoadMeter:
    """CPU time used by other processes while blocks run, as a share of the machine: a noise flag."""

    def __init__(self):
        self.wall = self.foreign = 0.0

    def block(self, f, n):
        m0, s0, t0 = machine_busy_s(), self_busy_s(), time.perf_counter()
        for _ in range(n):
            f()
        t1 = time.perf_counter()
        m1, s1 = machine_busy_s(), self_busy_s()
        self.wall += t1 - t0
        if m0 is not None:
            self.foreign += max(0.0, (m1 - m0) - (s1 - s0))
        return (t1 - t0) / n

    def share(self):
        ncpu = os.cpu_count() or 1
        return self.foreign / (self.wall * ncpu) if self.wall else 0.0


def time_block(f, n):
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n


def run_case(case, args):
    f_s, f_n, check = case.setup()
    ok, detail = check()
    if args.gap:
        time.sleep(args.gap)  # let the previous case's BLAS workers go idle before calibrating
    for _ in range(args.warmup):
        f_s()
        f_n()
    # Calibrate: one call each (best of 3 short tries), then enough calls that each block >= target.
    t_s = min(time_block(f_s, 1) for _ in range(3))
    t_n = min(time_block(f_n, 1) for _ in range(3))
    inner = max(1, math.ceil(args.target / max(1e-9, min(t_s, t_n))))
    singa, numpy_ = [], []
    meter = LoadMeter()
    for _ in range(args.repeat):  # A B A B ...
        if args.gap:
            time.sleep(args.gap)
        singa.append(meter.block(f_s, inner))
        if args.gap:
            time.sleep(args.gap)
        numpy_.append(meter.block(f_n, inner))
    r = summarize(case, singa, numpy_, inner, ok, detail)
    r["foreign_load"] = meter.share()
    return r


def summarize(case, singa, numpy_, inner, ok, detail):
    ms, mn = statistics.median(singa), statistics.median(numpy_)
    pair = [n / s for s, n in zip(singa, numpy_)]
    ratio = mn / ms
    scale = 1e9
    return {
        "name": case.name, "group": case.group, "shape": case.shape, "dtype": case.dtype, "kind": case.kind,
        "goal": case.goal, "work": case.work, "inner": inner, "check_ok": ok, "check": detail,
        "singa_s": singa, "numpy_s": numpy_, "singa_median_s": ms, "numpy_median_s": mn,
        "singa_rate": case.work / ms / scale, "numpy_rate": case.work / mn / scale,
        "ratio": ratio, "ratio_min": min(pair), "ratio_max": max(pair),
        "verdict": "PASS" if ratio >= case.goal else "BELOW",
    }


# ---------------------------------------------------------------- output
def fmt_time(s):
    return f"{s * 1e3:.3f}" if s < 1 else f"{s * 1e3:.0f}"


def rate_unit(kind):
    return "GFLOP/s" if kind == "flop" else "GB/s"


def table_single(results):
    lines = ["| case | shape | dtype | numpy ms | singa ms | numpy rate | singa rate | ratio (block range) "
             "| goal | verdict | other load | check |",
             "|---|---|---|---:|---:|---:|---:|---|---:|---|---:|---|"]
    for r in results:
        u = rate_unit(r["kind"])
        lines.append(
            f"| {r['name']} | {r['shape']} | {r['dtype']} | {fmt_time(r['numpy_median_s'])} | "
            f"{fmt_time(r['singa_median_s'])} | {r['numpy_rate']:.1f} {u} | {r['singa_rate']:.1f} {u} | "
            f"**{r['ratio']:.2f}** ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) | {r['goal']:.2f} | "
            f"{r['verdict']} | {r.get('foreign_load', 0) * 100:.0f}% | {'ok' if r['check_ok'] else 'MISMATCH'} |")
    return "\n".join(lines)


def merge_runs(runs):
    """Per case: median over runs of the per-run median times; ratio = median of the per-run ratios."""
    by_name = {}
    order = []
    for run in runs:
        for r in run["results"]:
            if r["name"] not in by_name:
                order.append(r["name"])
            by_name.setdefault(r["name"], []).append(r)
    merged = []
    for name in order:
        rs = by_name[name]
        r0 = rs[0]
        ms = statistics.median(r["singa_median_s"] for r in rs)
        mn = statistics.median(r["numpy_median_s"] for r in rs)
        ratio = statistics.median(r["ratio"] for r in rs)
        merged.append({
            "name": name, "group": r0["group"], "shape": r0["shape"], "dtype": r0["dtype"], "kind": r0["kind"],
            "goal": r0["goal"], "singa_median_s": ms, "numpy_median_s": mn,
            "singa_rate": r0["work"] / ms / 1e9, "numpy_rate": r0["work"] / mn / 1e9,
            "ratio": ratio, "runs": [r["ratio"] for r in rs],
            "check_ok": all(r["check_ok"] for r in rs),
            "foreign_load_max": max(r.get("foreign_load", 0.0) for r in rs),
            "verdict": "PASS" if ratio >= r0["goal"] else "BELOW",
        })
    return merged


def table_merged(merged):
    lines = ["| case | shape | dtype | numpy ms | singa ms | numpy rate | singa rate | ratio | per-run ratios "
             "| goal | verdict | other load (max) |",
             "|---|---|---|---:|---:|---:|---:|---:|---|---:|---|---:|"]
    for r in merged:
        u = rate_unit(r["kind"])
        runs = ", ".join(f"{x:.2f}" for x in r["runs"])
        lines.append(
            f"| {r['name']} | {r['shape']} | {r['dtype']} | {fmt_time(r['numpy_median_s'])} | "
            f"{fmt_time(r['singa_median_s'])} | {r['numpy_rate']:.1f} {u} | {r['singa_rate']:.1f} {u} | "
            f"**{r['ratio']:.2f}** | {runs} | {r['goal']:.2f} | {r['verdict']}"
            f"{'' if r['check_ok'] else ' (MISMATCH)'} | {r['foreign_load_max'] * 100:.0f}% |")
    return "\n".join(lines)


def env_markdown(env):
    nb = env["numpy_blas"]
    lines = [
        f"- date: {env['date']}",
        f"- command: `{env['command']}`",
        f"- CPU: {env['cpu_model']}, nproc {env['nproc']} (affinity {env['affinity_cpus']}), "
        f"flags: {env['cpu_flags']}",
        f"- transparent huge pages: {env['transparent_hugepage']}; numpy madvise hugepage: "
        f"{env['numpy_madvise_hugepage']}",
        f"- load average at start / end: {env['loadavg_start']} / {env.get('loadavg_end', '?')}",
        f"- Python {env['python']}; numpy {env['numpy_version']}, BLAS {nb.get('name')} {nb.get('version')} "
        f"(SIMD baseline {nb.get('simd baseline')}, dispatch {nb.get('simd found')})",
        f"- singa_lite {env['singa_lite_version']}: {env['singa_lite_compiler']}, {env['singa_lite_build_type']}, "
        f"OpenMP {env['singa_lite_openmp']}; BLAS {env['singa_lite_blas'].get('package')}; CPU kernels' "
        f"instruction set {(env.get('singa_lite_cpu_isa') or {}).get('active', '?')} "
        f"(best here {(env.get('singa_lite_cpu_isa') or {}).get('best', '?')})",
        f"- _core: {env['singa_lite_core_so']} (built {env['singa_lite_core_so_mtime']}, "
        f"sha256 {env.get('singa_lite_core_so_sha256')})",
        f"- threads: --threads {env['threads_option']}, OMP_NUM_THREADS={env['env_OMP_NUM_THREADS']}, "
        f"OPENBLAS_NUM_THREADS={env['env_OPENBLAS_NUM_THREADS']}, singa_lite OpenMP max threads "
        f"{env['singa_lite_omp_threads']}",
    ]
    if env.get("env_thread_tuning"):
        lines.append("- spin-wait settings in the environment after importing singa_lite: " +
                     ", ".join(f"{k}={v}" for k, v in env["env_thread_tuning"].items()))
    for ob in env["openblas_runtime"]:
        lines.append(f"- OpenBLAS loaded: {os.path.basename(ob['path'])}: {ob.get('config', '?')}, "
                     f"{ob.get('num_threads', '?')} threads")
    s = env["settings"]
    lines.append(f"- settings: repeat {s['repeat']}, block >= {s['target_s']} s, warmup {s['warmup']}, "
                 f"gap {s['gap_s']} s, quick {s['quick']}, filter {s['filter']}")
    return "\n".join(lines)


# ---------------------------------------------------------------- main
def main(args):
    if args.merge:
        runs = []
        for path in args.merge:
            with open(path) as f:
                runs.append(json.load(f))
        merged = merge_runs(runs)
        text = [f"Median over {len(runs)} runs ({', '.join(args.merge)}). ms: median over runs of each run's "
                f"median; ratio (speed_singa / speed_numpy, > 1: singa_lite faster): median over runs of each "
                f"run's ratio, so it need not equal the quotient of the ms columns exactly.", "",
                table_merged(merged), ""]
        for i, run in enumerate(runs, 1):
            text += [f"Run {i} ({args.merge[i - 1]}):", "", env_markdown(run["env"]), ""]
        out = "\n".join(text)
        print(out)
        if args.out:
            with open(args.out, "w") as f:
                f.write(out + "\n")
        return 0

    if args.no_numpy_hugepage:
        _set_numpy_hugepage(False)
    import singa_lite
    from singa_lite import _core as core
    if args.threads is not None:
        core.set_num_threads(args.threads)

    cases = build_cases(core)
    if args.quick:
        cases = [c for c in cases if c.quick]
    if args.filter:
        rx = re.compile(args.filter)
        cases = [c for c in cases if rx.search(c.name)]
    if args.list:
        for c in cases:
            print(f"{c.name:22s} {c.group:12s} {c.shape} {c.dtype}")
        return 0

    env = environment(core, singa_lite, args)
    print(env_markdown(env))
    print()
    import gc
    results = []
    for c in cases:
        gc.collect()
        gc.disable()
        try:
            r = run_case(c, args)
        finally:
            gc.enable()
        results.append(r)
        u = rate_unit(r["kind"])
        print(f"{r['name']:22s} numpy {fmt_time(r['numpy_median_s']):>9s} ms {r['numpy_rate']:8.1f} {u:7s} | "
              f"singa {fmt_time(r['singa_median_s']):>9s} ms {r['singa_rate']:8.1f} {u:7s} | "
              f"ratio {r['ratio']:.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) x{r['inner']} "
              f"other load {r['foreign_load'] * 100:.0f}% "
              f"{r['verdict']}{'' if r['check_ok'] else ' CHECK FAILED: ' + r['check']}", flush=True)
    env["loadavg_end"] = read_text("/proc/loadavg")
    # The OpenBLAS thread pools are only populated once used: report them again after the run.
    env["openblas_runtime"] = loaded_openblas_runtime()
    table = table_single(results)
    print()
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write("ratio = speed_singa / speed_numpy (> 1: singa_lite faster); medians of "
                    f"{args.repeat} interleaved blocks.\n\n{table}\n\n{env_markdown(env)}\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "results": results}, f, indent=1)
    return 0 if all(r["check_ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(ARGS))
