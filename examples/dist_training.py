"""The data-parallel training driver shared by examples/mnist_dist.py and examples/resnet_cifar10.py:
SINGA's training loop with DistOpt, its launchers and its five synchronisation options. An example supplies
a model factory and its data; this module does the rest.

Launchers (``--launcher``):
  multiprocessing  the script starts --world-size ranks itself, sharing an NcclIdHolder (SINGA's pattern)
  mpi              the script was started by ``mpiexec -n N``
  singa-run        the script was started by ``singa-run -np N`` (also with --max-restarts)
  env              the script was started by torchrun, srun (Slurm) or a Kubernetes operator: dist.init() reads
                   their variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; SLURM_PROCID...)
Devices (``--device``): cpu, cuda (one GPU per rank: cuda:<local rank>, NCCL between them) or auto (cuda
when this build sees a GPU). Every epoch, the ranks share a shuffled permutation of the training set step by
step (singa_lite.data.ElasticSampler: each step takes the next batch-size x ranks samples); rank 0 prints
progress, and each epoch's loss and accuracy are reduced over all ranks.

``--checkpoint DIR`` commits the whole training state there at the end of every epoch and every
--commit-every steps (singa_lite.checkpoint.ElasticState) and, when DIR already holds a commit, resumes from
it by itself, on any number of ranks: after a failure under ``singa-run --max-restarts`` or ``torchrun
--max-restarts`` the new ranks go on from the last commit, with exactly the samples of the epoch not yet
committed (docs/elastic.md).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from singa_lite import autograd, checkpoint, device, opt, singa_wrap, tensor
from singa_lite.data import ElasticSampler, data_partition

DIST_OPTIONS = ("plain", "half", "partialUpdate", "sparseTopK", "sparseThreshold")
LAUNCHERS = ("multiprocessing", "mpi", "singa-run", "env")


def argument_parser(doc: str, *, epochs: int, batch_size: int, lr: float) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--launcher", choices=LAUNCHERS, default="multiprocessing",
                   help="who starts the ranks: this script (multiprocessing), mpiexec, singa-run, or env: torchrun, "
                        "Slurm's srun or a Kubernetes operator (their variables)")
    p.add_argument("--world-size", type=int, default=2, help="ranks to start (multiprocessing launcher)")
    p.add_argument("--dist-option", choices=DIST_OPTIONS, default="plain")
    p.add_argument("--spars", type=float, default=0.05,
                   help="sparse options: fraction of entries sent (sparseTopK) or magnitude threshold")
    p.add_argument("--threshold", type=int, default=2097152,
                   help="DistOpt's fusion threshold in elements (partialUpdate: the partition size)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="cuda: one GPU per rank (cuda:<local rank>), NCCL between ranks")
    p.add_argument("--start-method", choices=("auto", "fork", "spawn"), default="auto",
                   help="how the multiprocessing launcher starts ranks: auto is spawn for GPU ranks (a forked child "
                        "of a process that initialised CUDA cannot use the GPU), fork otherwise")
    p.add_argument("--data-dir", help="directory with the dataset's files (default: the built-in data)")
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--batch-size", type=int, default=batch_size, help="per rank")
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="threads per rank (default: cores / ranks)")
    p.add_argument("--plot", metavar="PNG", help="write loss and accuracy curves to this file (matplotlib)")
    p.add_argument("--checkpoint", metavar="DIR",
                   help="commit the training state to DIR after every epoch (and every --commit-every steps); "
                        "resume from DIR's last commit when it holds one, on any number of ranks")
    p.add_argument("--commit-every", type=int, default=0, metavar="K",
                   help="with --checkpoint: commit every K steps too (0: at the end of each epoch only)")
    return p


def check_args(p: argparse.ArgumentParser, args) -> None:
    if args.world_size < 1 or args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        p.error("--world-size, --epochs and --batch-size must be >= 1 and --lr > 0")
    if args.commit_every < 0 or (args.commit_every and not args.checkpoint):
        p.error("--commit-every K needs --checkpoint DIR and K >= 0")
    # Asked without initialising CUDA: this process may go on to start the ranks (launch), and children of a
    # process that has initialised CUDA cannot use the GPU. The ranks check the GPU for real.
    if args.device == "cuda" and not device.cuda_maybe_available():
        p.error(f"--device cuda: no usable GPU: {device.cuda_absent_reason()}")


def start_method(args) -> str:
    """How launch() starts the ranks: "spawn" (a fresh interpreter) when they may use a GPU, since a forked child
    inherits the parent's CUDA state and fails in its first CUDA call if the parent had initialised CUDA (a
    library it imported, a check before the launch); "fork" for CPU ranks, which start faster that way."""
    if args.start_method != "auto":
        return args.start_method
    wanted = getattr(args, "device", "cpu")  # examples without --device (dist_matmul) run on the CPU
    gpu = wanted == "cuda" or (wanted == "auto" and device.cuda_maybe_available())
    return "spawn" if gpu else "fork"


def launch(args, train) -> int:
    """Runs train(args, nccl_id, gpu_num, gpu_per_node) on every rank; returns the exit code. With the spawn
    start method `train` must be importable by name (a module-level function of the script, as in the examples),
    and the script must start the ranks only under ``if __name__ == "__main__"``."""
    if args.launcher != "multiprocessing":  # mpiexec / singa-run / torchrun... started the ranks: dist.init finds them
        train(args)
        return 0
    import multiprocessing

    context = multiprocessing.get_context(start_method(args))
    nccl_id = singa_wrap.NcclIdHolder()  # as SINGA's page: created in the parent, passed to every rank
    procs = [context.Process(target=train, args=(args, nccl_id, gpu_num, args.world_size))
             for gpu_num in range(args.world_size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    failed = [r for r, p in enumerate(procs) if p.exitcode != 0]
    if failed:
        print(f"ranks {failed} failed (exit codes {[procs[r].exitcode for r in failed]})", file=sys.stderr)
        return 1
    return 0


def distributed_optimizer(args, sgd, nccl_id=None, gpu_num=None, gpu_per_node=None):
    """(DistOpt, device): the ranks joined on CPU tensors (shm / mpi) or one GPU each over NCCL."""
    use_gpu = args.device == "cuda" or (args.device == "auto" and device.cuda_is_available())
    threads = args.threads or max(1, (os.cpu_count() or 1) // (gpu_per_node or args.world_size))
    device.set_num_threads(threads)
    dist_opt = opt.DistOpt(sgd, nccl_id=nccl_id, gpu_num=gpu_num, gpu_per_node=gpu_per_node,
                           backend="nccl" if use_gpu else None)
    dev = dist_opt.communicator.device if use_gpu else device.get_default_device()
    if use_gpu:
        device.set_default_device(dev)
    dev.SetRandSeed(args.seed)
    return dist_opt, dev


def dist_step(args, sgd, loss) -> None:
    """One backward + update with the chosen synchronisation option."""
    if args.dist_option == "plain":
        sgd.backward_and_update(loss, threshold=args.threshold)
    elif args.dist_option == "half":
        sgd.backward_and_update_half(loss, threshold=args.threshold)
    elif args.dist_option == "partialUpdate":
        sgd.backward_and_partial_update(loss, threshold=args.threshold)
    else:
        sgd.backward_and_sparse_update(loss, threshold=args.threshold, spars=args.spars,
                                       topK=args.dist_option == "sparseTopK", corr=True)


def model_params(model) -> dict:
    """A model's parameters by name: its own get_params() (a layer.Layer / model.Model), else those of its
    layer attributes (the plain classes of the SINGA examples)."""
    return _by_name(model, "get_params")


def model_states(model) -> dict:
    """Parameters and auxiliary states (batch-norm statistics) by name, the same way: what a checkpoint holds."""
    return _by_name(model, "get_states")


def _by_name(model, method: str) -> dict:
    if hasattr(model, method):
        return getattr(model, method)()
    found = {}
    for name, layer in vars(model).items():
        if hasattr(layer, method):
            found.update({f"{name}.{k}": v for k, v in getattr(layer, method)().items()})
    return found


def reduce_sum(sgd, values, dev) -> np.ndarray:
    """Sum over ranks of a few numbers (SINGA's reduce_variable pattern)."""
    t = tensor.from_numpy(np.asarray(values, np.float32), dev)
    sgd.all_reduce(t.data)
    sgd.wait()
    return tensor.to_numpy(t)


def train_and_evaluate(args, sgd, dev, model, train_set, test_set, what: str) -> float:
    """SINGA's loop: every epoch, this rank's part of each step of the shared permutation, then the test share;
    prints the epoch's metrics reduced over ranks on rank 0. Returns the final test accuracy."""
    rank, world = sgd.rank_in_global, sgd.world_size
    train_x, train_y = train_set
    test_x, test_y = data_partition(*test_set, rank, world)
    autograd.training = False
    model.forward(tensor.from_numpy(train_x[:1], dev))  # creates the parameters
    sgd.broadcast_parameters(model_params(model))  # every rank starts from rank 0's values

    sampler = ElasticSampler(len(train_y), rank, world, args.batch_size, seed=args.seed)
    history, carried, first_epoch = [], np.zeros(3), 0  # carried: the epoch's sums so far, when resumed
    state = None
    if args.checkpoint:
        state = checkpoint.ElasticState(args.checkpoint, model=model_states(model), optimizer=sgd, sampler=sampler,
                                        every=args.commit_every or None, log=None)
        start = state.resume()  # every rank, after the broadcast above
        if start.resumed:
            history = [list(h) for h in start.extra["history"]]
            first_epoch = start.epoch
            if sampler.cursor == sampler.num_samples:  # committed at the end of that epoch
                first_epoch += 1
            elif rank == 0:
                carried = np.asarray(start.extra["sums"], np.float64)
            if rank == 0:
                where = (f"after epoch {first_epoch}" if sampler.cursor == sampler.num_samples else
                         f"in epoch {first_epoch + 1} at sample {sampler.cursor} of {sampler.num_samples}")
                change = "" if start.saved_world_size == world else \
                    f", resharded from {start.saved_world_size} to {world} rank(s)"
                print(f"resumed from {args.checkpoint} {where} (step {start.step}, generation "
                      f"{start.generation}{change})", flush=True)
    if rank == 0:
        print(f"{world} ranks ({sgd.communicator.backend} backend, {dev}, {device.get_num_threads()} threads "
              f"each), {what}, dist option {args.dist_option}, {len(train_y)} training samples, "
              f"{-(-len(train_y) // sampler.step_size)} steps per epoch", flush=True)
    for epoch in range(first_epoch, args.epochs):
        autograd.training = True
        sampler.set_epoch(epoch)  # keeps a resumed cursor
        start_time, sums = time.perf_counter(), carried.copy()  # loss x samples, correct, samples
        carried = np.zeros(3)
        steps = len(sampler)
        for idx in sampler:
            out = model.forward(tensor.from_numpy(train_x[idx], dev))
            loss = autograd.softmax_cross_entropy(out, tensor.from_numpy(train_y[idx], dev))
            dist_step(args, sgd, loss)
            sums += (loss.item() * len(idx), int((tensor.to_numpy(tensor.argmax(out, 1)) == train_y[idx]).sum()),
                     len(idx))
            if state is not None:
                due = args.commit_every and (state.steps + 1) % args.commit_every == 0
                # the epoch's sums so far, over all ranks (collective: every rank reaches the same steps)
                extra = {"history": history, "sums": reduce_sum(sgd, sums, dev).tolist()} if due else None
                if state.step(extra) and rank == 0:
                    print(f"committed step {state.steps} (epoch {epoch + 1}, sample {sampler.cursor} of "
                          f"{sampler.num_samples})", flush=True)
        dev.Sync()
        elapsed = time.perf_counter() - start_time
        if args.dist_option == "partialUpdate":
            sgd.average_parameters()  # evaluate the averaged model
        autograd.training = False
        test_correct = 0
        for i in range(0, len(test_y), 256):
            out = model.forward(tensor.from_numpy(test_x[i:i + 256], dev))
            test_correct += int((tensor.to_numpy(tensor.argmax(out, 1)) == test_y[i:i + 256]).sum())
        totals = reduce_sum(sgd, [*sums, test_correct, len(test_y)], dev)
        train_loss = totals[0] / max(totals[2], 1)
        train_acc = totals[1] / max(totals[2], 1)
        test_acc = totals[3] / max(totals[4], 1)
        history.append([float(train_loss), float(train_acc), float(test_acc)])
        if rank == 0:
            print(f"epoch {epoch + 1:3d}  train loss {train_loss:.4f}  train acc {train_acc:.4f}  test acc "
                  f"{test_acc:.4f}  ({elapsed:.2f} s, {1e3 * elapsed / max(steps, 1):.1f} ms/step)", flush=True)
        if state is not None:  # collective: returns on every rank once the commit is complete
            state.commit(extra={"history": history, "sums": [0.0, 0.0, 0.0]})
    if rank == 0:
        print(f"final test accuracy {history[-1][2]:.4f}", flush=True)
        if args.plot:
            plot(history, args.plot)
    return history[-1][2]


def plot(history, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib: pip install matplotlib", file=sys.stderr)
        return
    epochs = range(1, len(history) + 1)
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    a.plot(epochs, [h[0] for h in history])
    a.set_xlabel("epoch")
    a.set_ylabel("train loss")
    b.plot(epochs, [h[1] for h in history], label="train")
    b.plot(epochs, [h[2] for h in history], label="test")
    b.set_xlabel("epoch")
    b.set_ylabel("accuracy")
    b.legend()
    fig.tight_layout()
    fig.savefig(path)
    print(f"curves written to {path}")
