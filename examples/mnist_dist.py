"""Data-parallel training of SINGA's MNIST CNN with DistOpt: the script of SINGA's distributed-training
page, with its two launchers and its five synchronisation options.

    python examples/mnist_dist.py --launcher multiprocessing --world-size 2     # one host, shm backend
    mpiexec -n 2 python examples/mnist_dist.py --launcher mpi                   # MPI (mpi backend)
    python examples/mnist_dist.py --world-size 2 --dist-option sparseTopK --spars 0.05

Data: MNIST IDX files from --data-dir, else scikit-learn's bundled digits (no download; see
singa_lite.data). Every rank trains on its contiguous share of the training set (SINGA's
data_partition), batch --batch-size per rank; rank 0 prints progress, and the epoch's loss and accuracy are
reduced over all ranks. --plot writes loss / accuracy curves to a PNG (needs matplotlib).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from train_cnn import CNN  # noqa: E402

from singa_lite import autograd, device, opt, singa_wrap, tensor  # noqa: E402
from singa_lite.data import data_partition, load_digits, load_mnist  # noqa: E402

DIST_OPTIONS = ("plain", "half", "partialUpdate", "sparseTopK", "sparseThreshold")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--launcher", choices=("multiprocessing", "mpi"), default="multiprocessing",
                   help="mpi: the script was started by mpiexec; multiprocessing: it starts --world-size ranks")
    p.add_argument("--world-size", type=int, default=2, help="ranks to start (multiprocessing launcher)")
    p.add_argument("--dist-option", choices=DIST_OPTIONS, default="plain")
    p.add_argument("--spars", type=float, default=0.05,
                   help="sparse options: fraction of entries sent (sparseTopK) or magnitude threshold")
    p.add_argument("--threshold", type=int, default=2097152,
                   help="DistOpt's fusion threshold in elements (partialUpdate: the partition size)")
    p.add_argument("--data-dir", help="directory with the four MNIST IDX files (optionally .gz)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="threads per rank (default: cores / ranks)")
    p.add_argument("--plot", metavar="PNG", help="write loss and accuracy curves to this file (matplotlib)")
    args = p.parse_args(argv)
    if args.world_size < 1 or args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        p.error("--world-size, --epochs and --batch-size must be >= 1 and --lr > 0")
    return args


def model_params(model) -> dict:
    params = {}
    for name, layer in vars(model).items():
        if hasattr(layer, "get_params"):
            params.update({f"{name}.{k}": v for k, v in layer.get_params().items()})
    return params


def reduce_sum(sgd, values) -> np.ndarray:
    """Sum over ranks of a few numbers (SINGA's reduce_variable pattern)."""
    t = tensor.from_numpy(np.asarray(values, np.float32))
    sgd.all_reduce(t.data)
    sgd.wait()
    return tensor.to_numpy(t)


def train(args, nccl_id=None, gpu_num=None, gpu_per_node=None) -> float:
    threads = args.threads or max(1, (os.cpu_count() or 1) // (gpu_per_node or args.world_size))
    device.set_num_threads(threads)
    sgd = opt.SGD(lr=args.lr, momentum=0.9, weight_decay=1e-5)
    sgd = opt.DistOpt(sgd, nccl_id=nccl_id, gpu_num=gpu_num, gpu_per_node=gpu_per_node)
    rank, world = sgd.rank_in_global, sgd.world_size
    dev = device.get_default_device()
    dev.SetRandSeed(args.seed)
    if args.data_dir:
        (train_x, train_y), (test_x, test_y) = load_mnist(args.data_dir)
    else:
        try:
            (train_x, train_y), (test_x, test_y) = load_digits(args.seed)
        except ImportError:
            sys.exit("the offline default dataset comes with scikit-learn: pip install scikit-learn "
                     "(or pass --data-dir with MNIST files)")
    train_x, train_y = data_partition(train_x, train_y, rank, world)
    test_x, test_y = data_partition(test_x, test_y, rank, world)
    model = CNN()
    # create the parameters (one forward) and give every rank rank 0's values
    autograd.training = False
    model.forward(tensor.from_numpy(train_x[:1], dev))
    sgd.broadcast_parameters(model_params(model))

    steps = len(train_y) // args.batch_size
    rng = np.random.default_rng(args.seed + rank)
    history = []
    if rank == 0:
        print(f"{world} ranks ({sgd.communicator.backend} backend, {threads} threads each), "
              f"dist option {args.dist_option}, {len(train_y)} training samples per rank, {steps} steps per epoch",
              flush=True)
    for epoch in range(1, args.epochs + 1):
        autograd.training = True
        order = rng.permutation(len(train_y))
        start, loss_sum, correct = time.perf_counter(), 0.0, 0
        for b in range(steps):
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]
            out = model.forward(tensor.from_numpy(train_x[idx], dev))
            loss = autograd.softmax_cross_entropy(out, tensor.from_numpy(train_y[idx], dev))
            if args.dist_option == "plain":
                sgd.backward_and_update(loss, threshold=args.threshold)
            elif args.dist_option == "half":
                sgd.backward_and_update_half(loss, threshold=args.threshold)
            elif args.dist_option == "partialUpdate":
                sgd.backward_and_partial_update(loss, threshold=args.threshold)
            else:
                sgd.backward_and_sparse_update(loss, threshold=args.threshold, spars=args.spars,
                                               topK=args.dist_option == "sparseTopK", corr=True)
            loss_sum += loss.item()
            correct += int((tensor.to_numpy(tensor.argmax(out, 1)) == train_y[idx]).sum())
        elapsed = time.perf_counter() - start
        if args.dist_option == "partialUpdate":
            sgd.average_parameters()  # evaluate the averaged model
        autograd.training = False
        test_correct = 0
        for i in range(0, len(test_y), 256):
            out = model.forward(tensor.from_numpy(test_x[i:i + 256], dev))
            test_correct += int((tensor.to_numpy(tensor.argmax(out, 1)) == test_y[i:i + 256]).sum())
        totals = reduce_sum(sgd, [loss_sum, correct, test_correct, len(test_y)])
        train_loss = totals[0] / (steps * world)
        train_acc = totals[1] / (steps * args.batch_size * world)
        test_acc = totals[2] / totals[3]
        history.append((train_loss, train_acc, test_acc))
        if rank == 0:
            print(f"epoch {epoch:3d}  train loss {train_loss:.4f}  train acc {train_acc:.4f}  test acc {test_acc:.4f}"
                  f"  ({elapsed:.2f} s, {1e3 * elapsed / max(steps, 1):.1f} ms/step)", flush=True)
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


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.launcher == "mpi":
        train(args)
        return 0
    import multiprocessing

    nccl_id = singa_wrap.NcclIdHolder()  # as seed 001: created in the parent, passed to every rank
    procs = [multiprocessing.Process(target=train, args=(args, nccl_id, gpu_num, args.world_size))
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


if __name__ == "__main__":
    sys.exit(main())
