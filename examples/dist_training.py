"""The data-parallel training driver shared by examples/mnist_dist.py and examples/resnet_cifar10.py:
SINGA's training loop with DistOpt, its launchers and its five synchronisation options. An example supplies
a model factory and its data; this module does the rest.

Launchers (``--launcher``):
  multiprocessing  the script starts --world-size ranks itself, sharing an NcclIdHolder (SINGA's pattern)
  mpi              the script was started by ``mpiexec -n N``
  singa-run        the script was started by ``singa-run -np N``
Devices (``--device``): cpu, cuda (one GPU per rank: cuda:<local rank>, NCCL between them) or auto (cuda
when this build sees a GPU). Every rank trains on its contiguous share of the data (SINGA's
data_partition); rank 0 prints progress, and each epoch's loss and accuracy are reduced over all ranks.
``--checkpoint DIR`` saves the whole training state there after every epoch (singa_lite.checkpoint) and,
when DIR already holds one, resumes from it: the resumed run prints what the uninterrupted one would have.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from singa_lite import autograd, checkpoint, device, opt, singa_wrap, tensor
from singa_lite.data import data_partition

DIST_OPTIONS = ("plain", "half", "partialUpdate", "sparseTopK", "sparseThreshold")
LAUNCHERS = ("multiprocessing", "mpi", "singa-run")


def argument_parser(doc: str, *, epochs: int, batch_size: int, lr: float) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--launcher", choices=LAUNCHERS, default="multiprocessing",
                   help="who starts the ranks: this script (multiprocessing), mpiexec or singa-run")
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
                   help="save the training state to DIR after every epoch; resume from DIR when it holds one")
    p.add_argument("--reshard", action="store_true",
                   help="with --checkpoint: resume a checkpoint saved by another number of ranks (from rank 0's "
                        "state; not bit for bit)")
    return p


def check_args(p: argparse.ArgumentParser, args) -> None:
    if args.world_size < 1 or args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        p.error("--world-size, --epochs and --batch-size must be >= 1 and --lr > 0")
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
    if args.launcher != "multiprocessing":  # mpiexec / singa-run started the ranks: dist.init finds them
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
    """SINGA's loop: every epoch, this rank's share in shuffled batches, then the test share; prints the
    epoch's metrics reduced over ranks on rank 0. Returns the final test accuracy."""
    rank, world = sgd.rank_in_global, sgd.world_size
    train_x, train_y = data_partition(*train_set, rank, world)
    test_x, test_y = data_partition(*test_set, rank, world)
    autograd.training = False
    model.forward(tensor.from_numpy(train_x[:1], dev))  # creates the parameters
    sgd.broadcast_parameters(model_params(model))  # every rank starts from rank 0's values

    steps = len(train_y) // args.batch_size
    rng = np.random.default_rng(args.seed + rank)
    history, first_epoch = [], 1
    if args.checkpoint and os.path.exists(os.path.join(args.checkpoint, checkpoint.MANIFEST)):
        # every rank, after the broadcast above
        extra = checkpoint.load(args.checkpoint, model_states(model), sgd, rng=rng, reshard=args.reshard)
        history, first_epoch = [tuple(h) for h in extra["history"]], int(extra["epoch"]) + 1
        if rank == 0:
            print(f"resumed from {args.checkpoint} after epoch {first_epoch - 1}", flush=True)
    if rank == 0:
        print(f"{world} ranks ({sgd.communicator.backend} backend, {dev}, {device.get_num_threads()} threads "
              f"each), {what}, dist option {args.dist_option}, {len(train_y)} training samples per rank, "
              f"{steps} steps per epoch", flush=True)
    for epoch in range(first_epoch, args.epochs + 1):
        autograd.training = True
        order = rng.permutation(len(train_y))
        start, loss_sum, correct = time.perf_counter(), 0.0, 0
        for b in range(steps):
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]
            out = model.forward(tensor.from_numpy(train_x[idx], dev))
            loss = autograd.softmax_cross_entropy(out, tensor.from_numpy(train_y[idx], dev))
            dist_step(args, sgd, loss)
            loss_sum += loss.item()
            correct += int((tensor.to_numpy(tensor.argmax(out, 1)) == train_y[idx]).sum())
        dev.Sync()
        elapsed = time.perf_counter() - start
        if args.dist_option == "partialUpdate":
            sgd.average_parameters()  # evaluate the averaged model
        autograd.training = False
        test_correct = 0
        for i in range(0, len(test_y), 256):
            out = model.forward(tensor.from_numpy(test_x[i:i + 256], dev))
            test_correct += int((tensor.to_numpy(tensor.argmax(out, 1)) == test_y[i:i + 256]).sum())
        totals = reduce_sum(sgd, [loss_sum, correct, test_correct, len(test_y)], dev)
        train_loss = totals[0] / (max(steps, 1) * world)
        train_acc = totals[1] / (max(steps, 1) * args.batch_size * world)
        test_acc = totals[2] / max(totals[3], 1)
        history.append((train_loss, train_acc, test_acc))
        if rank == 0:
            print(f"epoch {epoch:3d}  train loss {train_loss:.4f}  train acc {train_acc:.4f}  test acc {test_acc:.4f}"
                  f"  ({elapsed:.2f} s, {1e3 * elapsed / max(steps, 1):.1f} ms/step)", flush=True)
        if args.checkpoint:  # collective: returns on every rank once the checkpoint is complete
            checkpoint.save(args.checkpoint, model_states(model), sgd, rng=rng,
                            extra={"epoch": epoch, "history": history})
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
