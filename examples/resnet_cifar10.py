"""Data-parallel training of a ResNet-9 on CIFAR-10 with DistOpt: the workload of Needle's ddp project
(ResNet9, from CMU's Deep Learning Systems course) with the launchers and synchronisation options of SINGA's
distributed-training page.

    python examples/resnet_cifar10.py --world-size 2                              # built-in data, 2 ranks
    python examples/resnet_cifar10.py --data-dir ~/data/cifar-10-batches-py --epochs 10
    mpiexec -n 2 python examples/resnet_cifar10.py --launcher mpi --dist-option half
    singa-run -np 4 examples/resnet_cifar10.py --launcher singa-run --device cuda --data-dir DIR
    singa-run -np 2 --max-restarts 2 examples/resnet_cifar10.py --launcher singa-run --checkpoint ckpt --commit-every 20
    torchrun --nproc-per-node 2 --max-restarts 2 examples/resnet_cifar10.py --launcher env --checkpoint ckpt

Data: CIFAR-10 from --data-dir (the python or binary batches; nothing is downloaded). Without it, a
generated CIFAR-shaped set: ten classes, each a fixed random colour pattern plus noise, so that the whole
pipeline runs offline and accuracy means something; its numbers say nothing about CIFAR-10 itself.
The loop, launchers and options are in examples/dist_training.py.
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dist_training  # noqa: E402

from singa_lite import autograd, layer, opt  # noqa: E402
from singa_lite.data import load_cifar10  # noqa: E402


class ConvBN(layer.Layer):
    """Conv (no bias) -> batch norm -> ReLU, as the Needle ResNet9's ConvBN."""

    def __init__(self, channels: int, kernel: int, stride: int):
        super().__init__()
        self.conv = layer.Conv2d(channels, kernel, stride=stride, padding=kernel // 2, bias=False)
        self.bn = layer.BatchNorm2d()

    def forward(self, x):
        return autograd.relu(self.bn(self.conv(x)))


class Residual(layer.Layer):
    def __init__(self, channels: int):
        super().__init__()
        self.a, self.b = ConvBN(channels, 3, 1), ConvBN(channels, 3, 1)

    def forward(self, x):
        return autograd.add(self.b(self.a(x)), x)


class ResNet9(layer.Layer):
    """The Needle course's ResNet9 for 32x32 images: 16-32 channels at 8x8, a residual pair, 64-128 channels
    down to 2x2, a second residual pair, then two linear layers (128 -> 128 -> 10)."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.c1, self.c2 = ConvBN(16, 7, 4), ConvBN(32, 3, 2)
        self.r1 = Residual(32)
        self.c3, self.c4 = ConvBN(64, 3, 2), ConvBN(128, 3, 2)
        self.r2 = Residual(128)
        self.fc1, self.fc2 = layer.Linear(128), layer.Linear(classes)

    def forward(self, x):
        y = self.r1(self.c2(self.c1(x)))
        y = self.r2(self.c4(self.c3(y)))
        return self.fc2(autograd.relu(self.fc1(autograd.flatten(y))))


def generated_cifar(seed: int, n_train: int = 2000, n_test: int = 500):
    """Ten classes of 3x32x32 images: a faint fixed random pattern per class under strong noise."""
    rng = np.random.default_rng(seed)
    patterns = rng.uniform(0, 1, (10, 3, 32, 32)).astype(np.float32)

    def make(n):
        y = rng.integers(0, 10, n).astype(np.int32)
        x = 0.2 * patterns[y] + 0.8 * rng.uniform(0, 1, (n, 3, 32, 32)).astype(np.float32)
        return x, y
    return make(n_train), make(n_test)


def parse_args(argv=None):
    p = dist_training.argument_parser(__doc__, epochs=5, batch_size=32, lr=0.05)
    args = p.parse_args(argv)
    dist_training.check_args(p, args)
    return args


def train(args, nccl_id=None, gpu_num=None, gpu_per_node=None) -> float:
    sgd = opt.SGD(lr=args.lr, momentum=0.9, weight_decay=1e-4)
    sgd, dev = dist_training.distributed_optimizer(args, sgd, nccl_id, gpu_num, gpu_per_node)
    if args.data_dir:
        (train_set, test_set), what = load_cifar10(args.data_dir), "CIFAR-10"
    else:
        (train_set, test_set), what = generated_cifar(args.seed), "generated CIFAR-shaped data"
    return dist_training.train_and_evaluate(args, sgd, dev, ResNet9(), train_set, test_set, what)


def main(argv=None) -> int:
    return dist_training.launch(parse_args(argv), train)


if __name__ == "__main__":
    sys.exit(main())
