"""What authentication and TLS cost the tcp backend: set-up time and all-reduce time of 2 ranks on loopback,
for two builds of singa_lite's Python layer on the same compiled core, interleaved in one run.

    git worktree add /tmp/sl-before <commit before authentication>     # or any checkout of the Python files
    python bench/bench_tcp_auth.py --before /tmp/sl-before --rounds 7

Each round starts, for each variant in turn, a fresh pair of rank processes with torchrun's variables
(MASTER_ADDR=127.0.0.1, backend tcp). Rank 0 reports the seconds dist.init() took (the store, the job
handshake, the mesh; the processes' own start-up is not counted) and the median time per all-reduce of each
size (blocks of calls, barrier before and after). Variants: "before" (the --before tree: no handshake),
"auth" (this tree: the store's and the mesh's handshake, a key derived from this user's host key), "tls"
(this tree with SINGA_LITE_TLS=1 and a throwaway certificate, needs the openssl command). Reported: medians
over rounds, and each variant's ratio to "before" (time / before's time; < 1.05 is the goal for "auth").

Both trees are byte-compiled first (python -m compileall), so that module size does not count as compile time
in an environment that sets PYTHONDONTWRITEBYTECODE (an installed package ships its bytecode), and one
uncounted round warms the file cache.

The --before tree gets this interpreter's compiled core (singa_lite/_core*.so is copied into it when missing),
and its processes import it instead of this checkout (the editable install's import redirect is bypassed).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
UNITS = {"K": 1 << 10, "M": 1 << 20}


def parse_size(s: str) -> int:
    return int(s[:-1]) * UNITS[s[-1].upper()] if s[-1].upper() in UNITS else int(s)


# ---------------------------------------------------------------- a rank
def rank_main(tree: str, sizes: list, target: float, repeat: int) -> None:
    if tree:  # import singa_lite from `tree`, not from the editable install's redirect
        sys.meta_path[:] = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
        sys.path.insert(0, tree)
    import numpy as np

    from singa_lite import dist, tensor

    start = time.perf_counter()
    comm = dist.init(init_method="env", backend="tcp")
    setup = time.perf_counter() - start
    assert tree == "" or dist.__file__.startswith(tree), dist.__file__
    out = {"setup_s": setup, "allreduce_us": {}}
    for size in sizes:
        t = tensor.from_numpy(np.ones(size // 4, np.float32))
        comm.all_reduce(t)
        t0 = time.perf_counter()
        comm.all_reduce(t)
        calls = max(1, int(target / max(time.perf_counter() - t0, 1e-6)))
        calls = comm.all_gather_object(calls)[0]  # every rank makes the same number of calls
        times = []
        for _ in range(repeat):
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                comm.all_reduce(t)
            comm.barrier()
            times.append((time.perf_counter() - t0) / calls)
        out["allreduce_us"][str(size)] = statistics.median(times) * 1e6
    if comm.rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    comm.close()


# ---------------------------------------------------------------- the driver
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pair(tree: str, extra_env: dict, args) -> dict:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SINGA_LITE_", "SLURM_"))}
    env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1",
                "SINGA_LITE_KEY_DIR": args.key_dir, **extra_env})
    cmd = [sys.executable, __file__, "--rank", "--tree", tree, "--target", str(args.target),
           "--repeat", str(args.repeat), "--sizes", *args.sizes]
    procs = [subprocess.Popen(cmd, env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (o, e) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"a rank failed (exit code {p.returncode}):\n{o}\n{e}")
    line = next(x for x in outs[0][0].splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def prepare_before(tree: str) -> str:
    tree = os.path.abspath(tree)
    if not os.path.isfile(os.path.join(tree, "singa_lite", "__init__.py")):
        raise SystemExit(f"--before {tree}: no singa_lite/__init__.py there (a checkout of this repository?)")
    if not glob.glob(os.path.join(tree, "singa_lite", "_core*.so")):
        import singa_lite._core as core
        shutil.copy(core.__file__, os.path.join(tree, "singa_lite"))
    return tree


def make_cert(folder: str) -> dict:
    key, cert = os.path.join(folder, "tls.key"), os.path.join(folder, "tls.crt")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "2", "-subj", "/CN=bench", "-keyout", key, "-out", cert], check=True, capture_output=True)
    os.chmod(key, 0o600)
    return {"SINGA_LITE_TLS": "1", "SINGA_LITE_TLS_CERT": cert, "SINGA_LITE_TLS_KEY": key}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--before", help="a checkout of singa_lite without the handshake (the baseline)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (a fresh pair of ranks each)")
    p.add_argument("--sizes", nargs="+", default=["4K", "64K", "1M", "16M"])
    p.add_argument("--target", type=float, default=0.05, help="seconds per timed block")
    p.add_argument("--repeat", type=int, default=5, help="timed blocks per size in each pair")
    p.add_argument("--no-tls", action="store_true", help="leave out the TLS variant")
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tree", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        rank_main(args.tree, [parse_size(s) for s in args.sizes], args.target, args.repeat)
        return
    work = tempfile.mkdtemp(prefix="bench_tcp_auth_")
    args.key_dir = os.path.join(work, "keys")
    variants = {}
    if args.before:
        variants["before"] = (prepare_before(args.before), {})
    variants["auth"] = ("", {})
    if not args.no_tls and shutil.which("openssl"):
        variants["tls"] = ("", make_cert(work))
    for tree, _ in variants.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(tree or ROOT, "singa_lite")],
                       check=True, env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
    for tree, extra in variants.values():  # warm-up, not counted
        run_pair(tree, extra, args)
    results = {name: [] for name in variants}
    for r in range(args.rounds):
        for name, (tree, extra) in variants.items():
            results[name].append(run_pair(tree, extra, args))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    base = "before" if "before" in results else None
    print(f"{args.rounds} interleaved rounds, 2 ranks on loopback, load average {os.getloadavg()[0]:.2f} at the end")
    header = "| variant | set-up ms | " + " | ".join(f"{s} us" for s in args.sizes) + " |"
    print(header)
    print("|" + "---|" * (2 + len(args.sizes)))
    med = {}
    for name, rows in results.items():
        med[name] = {"setup": statistics.median(x["setup_s"] for x in rows) * 1e3,
                     **{s: statistics.median(x["allreduce_us"][str(parse_size(s))] for x in rows) for s in args.sizes}}
        cells = [f"{med[name]['setup']:.1f}"] + [f"{med[name][s]:.1f}" for s in args.sizes]
        if base and name != base:
            cells = [f"{c} ({float(c) / (med[base]['setup'] if i == 0 else med[base][args.sizes[i - 1]]):.2f}x)"
                     for i, c in enumerate(cells)]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "key_dir"}, "results": results}, f,
                      indent=1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
