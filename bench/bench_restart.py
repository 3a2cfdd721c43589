"""Time from a failure to training again, and the cost of a commit (issue 31, item 4), on one host.

A 2-rank job trains the digits CNN of examples/mnist_dist.py with DistOpt, committing its state with
checkpoint.ElasticState every --every steps; in generation 0 rank 1 SIGKILLs itself at step --kill-at. The
launcher (singa-run --max-restarts 1, or torchrun --max-restarts 1 when torch is installed) stops the other
rank, starts a new generation, and the ranks resume from the last commit. Each rank prints wall-clock
stamps (time.time(), one host: one clock):

    failure -> launcher noticed -> new ranks started -> joined (dist.init) -> resumed (load) -> first step done

torchrun runs with ``--nnodes 1:2`` (elastic) and ``--rdzv-conf last_call_timeout=1``: by default its c10d
rendezvous waits 30 s for more nodes whenever fewer than the maximum are there, at the start and at every
restart.

The peer measured in the same run is the job's cold start (launcher started -> first step done of
generation 0). Commits: the median time of a commit against the median time of a training step, and the
bytes a commit writes.

    SINGA_LITE_COMM_TIMEOUT=5 python bench/bench_restart.py --repeats 3

``--launchers inprocess`` measures dist.elastic.run instead (in-process elasticity, no restart): 3 ranks of an
env-launched job (torchrun's variables, shm) train the same CNN, committing in memory every --every steps
(dist.elastic.State); launch rank 2 SIGKILLs itself at step --kill-at; the 2 survivors regroup and go on. Stamps:

    failure -> survivors caught the error -> regrouped (new round, new communicator) -> restored -> first step done

The peers measured in the same run: the job's cold start, and for the commits a training step (the ratio of a
commit to --every steps is what committing costs the training).

    SINGA_LITE_COMM_TIMEOUT=5 python bench/bench_restart.py --launchers inprocess --every 10 --kill-at 23

``--launchers elastic`` runs the same job under ``singa-run --elastic -np 3`` (singa-run serves the store) and
kills launch rank 0 instead, the first round's rank 0: the survivors' round is decided by another member.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

JOB = r'''
import os, signal, sys, time
T0 = time.time()
sys.path.insert(0, os.path.join(sys.argv[1], "examples"))
import numpy as np
from singa_lite import autograd, device, opt, tensor
from singa_lite.checkpoint import ElasticState
from singa_lite.comm.env import generation
from singa_lite.data import ElasticSampler, load_digits
from train_cnn import CNN

ckpt, every, kill_at = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
gen = generation()
def stamp(what):
    os.write(1, f"STAMP gen={gen} rank={os.environ['RANK']} {what} {time.time():.6f}\n".encode())  # one write
stamp(f"started {T0:.6f} imported")
device.set_num_threads(1)
sgd = opt.DistOpt(opt.SGD(lr=0.05, momentum=0.9))
rank, world = sgd.global_rank, sgd.world_size
stamp("joined")
(x, y), _ = load_digits(0)
model = CNN()
autograd.training = False
model.forward(tensor.from_numpy(x[:1]))
sgd.broadcast_parameters(model.get_params() if hasattr(model, "get_params") else
                         {f"{n}.{k}": v for n, l in vars(model).items() if hasattr(l, "get_params")
                          for k, v in l.get_params().items()})
states = {f"{n}.{k}": v for n, l in vars(model).items() if hasattr(l, "get_states")
          for k, v in l.get_states().items()} if not hasattr(model, "get_states") else model.get_states()
sampler = ElasticSampler(len(y), rank, world, 32, seed=0)
stamp("ready")
state = ElasticState(ckpt, model=states, optimizer=sgd, sampler=sampler, every=every, log=None)
start = state.resume()
stamp(f"resumed step={start.step}")
autograd.training = True
first = True
for epoch in range(start.epoch, 2):
    sampler.set_epoch(epoch)
    for idx in sampler:
        t = time.perf_counter()
        out = model.forward(tensor.from_numpy(x[idx]))
        loss = autograd.softmax_cross_entropy(out, tensor.from_numpy(y[idx]))
        sgd.backward_and_update(loss)
        loss.item()
        step_s = time.perf_counter() - t
        if first:
            stamp("first-step")
            first = False
        if gen == 0 and rank == 1 and state.steps + 1 == kill_at:
            stamp("failure")
            os.kill(os.getpid(), signal.SIGKILL)
        t = time.perf_counter()
        committed = state.step()
        if committed and rank == 0:
            os.write(1, f"COMMIT {time.perf_counter() - t:.6f} STEP {step_s:.6f}\n".encode())
'''

INPROCESS_JOB = r'''
import os, signal, sys, time
T0 = time.time()
sys.path.insert(0, os.path.join(sys.argv[1], "examples"))
import numpy as np
from singa_lite import autograd, device, dist, opt, tensor
from singa_lite.comm import CommError
from singa_lite.data import ElasticSampler, load_digits
from train_cnn import CNN

every, kill_at, launch_rank = int(sys.argv[2]), int(sys.argv[3]), int(os.environ["RANK"])
def stamp(what):
    os.write(1, f"STAMP rank={launch_rank} {what} {time.time():.6f}\n".encode())
stamp(f"started {T0:.6f} imported")
device.set_num_threads(1)
comm = dist.elastic.init(min_np=1)
sgd = opt.DistOpt(opt.SGD(lr=0.05, momentum=0.9), communicator=comm)
stamp("joined")
(x, y), _ = load_digits(0)
model = CNN()
autograd.training = False
model.forward(tensor.from_numpy(x[:1]))
states = {f"{n}.{k}": v for n, l in vars(model).items() if hasattr(l, "get_states") for k, v in l.get_states().items()}
sampler = ElasticSampler(len(y), comm.rank, comm.world_size, 32, seed=0)
state = dist.elastic.State(model=states, optimizer=sgd, sampler=sampler, every=every, log=None)
stamp("ready")
done_steps = []

@dist.elastic.run
def train(state):
    if state.resets:
        stamp("restored")
    first = True
    autograd.training = True
    for epoch in range(state.epoch, 2):
        state.sampler.set_epoch(epoch)
        for idx in state.sampler:
            t = time.perf_counter()
            try:
                out = model.forward(tensor.from_numpy(x[idx]))
                loss = autograd.softmax_cross_entropy(out, tensor.from_numpy(y[idx]))
                sgd.backward_and_update(loss)
            except CommError:
                stamp("caught")
                raise
            loss.item()
            step_s = time.perf_counter() - t
            if first:
                stamp(f"first-step resets={state.resets}")
                first = False
            if launch_rank == int(os.environ.get("KILL_RANK", "2")) and state.steps + 1 == kill_at:
                stamp("failure")
                os.kill(os.getpid(), signal.SIGKILL)
            t = time.perf_counter()
            committed = state.step()
            if committed and state.rank == 0:
                os.write(1, f"COMMIT {time.perf_counter() - t:.6f} STEP {step_s:.6f}\n".encode())
            elif state.rank == 0:
                done_steps.append(step_s)

train(state)
dist.elastic.shutdown()
'''


def inprocess_run(every: int, kill_at: int, workdir: str, backend: str = "shm", elastic: bool = False) -> dict:
    """One 3-rank dist.elastic job on this host (env-launched, `backend`); rank 2 dies at step kill_at. elastic:
    under singa-run --elastic, and launch rank 0 dies."""
    import socket

    job = os.path.join(workdir, "inprocess_job.py")
    with open(job, "w") as f:
        f.write(INPROCESS_JOB)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "SINGA_LITE_COMM_TIMEOUT": os.environ.get("SINGA_LITE_COMM_TIMEOUT", "5"),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "3", "OMP_NUM_THREADS": "1"}
    for k in ("SINGA_LITE_HOLDER", "SINGA_LITE_JOB_ID"):
        env.pop(k, None)
    env["SINGA_LITE_COMM_BACKEND"] = backend
    launched = time.time()
    if elastic:
        env = {k: v for k, v in env.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")}
        proc = subprocess.run([sys.executable, "-m", "singa_lite.run", "--elastic", "-np", "3", "--no-prefix", job,
                               ROOT, str(every), str(kill_at)], env={**env, "KILL_RANK": "0"}, capture_output=True,
                              text=True, cwd=workdir, timeout=600)
        out = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise SystemExit(f"elastic: the job failed (exit {proc.returncode}):\n{out}")
    else:
        procs = [subprocess.Popen([sys.executable, job, ROOT, str(every), str(kill_at)], env={**env, "RANK": str(r)},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=workdir)
                 for r in range(3)]
        out = "".join(p.communicate(timeout=600)[0] for p in procs)
        if [p.returncode for p in procs] != [0, 0, -signal.SIGKILL]:
            raise SystemExit(f"inprocess: the job did not end as expected ({[p.returncode for p in procs]}):\n{out}")
    stamps = {}
    for m in re.finditer(r"STAMP rank=(\d+) (\S+)(?: [^\n]*?)? (\d+\.\d+)$", out, re.M):
        stamps.setdefault(m.group(2), []).append(float(m.group(3)))
    firsts = [float(t) for t in re.findall(r"first-step resets=0 (\d+\.\d+)$", out, re.M)]
    again = [float(t) for t in re.findall(r"first-step resets=1 (\d+\.\d+)$", out, re.M)]
    commits = [(float(a), float(b)) for a, b in re.findall(r"COMMIT (\S+) STEP (\S+)", out)]
    failure = stamps["failure"][0]
    caught = [t for t in stamps["caught"] if t > failure]
    return {
        "cold start -> first step": max(firsts) - launched,
        "failure -> first step again": max(again) - failure,
        "  failure -> survivors caught it": max(caught) - failure,
        "  caught -> regrouped and restored": max(stamps["restored"]) - max(caught),
        "  restored -> first step": max(again) - max(stamps["restored"]),
        "commit (median)": statistics.median(c for c, _ in commits),
        "step (median)": statistics.median(s for _, s in commits),
    }


def one_run(launcher: str, every: int, kill_at: int, workdir: str, backend: str = "shm") -> dict:
    if launcher in ("inprocess", "elastic"):
        return inprocess_run(every, kill_at, workdir, backend, elastic=launcher == "elastic")
    job = os.path.join(workdir, "job.py")
    with open(job, "w") as f:
        f.write(JOB)
    ckpt = os.path.join(workdir, "ckpt")
    shutil.rmtree(ckpt, ignore_errors=True)
    env = {**os.environ, "SINGA_LITE_COMM_TIMEOUT": os.environ.get("SINGA_LITE_COMM_TIMEOUT", "5")}
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SINGA_LITE_HOLDER", "SINGA_LITE_JOB_ID"):
        env.pop(k, None)
    if launcher == "singa-run":
        cmd = [sys.executable, "-m", "singa_lite.run", "-np", "2", "--max-restarts", "1", "--restart-delay", "0"]
    else:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
               "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--monitor-interval", "0.1", "--rdzv-conf", "last_call_timeout=1"]
    launched = time.time()
    proc = subprocess.run(cmd + [job, ROOT, ckpt, str(every), str(kill_at)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=workdir)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"{launcher}: the job failed (exit {proc.returncode}):\n{out}")
    stamps = {}
    for m in re.finditer(r"STAMP gen=(\d+) rank=(\d+) (\S+)(?: [^\n]*?)? (\d+\.\d+)$", out, re.M):
        stamps.setdefault((int(m.group(1)), m.group(3)), []).append(float(m.group(4)))
    for m in re.finditer(r"STAMP gen=(\d+) rank=(\d+) started (\d+\.\d+)", out):
        stamps.setdefault((int(m.group(1)), "process"), []).append(float(m.group(3)))
    commits = [(float(a), float(b)) for a, b in re.findall(r"COMMIT (\S+) STEP (\S+)", out)]
    failure = stamps[(0, "failure")][0]
    return {
        "cold start -> first step": max(stamps[(0, "first-step")]) - launched,
        "failure -> first step again": max(stamps[(1, "first-step")]) - failure,
        "  failure -> new processes": min(stamps[(1, "process")]) - failure,
        "  new processes -> joined": max(stamps[(1, "joined")]) - min(stamps[(1, "process")]),
        "  joined -> model and data ready": max(stamps[(1, "ready")]) - max(stamps[(1, "joined")]),
        "  ready -> resumed (load)": max(stamps[(1, "resumed")]) - max(stamps[(1, "ready")]),
        "  resumed -> first step": max(stamps[(1, "first-step")]) - max(stamps[(1, "resumed")]),
        "commit (median)": statistics.median(c for c, _ in commits),
        "step (median)": statistics.median(s for _, s in commits),
        "commit bytes": sum(os.path.getsize(os.path.join(ckpt, n)) for n in os.listdir(ckpt)
                            if os.path.isfile(os.path.join(ckpt, n))),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--every", type=int, default=5, help="commit every this many steps")
    p.add_argument("--kill-at", type=int, default=12, help="the step at which rank 1 of generation 0 dies")
    p.add_argument("--launchers", default="singa-run,torchrun",
                   help="singa-run, torchrun, inprocess (dist.elastic), elastic (the same under singa-run --elastic)")
    p.add_argument("--backend", default="shm", choices=("shm", "tcp"), help="inprocess: the backend")
    args = p.parse_args(argv)
    launchers = args.launchers.split(",")
    if {"inprocess", "elastic"} & set(launchers) and args.kill_at % args.every == 0:
        raise SystemExit("--kill-at must fall between two commits (not a multiple of --every)")
    if "torchrun" in launchers:
        try:
            import torch.distributed.run  # noqa: F401
        except ImportError:
            print("torch is not installed: torchrun left out")
            launchers.remove("torchrun")
    print(f"SINGA_LITE_COMM_TIMEOUT={os.environ.get('SINGA_LITE_COMM_TIMEOUT', '5')}, {args.repeats} repeats, "
          f"median (min-max); load average {os.getloadavg()[0]:.2f}")
    for launcher in launchers:
        runs = []
        with tempfile.TemporaryDirectory() as workdir:
            for _ in range(args.repeats):
                runs.append(one_run(launcher, args.every, args.kill_at, workdir, args.backend))
        print(f"\n{launcher}" + (f" ({args.backend})" if launcher in ("inprocess", "elastic") else ""))
        for key in runs[0]:
            values = [r[key] for r in runs]
            if key == "commit bytes":
                print(f"  {key:32s} {statistics.median(values) / 1024:.0f} KiB")
            else:
                print(f"  {key:32s} {statistics.median(values):8.3f} s  ({min(values):.3f}-{max(values):.3f})")
        ratio = [r["commit (median)"] / r["step (median)"] for r in runs]
        again = [r["failure -> first step again"] / r["cold start -> first step"] for r in runs]
        print(f"  {'commit / training step':32s} {statistics.median(ratio):8.2f}x")
        print(f"  {'restart / cold start':32s} {statistics.median(again):8.2f}x")
        if launcher in ("inprocess", "elastic"):
            cost = [r["commit (median)"] / (args.every * r["step (median)"]) for r in runs]
            print(f"  {'commit / (every x step)':32s} {100 * statistics.median(cost):8.2f} %  (committing every "
                  f"{args.every} steps)")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
