"""Data-parallel training of SINGA's MNIST CNN with DistOpt: the script of SINGA's distributed-training
page, with its two launchers and its five synchronisation options.

    python examples/mnist_dist.py --launcher multiprocessing --world-size 2     # one host, shm backend
    mpiexec -n 2 python examples/mnist_dist.py --launcher mpi                   # MPI (mpi backend)
    singa-run -np 2 examples/mnist_dist.py --launcher singa-run                 # singa-run (shm backend)
    singa-run -np 2 --max-restarts 2 examples/mnist_dist.py --launcher singa-run --checkpoint ckpt --commit-every 20
    torchrun --nproc-per-node 2 --max-restarts 2 examples/mnist_dist.py --launcher env --checkpoint ckpt
    python examples/mnist_dist.py --world-size 2 --dist-option sparseTopK --spars 0.05

Data: MNIST IDX files from --data-dir, else scikit-learn's bundled digits (no download; see
singa_lite.data). With a GPU per rank (--device cuda, or auto where GPUs exist) the ranks talk over NCCL.
The loop, launchers and options are in examples/dist_training.py; restarts after a failure: docs/elastic.md.
--plot writes loss / accuracy curves to a PNG (needs matplotlib).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dist_training  # noqa: E402
from train_cnn import CNN  # noqa: E402

from singa_lite import opt  # noqa: E402
from singa_lite.data import load_digits, load_mnist  # noqa: E402


def parse_args(argv=None):
    p = dist_training.argument_parser(__doc__, epochs=10, batch_size=32, lr=0.05)
    args = p.parse_args(argv)
    dist_training.check_args(p, args)
    return args


def load(args):
    if args.data_dir:
        return load_mnist(args.data_dir), "MNIST"
    try:
        return load_digits(args.seed), "the bundled digits"
    except ImportError:
        sys.exit("the offline default dataset comes with scikit-learn: pip install scikit-learn "
                 "(or pass --data-dir with MNIST files)")


def train(args, nccl_id=None, gpu_num=None, gpu_per_node=None) -> float:
    sgd = opt.SGD(lr=args.lr, momentum=0.9, weight_decay=1e-5)
    sgd, dev = dist_training.distributed_optimizer(args, sgd, nccl_id, gpu_num, gpu_per_node)
    (train_set, test_set), what = load(args)
    return dist_training.train_and_evaluate(args, sgd, dev, CNN(), train_set, test_set, what)


def main(argv=None) -> int:
    return dist_training.launch(parse_args(argv), train)


if __name__ == "__main__":
    sys.exit(main())
