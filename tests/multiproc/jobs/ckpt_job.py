"""One phase of the resume test (tests/multiproc/test_checkpoint_resume.py), run on every rank under mpiexec or
singa-run (``python ckpt_job.py <phase> <workdir>``), or started by Python multiprocessing as in SINGA's seed
scripts (``python ckpt_job.py --multiprocessing <phase> <workdir>``: 2 spawned processes sharing a holder).

- ``full``: STEPS uninterrupted steps;
- ``first``: STOP steps, then a checkpoint into <workdir>/ckpt-<method>, then exit;
- ``resume``: new processes load that checkpoint and run the remaining steps;
- ``errors``: a load where rank 1's file is missing (<workdir>/ckpt-missing) and a save that fails on
  rank 0 only (into <workdir>/ckpt-keep): every rank must raise, none may hang, the old checkpoint stays.

Each phase does this for every DistOpt method in METHODS and writes <workdir>/<phase>-<method>-rank<r>.npz
(the losses of its steps and every model and optimizer state at its end). The model has batch
normalisation and dropout and the data is shuffled by a DistributedSampler and perturbed by a numpy
generator, under a learning-rate schedule, so a resume that missed any part of the state would differ.
The stop falls in the middle of the second epoch."""
import os
import sys

import numpy as np

from singa_lite import autograd, checkpoint, device, dist, layer, model, opt, tensor  # noqa: F401
from singa_lite.data import DistributedSampler, batches

STEPS, STOP, BATCH = 12, 7, 4  # 40 samples, 2 ranks: 5 batches an epoch per rank
METHODS = {
    "plain": ("backward_and_update", {"threshold": 50}),
    "half": ("backward_and_update_half", {"threshold": 50}),
    "partial": ("backward_and_partial_update", {"threshold": 40}),
    "topk": ("backward_and_sparse_update", {"threshold": 40, "spars": 0.2, "topK": True}),
    "threshold": ("backward_and_sparse_update", {"threshold": 40, "spars": 0.02, "topK": False}),
}


class Net(model.Model):
    def __init__(self, method: str, kwargs: dict):
        super().__init__()
        self.conv = layer.Conv2d(3, 3, padding=1)
        self.bn = layer.BatchNorm2d()
        self.relu = layer.ReLU()
        self.drop = layer.Dropout(0.3)
        self.flat = layer.Flatten()
        self.fc = layer.Linear(4)
        self.loss = layer.SoftMaxCrossEntropy()
        self.method, self.kwargs = method, kwargs

    def forward(self, x):
        return self.fc(self.flat(self.drop(self.relu(self.bn(self.conv(x))))))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        getattr(self.optimizer, self.method)(loss, **self.kwargs)
        return out, loss


def build(comm, name: str):
    """The data, the model with its DistOpt, the sampler and the noise generator of rank comm.rank."""
    method, kwargs = METHODS[name]
    r = comm.rank
    data = np.random.default_rng(0)
    x = data.standard_normal((40, 1, 5, 5)).astype(np.float32)
    y = data.integers(0, 4, 40).astype(np.int32)
    device.get_default_device().SetRandSeed(100 + r)  # the ranks' dropout masks differ
    noise = np.random.default_rng(7 + r)
    net = Net(method, kwargs)
    sgd = opt.DistOpt(opt.SGD(lr=opt.StepDecay(0.1, step_size=4, gamma=0.5), momentum=0.9), communicator=comm)
    net.set_optimizer(sgd)
    net.compile([tensor.Tensor((BATCH, 1, 5, 5))], is_train=True)
    sampler = DistributedSampler(len(x), r, comm.world_size, shuffle=True, seed=3)
    return x, y, net, sgd, sampler, noise


def run(comm, name: str, phase: str, workdir: str) -> None:
    x, y, net, sgd, sampler, noise = build(comm, name)
    r = comm.rank
    ckpt = os.path.join(workdir, f"ckpt-{name}")
    step, losses = 0, []
    if phase == "resume":
        step = checkpoint.load(ckpt, net, sgd, sampler, rng=noise)["step"]
    stop = STOP if phase == "first" else STEPS
    step, losses = train(net, sgd, sampler, noise, x, y, step, stop)
    if phase == "first":
        checkpoint.save(ckpt, net, sgd, sampler, rng=noise, extra={"step": step})
    states = {f"model/{k}": tensor.to_numpy(v) for k, v in net.get_states().items()}
    states.update({f"momentum/{k}": tensor.to_numpy(v) for k, v in sgd.opt.moments.items()} if hasattr(
        sgd.opt, "moments") else {})
    if phase == "first":  # what a resharded load averages (test_checkpoint_resume's reshard test)
        states.update({"residual/" + ",".join(k): tensor.to_numpy(v) for k, v in sgd._residuals.items()})
    np.savez(os.path.join(workdir, f"{phase}-{name}-rank{r}.npz"), losses=np.array(losses), **states)


