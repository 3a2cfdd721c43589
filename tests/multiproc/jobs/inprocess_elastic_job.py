"""An in-process elastic job (dist.elastic.run) for tests/multiproc/test_elastic_inprocess.py and
tests/multihost/test_elastic_hosts.py: a small classifier trained with DistOpt on a synthetic 4-class problem,
an ElasticSampler and an in-memory commit every EVERY steps. Each process records, at every commit, the indices
it consumed since its previous one (LOGDIR/<pid>.txt: "epoch idx idx ..."), and the job keeps, in the commit's
extra, the sum of the indices the job consumed per epoch: after any failure both must cover every sample of
every epoch exactly once.

    RANK=r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=P python inprocess_elastic_job.py LOGDIR N BATCH EVERY EPOCHS

KILL_AT=<step>: the process of launch rank KILL_RANK (default 1) SIGKILLs itself on reaching that step (after
the step's collectives, before its commit). MIN_NP, MAX_NP: dist.elastic.init's. STEP_SLEEP: seconds of sleep
per step (to give a test time to act). WAIT_JOIN=<n>: while fewer than n ranks train, each commit waits (up to
120 s) until a process waits to join, so that a replacement started by singa-run joins whatever the load.
HIERARCHICAL=1: DistOpt(hierarchical=True) (across hosts: within each host over shared memory, between hosts over
tcp). Prints "started rank r pid p host h", then per regroup "regrouped ...",
then on each process "threads rank r <Python thread names> tasks <OS threads> shm <shared-memory
segments mapped>", and on rank 0 "done world W steps S
accuracy A resets R sums [...]".
"""
import os
import signal
import socket
import sys
import threading
import time

import numpy as np

from singa_lite import autograd, dist, layer, model, opt, tensor
from singa_lite.data import ElasticSampler

logdir = sys.argv[1]
n, batch, every, epochs = map(int, sys.argv[2:6])
kill_at = int(os.environ.get("KILL_AT", "-1"))
kill_rank = int(os.environ.get("KILL_RANK", "1"))
launch_rank = int(os.environ["RANK"])
step_sleep = float(os.environ.get("STEP_SLEEP", "0"))
wait_join = int(os.environ.get("WAIT_JOIN", "0"))

rng = np.random.default_rng(0)
centers = rng.standard_normal((4, 8)).astype(np.float32) * 2.0
labels = rng.integers(0, 4, n)
x = (centers[labels] + rng.standard_normal((n, 8)).astype(np.float32)).astype(np.float32)
y = np.eye(4, dtype=np.float32)[labels]


class Net(model.Model):
    def __init__(self):
        super().__init__()
        self.l1 = layer.Linear(16)
        self.l2 = layer.Linear(4)

    def forward(self, inputs):
        return self.l2(autograd.relu(self.l1(inputs)))

    def train_one_batch(self, inputs, target):
        out = self.forward(inputs)
        loss = autograd.softmax_cross_entropy(out, target)
        self.optimizer(loss)
        return out, loss


comm = dist.elastic.init(min_np=int(os.environ.get("MIN_NP", "1")),
                         max_np=int(os.environ["MAX_NP"]) if os.environ.get("MAX_NP") else None)
print(f"started rank {launch_rank} pid {os.getpid()} host {socket.gethostname()} world {comm.world_size}",
      flush=True)
np.random.seed(1)  # the same initial weights in every process (the first sync gives rank 0's anyway)
net = Net()
sgd = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm,
                  hierarchical=os.environ.get("HIERARCHICAL") == "1")
net.set_optimizer(sgd)
net.compile([tensor.from_numpy(x[:2])], is_train=True)
sampler = ElasticSampler(n, comm.rank, comm.world_size, batch, seed=3)
state = dist.elastic.State(model=net, optimizer=sgd, sampler=sampler, every=every)
log = open(os.path.join(logdir, f"{os.getpid()}.txt"), "a")


@dist.elastic.run
def train(state):
    sums = np.array(state.extra.get("sums", [0.0] * epochs), np.float64)
    pending = []  # (epoch, indices) consumed since this process's last commit; lost when a failure comes
    if state.resets:
        print(f"regrouped rank {state.rank} of {state.world_size} at step {state.steps} epoch {state.epoch}",
              flush=True)
    for epoch in range(state.epoch, epochs):
        state.sampler.set_epoch(epoch)
        for idx in state.sampler:
            if len(idx):
                net.train_one_batch(tensor.from_numpy(x[idx]), tensor.from_numpy(y[idx]))
            else:  # fewer indices than ranks left: no data, the same collectives
                net.train_one_batch(tensor.from_numpy(x[:1]), tensor.from_numpy(np.zeros((1, 4), np.float32)))
            part = tensor.from_numpy(np.array([float(x_i) for x_i in [idx.sum()]], np.float64))
            state.communicator.all_reduce(part, "sum")
            sums[epoch] += float(tensor.to_numpy(part)[0])
            pending.append((epoch, idx.tolist()))
            if launch_rank == kill_rank and state.steps + 1 == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if step_sleep:
                time.sleep(step_sleep)
            if state.world_size < wait_join and (state.steps + 1) % every == 0:  # the next commit lets it in
                deadline = time.monotonic() + 120
                while not dist.elastic.current().waiting() and time.monotonic() < deadline:
                    time.sleep(0.05)
            committed = False
            try:
                committed = state.step(extra={"sums": sums.tolist()})
            finally:
                if committed or state.committed_step == state.steps:  # a commit that lets joiners in raises
                    for e, ids in pending:
                        log.write(f"{e} {' '.join(map(str, ids))}\n")
                    log.flush()
                    pending.clear()
        try:
            state.commit(extra={"sums": sums.tolist()})
        finally:
            if state.committed_step == state.steps:
                for e, ids in pending:
                    log.write(f"{e} {' '.join(map(str, ids))}\n")
                log.flush()
                pending.clear()
    return sums


sums = train(state)
out = net.forward(tensor.from_numpy(x))
accuracy = float((tensor.to_numpy(out).argmax(1) == labels).mean())
threads = sorted(t.name for t in threading.enumerate())
with open("/proc/self/maps") as f:
    segments = len({line.split(None, 5)[-1] for line in f if "memfd:sl_shm/" in line})  # shm backend's segments
print(f"threads rank {state.rank} {' '.join(threads)} tasks {len(os.listdir('/proc/self/task'))} shm {segments}",
      flush=True)
if state.rank == 0:
    print(f"done world {state.world_size} steps {state.steps} accuracy {accuracy:.4f} resets {state.resets} "
          f"sums {sums.tolist()}", flush=True)
dist.elastic.shutdown()
