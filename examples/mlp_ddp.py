"""The MLP of the DDP exercises ("Understanding parallel deep neural network training") on singa_lite: the
toy multi-layer perceptron (make_classification data, tanh layers, linear learning-rate decay) trained on one
rank, data-parallel with DistOpt, and data-parallel with the hook-based wrapper (the exercises' MyDP), with a
replica check every --check-every steps.

    python examples/mlp_ddp.py --mode single                       # exercise 1: one process
    python examples/mlp_ddp.py --mode distopt --world-size 2       # exercise 3: built-in data parallelism
    python examples/mlp_ddp.py --mode hooks --world-size 2         # exercise 4: MyDP, gradient hooks
    mpiexec -n 2 python examples/mlp_ddp.py --mode hooks --launcher mpi

Every step takes one global batch of --batch-size rows; each of the P ranks trains on its contiguous
1/P of it (singa_lite.parallel.ddp.partition_dataset), so P ranks follow the single-process run step for step (up to
rounding): the printed losses can be compared across modes. The data are generated identically on every
rank (scikit-learn's make_classification with a fixed random state), as the exercises do.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dist_training  # noqa: E402

from singa_lite import autograd, device, layer, opt, parallel, tensor  # noqa: E402
from singa_lite.parallel import ddp


class MLP(layer.Layer):
    """n_layers linear layers, tanh between them (the exercises' mlp.py)."""

    def __init__(self, n_layers: int, dim_hidden: int, n_classes: int):
        super().__init__()
        self.n = n_layers
        for i in range(n_layers):
            setattr(self, f"fc{i}", layer.Linear(n_classes if i == n_layers - 1 else dim_hidden))

    def forward(self, x):
        for i in range(self.n):
            x = getattr(self, f"fc{i}")(x)
            if i < self.n - 1:
                x = autograd.tanh(x)
        return x


def parse_args(argv=None):
    p = dist_training.argument_parser(__doc__, epochs=1, batch_size=64, lr=0.1)
    p.add_argument("--mode", choices=("single", "distopt", "hooks"), default="hooks")
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--dim-in", type=int, default=1024)
    p.add_argument("--dim-hidden", type=int, default=256)
    p.add_argument("--n-classes", type=int, default=32)
    p.add_argument("--train-size", type=int, default=10000)
    p.add_argument("--niters", type=int, default=1000, help="training steps (the learning rate decays to 0)")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--check-every", type=int, default=100, help="replica closeness check every N steps")
    args = p.parse_args(argv)
    dist_training.check_args(p, args)
    if args.mode == "single":
        args.world_size, args.launcher = 1, "multiprocessing"
    if min(args.niters, args.log_every, args.check_every, args.n_layers, args.train_size) < 1:
        p.error("--niters, --log-every, --check-every, --n-layers and --train-size must be >= 1")
    if args.batch_size % args.world_size:
        p.error(f"--batch-size {args.batch_size} must be a multiple of the world size {args.world_size}")
    return args


def gen_dataset(args):
    """The exercises' data: make_classification with random state 0, the same on every rank; 10 % held out.
    class_sep=4 makes the loss curve look like the one the exercises print (0.2 after a few hundred steps)."""
    try:
        from sklearn.datasets import make_classification
    except ImportError:
        sys.exit("the data come from scikit-learn: pip install scikit-learn")
    n = args.train_size + args.train_size // 10
    x, y = make_classification(n_samples=n, n_features=args.dim_in, n_informative=args.n_classes,
                               n_classes=args.n_classes, n_clusters_per_class=1, class_sep=4.0, random_state=0)
    x, y = x.astype(np.float32), y.astype(np.int32)
    return (x[:args.train_size], y[:args.train_size]), (x[args.train_size:], y[args.train_size:])


def mean_over_ranks(value: float, dev) -> float:
    t = tensor.from_numpy(np.array([value], np.float32), dev)
    ddp.communicator().all_reduce(t, "avg")
    return t.item()


def train(args, nccl_id=None, gpu_num=None, gpu_per_node=None) -> float:
    rank, dev = ddp.init(nccl_id, gpu_num, gpu_per_node, device="cpu" if args.device == "cpu" else None)
    world = ddp.world_size()
    device.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // world))
    dev.SetRandSeed(args.seed + 17 * rank)  # different initial weights per rank: the broadcast must fix them
    (train_x, train_y), (test_x, test_y) = gen_dataset(args)
    loader, per_rank = ddp.partition_dataset((train_x, train_y), args.batch_size, device=dev, shuffle=True,
                                             seed=args.seed)
    model = MLP(args.n_layers, args.dim_hidden, args.n_classes)
    autograd.training = True
    model(tensor.from_numpy(train_x[:1], dev))  # creates the parameters
    sgd = opt.SGD(lr=opt.LinearDecay(args.lr, 0.0, args.niters))  # the exercises' linear decay to 0
    if args.mode == "hooks":
        model = parallel.DataParallel(model)  # broadcasts rank 0's weights; hooks average the gradients
        step = sgd
    else:
        step = opt.DistOpt(sgd, communicator=ddp.communicator()) if world > 1 or args.mode == "distopt" else sgd
        ddp.broadcast_parameters(model)
    if rank == 0:
        print(f"mode {args.mode}: {world} rank(s) ({ddp.communicator().backend} backend), global batch "
              f"{args.batch_size} = {world} x {per_rank}, {args.niters} steps", flush=True)
    tx, ty = tensor.from_numpy(test_x, dev), tensor.from_numpy(test_y, dev)
    it, epoch, start, test_loss = 0, 0, time.perf_counter(), float("nan")
    while it < args.niters:
        loader.set_epoch(epoch)
        for xb, yb in loader:
            autograd.training = True
            loss = autograd.softmax_cross_entropy(model(xb), yb)
            train_loss = mean_over_ranks(loss.item(), dev)
            step(loss)
            it += 1
            if it % args.check_every == 0 or it == args.niters:
                close = ddp.check_parameter_closeness(model)
                if not close:
                    raise SystemExit(f"rank {rank}: replicas drifted at step {it}")
            if it % args.log_every == 0 or it == args.niters:
                autograd.training = False
                test_loss = autograd.softmax_cross_entropy(model(tx), ty).item()
                if rank == 0:
                    ms = 1e3 * (time.perf_counter() - start) / it
                    print(f"step {it} | train_loss {train_loss:.4f} | test_loss {test_loss:.4f} | "
                          f"step time {ms:.2f}ms", flush=True)
            if it == args.niters:
                break
        epoch += 1
    if rank == 0:
        print(f"final test loss {test_loss:.4f} (replicas identical: checked every {args.check_every} steps)",
              flush=True)
    ddp.shutdown()
    return test_loss


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.mode == "single":
        train(args)
        return 0
    return dist_training.launch(args, train)


if __name__ == "__main__":
    sys.exit(main())