def train(net, sgd, sampler, noise, x, y, step: int, stop: int):
    losses = []
    while step < stop:
        for epoch in range(sampler.epoch, 100):
            sampler.set_epoch(epoch)
            for xb, yb in batches(x, y, sampler, BATCH):
                xb = xb + noise.normal(0, 0.01, xb.shape).astype(np.float32)
                _, loss = net(tensor.from_numpy(xb), tensor.from_numpy(yb))
                losses.append(tensor.to_numpy(loss).copy())
                step += 1
                if step == stop:
                    break
            if step == stop:
                break
    return step, losses


def reshard(comm, name: str, workdir: str) -> None:
    """Loads the 2-rank checkpoint of the first phase on comm.world_size ranks (not 2): refused without
    reshard=True; with it, every rank holds rank 0's model and momenta, the mean of the 2 ranks' residuals,
    the sampler at the same fraction of the epoch, and training goes on."""
    x, y, net, sgd, sampler, noise = build(comm, name)
    ckpt = os.path.join(workdir, f"ckpt-{name}")
    try:
        checkpoint.load(ckpt, net, sgd, sampler)
    except checkpoint.CheckpointError as e:
        assert f"saved by 2 rank(s), loaded by {comm.world_size}" in str(e) and "reshard=True" in str(e), e
    else:
        raise AssertionError("a load on another number of ranks was not refused")
    step = checkpoint.load(ckpt, net, sgd, sampler, rng=noise, reshard=True)["step"]
    saved = [dict(np.load(os.path.join(workdir, f"first-{name}-rank{r}.npz"))) for r in range(2)]
    for k, v in net.get_states().items():
        np.testing.assert_array_equal(tensor.to_numpy(v), saved[0][f"model/{k}"], err_msg=f"{name}: {k}")
    for k, v in sgd.opt.moments.items():
        np.testing.assert_array_equal(tensor.to_numpy(v), saved[0][f"momentum/{k}"], err_msg=f"{name}: {k}")
    want = {k[len("residual/"):]: (saved[0][k].astype(np.float64) + saved[1][k]) / 2 for k in saved[0]
            if k.startswith("residual/")}
    got = {",".join(k): tensor.to_numpy(v) for k, v in sgd._residuals.items()}
    assert sorted(got) == sorted(want), (name, sorted(got), sorted(want))
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7, err_msg=f"{name}: residual {k}")
    # STOP = 7 steps of 4 on 20 samples a rank: epoch 1, 8 of 20 done; the same fraction of the new share
    per_rank = -(-len(x) // comm.world_size)
    assert (sampler.epoch, sampler.position) == (1, round(8 * per_rank / 20)), (name, sampler.state_dict())
    _, losses = train(net, sgd, sampler, noise, x, y, step, STEPS)
    assert len(losses) == STEPS - STOP and all(np.isfinite(v).all() for v in losses), (name, losses)


def errors(comm, workdir: str) -> None:
    net = Net(*METHODS["plain"])
    sgd = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm)
    net.set_optimizer(sgd)
    net.compile([tensor.Tensor((BATCH, 1, 5, 5))], is_train=True)
    # This job continues ckpt-keep's run, as a resumed job does: so its failing save below gets as far as the
    # bad extra even when its launcher gives it a job id other than the first job's (a fresh singa-run).
    checkpoint.load(os.path.join(workdir, "ckpt-keep"), net, sgd)
    for what, call in (
            ("load", lambda: checkpoint.load(os.path.join(workdir, "ckpt-missing"), net, sgd)),
            ("save", lambda: checkpoint.save(os.path.join(workdir, "ckpt-keep"), net, sgd,
                                             extra={"bad": np.array([None])} if comm.rank == 0 else {}))):
        try:
            call()
        except checkpoint.CheckpointError as e:
            print(f"rank {comm.rank} {what} CheckpointError: {e}", flush=True)
        else:
            raise AssertionError(f"{what} did not fail")
    assert checkpoint.load(os.path.join(workdir, "ckpt-keep"), net, sgd)["step"] == STOP


def main(phase: str, workdir: str, comm=None) -> None:
    comm = comm or dist.init(timeout=60)
    for name in (METHODS if phase not in ("errors", "reshard") else ()):
        run(comm, name, phase, workdir)
    if phase == "reshard":
        for name in METHODS:
            reshard(comm, name, workdir)
    if phase == "errors":
        errors(comm, workdir)
    comm.barrier()
    print(f"OK {phase} rank {comm.rank}", flush=True)


def spawned(rank: int, holder, phase: str, workdir: str) -> None:
    main(phase, workdir, dist.init(holder=holder, rank=rank, world_size=2, timeout=60))


def with_multiprocessing(phase: str, workdir: str) -> int:
    import multiprocessing as mp

    holder = dist.NcclIdHolder()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=spawned, args=(r, holder, phase, workdir)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=100)
    for p in procs:  # one that did not finish in time is killed: the test never hangs
        if p.is_alive():
            p.kill()
            p.join()
    return max(abs(p.exitcode) for p in procs)


if __name__ == "__main__":
    if sys.argv[1] == "--multiprocessing":
        sys.exit(with_multiprocessing(sys.argv[2], sys.argv[3]))
    main(sys.argv[1], sys.argv[2])
