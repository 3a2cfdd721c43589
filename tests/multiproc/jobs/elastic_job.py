"""A restartable job for tests/multiproc/test_elastic_restart.py: ranks "train" a state that counts the samples
they consume (w += x[idx] summed over the ranks), commit it with ElasticState every few steps, and record the
indices each commit covers. `KILL_AT=<step>` makes rank 1 of generation 0 SIGKILL itself when it reaches that
step (after its step's collective, before the next commit); with `DOWN_FILE=<path>` it first writes its
host's name (SIM_HOST, set by the test's --launcher-exec) there, and that --launcher-exec then treats the host
as gone.

    singa-run -np 2 --max-restarts 1 elastic_job.py CKPT LOGDIR N BATCH EVERY EPOCHS
"""
import os
import signal
import sys

import numpy as np

from singa_lite import dist, tensor
from singa_lite.checkpoint import ElasticState
from singa_lite.comm.env import generation
from singa_lite.data import ElasticSampler

ckpt, logdir = sys.argv[1], sys.argv[2]
n, batch, every, epochs = map(int, sys.argv[3:7])
kill_at = int(os.environ.get("KILL_AT", "-1"))
comm = dist.init()
rank, world, gen = comm.rank, comm.world_size, generation()
x = np.arange(n, dtype=np.float64)
w = tensor.from_numpy(np.zeros(epochs, np.float32))  # per epoch: the sum of the indices consumed
sampler = ElasticSampler(n, rank, world, batch, seed=7)
state = ElasticState(ckpt, model={"w": w}, sampler=sampler, communicator=comm, every=every)
start = state.resume()
pending = []  # (epoch, indices) consumed since the last commit
for epoch in range(start.epoch, epochs):
    sampler.set_epoch(epoch)
    for idx in sampler:
        part = np.zeros(epochs, np.float32)
        part[epoch] = x[idx].sum()
        t = tensor.from_numpy(part)
        comm.all_reduce(t, "sum")
        w.copy_from_numpy(tensor.to_numpy(w) + tensor.to_numpy(t))
        pending.append((epoch, idx.tolist()))
        if gen == 0 and rank == 1 and state.steps + 1 == kill_at:
            if os.environ.get("DOWN_FILE"):  # its host goes down with it (a --launcher-exec that reads the file)
                with open(os.environ["DOWN_FILE"], "a") as f:
                    f.write(os.environ.get("SIM_HOST", "") + "\n")
            os.kill(os.getpid(), signal.SIGKILL)
        if state.step():
            with open(os.path.join(logdir, f"gen{gen}.rank{rank}.txt"), "a") as f:
                for e, ids in pending:
                    f.write(f"{e} {' '.join(map(str, ids))}\n")
            pending.clear()
if pending:  # what the last steps consumed: committed by a final commit
    state.commit()
    with open(os.path.join(logdir, f"gen{gen}.rank{rank}.txt"), "a") as f:
        for e, ids in pending:
            f.write(f"{e} {' '.join(map(str, ids))}\n")
if rank == 0:
    print(f"done generation {gen} world {world} resumed {start.resumed} at step {start.step} "
          f"w {tensor.to_numpy(w).tolist()}", flush=True)
