"""Hierarchical against flat all-reduce across simulated hosts on a slowed link (issue 16).

    sudo python bench/bench_hierarchical.py                      # 2 hosts x 2 ranks, 1 Gbit/s, 100 us
    sudo python bench/bench_hierarchical.py --rate 10gbit --delay 20us --sizes 1,16
    sudo python bench/bench_hierarchical.py --backend tcp      # no MPI: singa-run --hostfile, the tcp backend
    sudo python bench/bench_hierarchical.py --chunks 0,1024,2048,4096   # the pipeline's piece sizes in KiB

Builds the simulated cluster of the multi-host tests (tests/multihost/helpers/sim_hosts.py: a network and UTS
namespace per host, a bridge, veths; needs root), shapes every link with ``tc netem`` (rate and delay; the rate
alone with ``tbf`` on a kernel without netem) and runs this script on every rank under mpiexec (or singa-run
with ``--backend tcp``). Each rank times ``all_reduce(avg)`` of float32 buffers of each size on the flat world
communicator and on
the two forms of ``comm.hierarchical.create(world, form)``: "sharded" (reduce-scatter within the host over shm,
each local rank all-reduces its shard with its peers on the other hosts, all-gather within the host) and
"leader" (reduce to the host's leader over shm, all-reduce between the leaders, broadcast within the host),
round-robin, and the slowest rank's time of each call is kept (the call ends for everyone only then). Rank 0
prints medians and the ratios flat / hierarchical (> 1: hierarchical is faster). Each form is timed once per
piece size of ``--chunks`` (``create(world, form, chunk_bytes=...)``; 0: not pipelined; route "leader/2048K": the
leader form in pieces of 2 MiB). All give the same averages (checked), and the piece sizes of one form the same
bits."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HELPERS = os.path.join(os.path.dirname(HERE), "tests", "multihost", "helpers")


def route_name(form: str, chunk_kib: int) -> str:
    return f"{form}/0" if chunk_kib == 0 else f"{form}/{chunk_kib}K"


def worker(sizes_mib: list, repeats: int, backend: str, forms: list, chunks_kib: list) -> None:
    import numpy as np

    from singa_lite import dist, tensor
    from singa_lite.comm import hierarchical

    world = dist.init(backend=backend, timeout=120)
    routes = {"flat": world}
    for form in forms:
        for kib in chunks_kib:
            routes[route_name(form, kib)] = hierarchical.create(world, form, chunk_bytes=kib << 10)
    hier = [name for name in routes if name != "flat"]
    assert routes[hier[0]] is not world, "the ranks are on one host: nothing hierarchical to measure"
    rows = []
    for mib in sizes_mib:
        n = int(mib * (1 << 20)) // 4
        x = np.random.default_rng(world.rank).standard_normal(n).astype(np.float32)
        times = {name: [] for name in routes}
        results = {}
        for i in range(repeats + 1):  # the first round warms up every route
            for name, comm in routes.items():
                t = tensor.from_numpy(x.copy())
                world.barrier()
                start = time.perf_counter()
                comm.all_reduce(t, "avg")
                took = time.perf_counter() - start
                slowest = tensor.to_numpy(world.all_reduce(tensor.from_numpy(np.array([took])), "max"))[0]
                if i > 0:
                    times[name].append(slowest)
                results[name] = tensor.to_numpy(t)
        for name in hier:
            np.testing.assert_allclose(results[name], results["flat"], rtol=1e-5, atol=1e-6, err_msg=name)
            same = {k: v for k, v in results.items() if k.split("/")[0] == name.split("/")[0]}
            for other, r in same.items():  # the pieces sum every element as the whole call does: the same bits
                np.testing.assert_array_equal(r, results[name], err_msg=f"{name} vs {other}")
        rows.append((mib, {name: (statistics.median(ts), min(ts), max(ts)) for name, ts in times.items()}))
    if world.rank == 0:
        print(f"{world.world_size} ranks on {routes[hier[0]].hosts} hosts, {backend} backend; all_reduce(avg) of "
              f"float32, median of {repeats} (min-max), the slowest rank's time; form/chunk (0: not pipelined)")
        print(f"{'MiB':>6} " + " ".join(f"{name + ' ms':>18}" for name in routes))
        for mib, cells in rows:
            print(f"{mib:>6g} " + " ".join(f"{m * 1e3:>7.1f} ({lo * 1e3:.0f}-{hi * 1e3:.0f})".rjust(18)
                                           for m, lo, hi in cells.values()), flush=True)
        print("flat / route (> 1: faster than flat)")
        print(f"{'MiB':>6} " + " ".join(f"{name:>14}" for name in hier))
        for mib, cells in rows:
            print(f"{mib:>6g} " + " ".join(f"{cells['flat'][0] / cells[name][0]:>13.2f}x" for name in hier),
                  flush=True)
    for name in hier:
        routes[name].intra.close()
        if routes[name].inter is not None:
            routes[name].inter.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--ranks-per-host", type=int, default=2)
    parser.add_argument("--rate", default="1gbit", help="tc netem rate of every link (default 1gbit)")
    parser.add_argument("--delay", default="100us", help="tc netem one-way delay (default 100us)")
    parser.add_argument("--no-shaping", action="store_true", help="leave the links as the kernel makes them")
    parser.add_argument("--sizes", default="1,4,16", help="buffer sizes in MiB, comma-separated")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--forms", default="leader,sharded", help="hierarchical forms to time, comma-separated")
    parser.add_argument("--chunks", default="0,2048",
                        help="pipeline pieces in KiB to time each form with, comma-separated (0: not pipelined; "
                             "comm.hierarchical.CHUNK_BYTES, 2048, is the default over tcp)")
    parser.add_argument("--placement", choices=("block", "cyclic"), default="block",
                        help="block: ranks 0..k-1 on h0 (hostfile h0:k); cyclic: rank r on host r %% hosts (h0:1, "
                             "mpiexec wraps around), as Slurm's --distribution=cyclic")
    parser.add_argument("--backend", choices=("mpi", "tcp"), default="mpi",
                        help="the world's backend: mpi (mpiexec starts the ranks) or tcp (singa-run --hostfile starts "
                             "them; block placement only)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    forms = args.forms.split(",")
    chunks = [int(c) for c in args.chunks.split(",")]
    if args.worker:
        worker(sizes, args.repeats, args.backend, forms, chunks)
        return 0
    if args.backend == "tcp" and args.placement != "block":
        parser.error("--backend tcp: singa-run fills each host's slots in turn (block placement only)")
    sys.path.insert(0, HELPERS)
    import sim_hosts

    problem = sim_hosts.why_not()
    if problem:
        print(f"cannot simulate hosts here: {problem}", file=sys.stderr)
        return 2
    sim_hosts.remove_stale()
    with sim_hosts.SimCluster(args.hosts) as cluster, tempfile.TemporaryDirectory() as tmp:
        shaping = "unshaped" if args.no_shaping else sim_hosts.slow_links(cluster, rate=args.rate, delay=args.delay)
        slots = args.ranks_per_host if args.placement == "block" else 1
        hostfile = cluster.hostfile(os.path.join(tmp, "hosts"), slots=slots)
        n = args.hosts * args.ranks_per_host
        argv = [os.path.abspath(__file__), "--worker", "--sizes", args.sizes, "--repeats", str(args.repeats),
                "--backend", args.backend, "--forms", args.forms, "--chunks", args.chunks]
        print(f"{args.hosts} simulated hosts x {args.ranks_per_host} ranks, {args.placement} placement, every "
              f"link: {shaping}", flush=True)
        if args.backend == "mpi":
            command = cluster.mpiexec_command(hostfile, n, [sys.executable, *argv])
        else:  # singa-run in the launcher host, starting each host's ranks through the namespace wrapper
            command = ["ip", "netns", "exec", cluster.ns("launcher"), sim_hosts.WRAPPER, "--here", "launcher",
                       sys.executable, "-m", "singa_lite.run", "--hostfile", hostfile, "--launcher-exec",
                       sim_hosts.WRAPPER, "--master-addr", cluster.address["h0"], "--backend", "tcp", "--no-prefix",
                       *argv]
        code, out, seconds = cluster.run(command, timeout=900)
        print(out, end="")
        print(f"({seconds:.0f} s)")
        return code


if __name__ == "__main__":
    sys.exit(main())
