"""DistOpt's data-parallel step against the communication-free floor (issue 34, item 3).

    python bench/bench_scaling.py                       # 2 ranks of this host x 1 thread, shm backend
    sudo python bench/bench_scaling.py --hosts          # 2 simulated hosts x 1 rank, tcp, links at 1 Gbit/s

The floor is the same ranks running the same local step with no communication at all (forward, loss, backward,
SGD momentum 0.9 on SINGA's MNIST CNN, batch 32 per rank): a data-parallel step can be no faster. Every variant
runs on the same ranks in one job, in interleaved blocks (floor, DistOpt modes, PyTorch without and with DDP
gloo, then again), each block starting at a barrier; a block's time is the slowest rank's, since the
synchronous step ends for everyone only then. Rank 0 prints the medians, each row's ratio to the floor of its
framework (the median over rounds of the paired ratios, with quartiles), the CPU time per step of the busiest
rank (less sensitive to a shared machine's load than the wall time) and the load average.

One host: `singa-run -np 2 --backend shm` runs the workers (started by this script). --hosts: the simulated
cluster of the multi-host tests (tests/multihost/helpers/sim_hosts.py: network + UTS namespaces, a bridge, every
link shaped to --rate, by tc netem or tbf; needs root), one rank per host, singa-run --hostfile with the tcp
backend; gloo then crosses the same links.

The DistOpt rows are its exchange modes (DistOpt(exchange=...)): "thread" (the default: the communication
thread runs each bucket's all-reduce while backward goes on) and "inline" (the training thread runs them), and
the variants of MODES below (--modes). --exchange-only times the all-reduce of the step's gradients alone
(one fused buffer), the other bound. Results: docs/benchmarks/distopt.md, "Against the communication-free floor".
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HELPERS = os.path.join(os.path.dirname(HERE), "tests", "multihost", "helpers")
# DistOpt rows: name -> its keyword arguments
MODES = {"default": {}, "inline": {"exchange": "inline"}, "thread": {"exchange": "thread"},
         "inline-late": {"exchange": "inline", "overlap": False},
         "thread-late": {"exchange": "thread", "overlap": False},
         # threshold: backward_and_update's (elements); fc1's 400,000-element gradient then goes alone, in place,
         # instead of being copied into the fusion buffer and back
         "inline-t256k": {"exchange": "inline", "threshold": 262144}, "thread-t256k": {"threshold": 262144},
         "inline-t16k": {"exchange": "inline", "threshold": 16384}, "inline-t1": {"exchange": "inline", "threshold": 1}}
# shm only: these rows run over a communicator whose ranks poll up to 200 us at the syncs inside a collective
# before they sleep (SINGA_LITE_SHM_SPIN_US=200; by default they sleep after 5 us there too)
SPIN = {f"{k}-spin": v for k, v in MODES.items()}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--hosts", action="store_true", help="2 simulated hosts (root) instead of 2 ranks of this host")
    p.add_argument("-np", type=int, default=2, help="ranks (one per simulated host with --hosts)")
    p.add_argument("--backend", choices=("tcp", "mpi"), default="tcp",
                   help="with --hosts: singa_lite's communicator (tcp: singa-run --hostfile starts the ranks; mpi: "
                        "mpiexec does)")
    p.add_argument("--rate", default="1gbit", help="with --hosts: the rate of every link")
    p.add_argument("--delay", default="100us", help="with --hosts: the one-way delay (netem; tbf, where the kernel "
                   "has no netem, shapes the rate alone)")
    p.add_argument("--batch", type=int, default=32, help="batch per rank")
    p.add_argument("--threads", type=int, default=1, help="threads per rank")
    p.add_argument("--steps", type=int, default=10, help="steps per timed block")
    p.add_argument("--rounds", type=int, default=9, help="interleaved rounds (one block of every variant each)")
    p.add_argument("--modes", default="inline,thread,thread-t256k", help=f"DistOpt rows timed, comma-separated, of "
                   f"{', '.join(MODES)} (-late: the exchange starts after the whole backward pass, overlap=False; "
                   f"-spin after a name, shm only: over a communicator with SINGA_LITE_SHM_SPIN_US=200)")
    p.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    p.add_argument("--exchange-only", action="store_true", help="also time the all-reduce of the step's gradients "
                   "alone (one buffer of the CNN's 431,080 float32)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


ARGS = parse_args()
if ARGS.worker:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)


def worker() -> None:
    import numpy as np

    sys.path.insert(0, HERE)
    from bench_models import SingaCNN, torch_cnn, torch_sgd_step
    from singa_lite import autograd, device, dist, opt, tensor

    device.set_num_threads(ARGS.threads)
    comm = dist.init(backend="mpi", timeout=120) if ARGS.backend == "mpi" else dist.init(timeout=120)
    rank, P = comm.rank, comm.world_size
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((ARGS.batch, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, ARGS.batch).astype(np.int32)
    tx, ty = tensor.from_numpy(x), tensor.from_numpy(y)
    autograd.training = True

    modes = [m for m in ARGS.modes.split(",") if m]
    spinning = None
    if any(m in SPIN for m in modes):
        os.environ["SINGA_LITE_SHM_SPIN_US"] = "200"  # read when the group's segment is made
        spinning = comm.new_group(list(range(P)))
        del os.environ["SINGA_LITE_SHM_SPIN_US"]

    def singa_step(dist_kw=None, over=comm):
        model = SingaCNN()
        sgd = opt.SGD(lr=0.01, momentum=0.9)
        step_kw = {}
        if dist_kw is not None:
            dist_kw = dict(dist_kw)
            if "threshold" in dist_kw:
                step_kw["threshold"] = dist_kw.pop("threshold")
            sgd = opt.DistOpt(sgd, communicator=over, **dist_kw)

        def step():
            sgd.backward_and_update(autograd.softmax_cross_entropy(model.forward(tx), ty), **step_kw)
        return step, sgd

    steps = {"singa floor": singa_step()[0]}
    for mode in modes:
        if mode in SPIN:
            steps[f"DistOpt {mode}"] = singa_step(SPIN[mode], spinning)[0]
        else:
            steps[f"DistOpt {mode}"] = singa_step(MODES[mode])[0]
    if ARGS.exchange_only:
        grads = [tensor.from_numpy(rng.standard_normal(n).astype(np.float32)) for n in (431080,)]
        steps["all_reduce alone"] = lambda: [comm.all_reduce(g, "avg") for g in grads]
    torch = None
    if not ARGS.no_torch:
        import torch
        import torch.distributed as tdist

        torch.set_num_threads(ARGS.threads)
        if ARGS.hosts:  # gloo would find this host's address through its name, which resolves to loopback
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
        port = comm.broadcast_object(_free_port() if rank == 0 else None)
        addr = os.environ.get("MASTER_ADDR") or os.environ.get("BENCH_MASTER_ADDR", "127.0.0.1")
        tdist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=P)
        steps["torch floor"] = torch_sgd_step(torch, torch_cnn(torch), x, y)
        torch.manual_seed(0)
        steps["torch DDP gloo"] = torch_sgd_step(torch, torch.nn.parallel.DistributedDataParallel(torch_cnn(torch)),
                                                 x, y)
    for fn in steps.values():  # warm up; DistOpt's first step also broadcasts rank 0's parameters
        for _ in range(3):
            fn()
    times, cpu = {k: [] for k in steps}, {k: [] for k in steps}
    for _ in range(ARGS.rounds):
        for k, fn in steps.items():
            comm.barrier()
            t, c = time.perf_counter(), time.process_time()
            for _ in range(ARGS.steps):
                fn()
            times[k].append((time.perf_counter() - t) / ARGS.steps)
            cpu[k].append((time.process_time() - c) / ARGS.steps)
    every = comm.all_gather_object((times, cpu))
    if rank == 0:
        slowest = {k: [max(r[0][k][i] for r in every) for i in range(ARGS.rounds)] for k in steps}
        cpu_most = {k: statistics.median(max(r[1][k][i] for r in every) for i in range(ARGS.rounds)) for k in steps}
        med = {k: statistics.median(v) for k, v in slowest.items()}
        where = (f"{P} simulated hosts x 1 rank ({os.environ.get('BENCH_LINK', '')})" if ARGS.hosts
                 else f"{P} ranks of one host")
        print(f"SINGA's MNIST CNN, batch {ARGS.batch} per rank, {where}, {ARGS.threads} thread(s) each, singa_lite "
              f"{comm.backend} backend" + ("" if torch is None else f", PyTorch {torch.__version__} gloo") +
              f"; medians of {ARGS.rounds} interleaved blocks of {ARGS.steps} steps (the slowest rank's time)")
        print("vs floor: the median over rounds of the block's time / the floor's block of the same round "
              "(the floor of its framework), with the quartiles; cpu: CPU time of the busiest rank's process per "
              "step (all its threads), which the machine's load changes less than the wall time")
        print(f"{'variant':18s} {'ms/step':>8s} {'min-max':>13s} {'vs floor':>9s} {'(q1-q3)':>13s} {'cpu ms':>7s} "
              f"{'cpu vs floor':>12s}")
        for k, m in med.items():
            floor = slowest["torch floor"] if k.startswith("torch") else slowest["singa floor"]
            ratios = sorted(a / b for a, b in zip(slowest[k], floor))
            q1, q2, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
            lo, hi = min(slowest[k]), max(slowest[k])
            cpu_floor = cpu_most["torch floor"] if k.startswith("torch") else cpu_most["singa floor"]
            print(f"{k:18s} {1e3 * m:8.2f} {1e3 * lo:6.1f}-{1e3 * hi:<6.1f} {statistics.median(ratios):9.3f} "
                  f"({q1:.3f}-{q3:.3f}) {1e3 * cpu_most[k]:7.2f} {cpu_most[k] / cpu_floor:12.3f}")
        print(f"load average: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    if torch is not None:
        tdist.destroy_process_group()
    if spinning is not None:
        spinning.close()
    comm.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def forwarded() -> list:
    out = []
    for name in ("batch", "threads", "steps", "rounds", "modes", "backend"):
        out += [f"--{name}", str(getattr(ARGS, name))]
    return out + (["--no-torch"] if ARGS.no_torch else []) + (["--hosts"] if ARGS.hosts else []) + \
        (["--exchange-only"] if ARGS.exchange_only else [])


def main() -> int:
    if ARGS.worker:
        worker()
        return 0
    me = [os.path.abspath(__file__), "--worker", *forwarded()]
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    if not ARGS.hosts:
        import subprocess

        return subprocess.call([sys.executable, "-m", "singa_lite.run", "-np", str(ARGS.np), "--backend", "shm",
                                "--no-prefix", *me])
    sys.path.insert(0, HELPERS)
    import sim_hosts

    problem = sim_hosts.why_not()
    if problem:
        print(f"cannot simulate hosts here: {problem}", file=sys.stderr)
        return 2
    sim_hosts.remove_stale()
    with sim_hosts.SimCluster(ARGS.np) as cluster, tempfile.TemporaryDirectory() as tmp:
        shaping = sim_hosts.slow_links(cluster, rate=ARGS.rate, delay=ARGS.delay)
        hostfile = cluster.hostfile(os.path.join(tmp, "hosts"), slots=1)
        if ARGS.backend == "mpi":
            import shutil  # mpiexec next to this interpreter, else on PATH

            here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
            command = cluster.mpiexec_command(hostfile, ARGS.np, [sys.executable, *me],
                                              mpiexec=here if os.path.exists(here) else shutil.which("mpiexec"))
        else:
            command = ["ip", "netns", "exec", cluster.ns("launcher"), sim_hosts.WRAPPER, "--here", "launcher",
                       sys.executable, "-m", "singa_lite.run", "--hostfile", hostfile, "--launcher-exec",
                       sim_hosts.WRAPPER, "--master-addr", cluster.address["h0"], "--backend", "tcp", "--no-prefix",
                       *me]
        env = cluster.env({**os.environ, "BENCH_LINK": shaping, "BENCH_MASTER_ADDR": cluster.address["h0"]})
        code, out, seconds = cluster.run(command, timeout=1800, env=env)
        print(out, end="")
        print(f"({seconds:.0f} s; load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())})")
        return code


if __name__ == "__main__":
    sys.exit(main())
