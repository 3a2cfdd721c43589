"""Train SINGA's MNIST CNN (or an MLP) on one process with singa_lite.

The model code is the CNN of SINGA's distributed-training page (conv 20@5x5, max-pool, conv 50@5x5,
max-pool, fc 500, fc 10), written against ``autograd`` exactly as there. Data, in order of preference:

  --data-dir DIR   MNIST IDX files (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz],
                   t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]) read from DIR;
  (default)        scikit-learn's bundled handwritten digits (1797 real 8x8 scans, no download),
                   resized to 28x28, 80/20 train/test split;
  --synthetic      random images whose label is the quadrant holding a bright square (a smoke test).

    python examples/train_cnn.py                       # CNN on the bundled digits
    python examples/train_cnn.py --model mlp --epochs 5
    python examples/train_cnn.py --data-dir ~/mnist --epochs 2
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from singa_lite import autograd, device, opt, tensor
from singa_lite.data import load_digits, load_mnist


# ---------------------------------------------------------------- models (SINGA's seed code)
class CNN:
    def __init__(self):
        self.conv1 = autograd.Conv2d(1, 20, 5, padding=0)
        self.conv2 = autograd.Conv2d(20, 50, 5, padding=0)
        self.linear1 = autograd.Linear(4 * 4 * 50, 500)
        self.linear2 = autograd.Linear(500, 10)
        self.pooling1 = autograd.MaxPool2d(2, 2, padding=0)
        self.pooling2 = autograd.MaxPool2d(2, 2, padding=0)

    def forward(self, x):
        y = self.conv1(x)
        y = autograd.relu(y)
        y = self.pooling1(y)
        y = self.conv2(y)
        y = autograd.relu(y)
        y = self.pooling2(y)
        y = autograd.flatten(y)
        y = self.linear1(y)
        y = autograd.relu(y)
        y = self.linear2(y)
        return y


class MLP:
    def __init__(self, hidden=(512, 256)):
        sizes = [28 * 28, *hidden, 10]
        self.layers = [autograd.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])]

    def forward(self, x):
        y = autograd.flatten(x)
        for layer in self.layers[:-1]:
            y = autograd.relu(layer(y))
        return self.layers[-1](y)


# ---------------------------------------------------------------- data
def load_synthetic(seed: int, n_train=2048, n_test=512):
    rng = np.random.default_rng(seed)

    def make(n):
        x = rng.uniform(0, 0.3, (n, 1, 28, 28)).astype(np.float32)
        y = rng.integers(0, 4, n).astype(np.int32)
        for i, q in enumerate(y):
            r, c = 2 + 14 * (q // 2) + rng.integers(0, 4), 2 + 14 * (q % 2) + rng.integers(0, 4)
            x[i, 0, r:r + 6, c:c + 6] = 1.0
        return x, y

    return make(n_train), make(n_test)


# ---------------------------------------------------------------- training
def progress(prefix: str, done: int, total: int, extra: str, enabled: bool) -> None:
    if not enabled:
        return
    width = 30
    filled = width * done // max(total, 1)
    end = "\n" if done == total else ""
    print(f"\r{prefix} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {extra}", end=end, flush=True)


def evaluate(model, x, y, batch_size, dev) -> tuple[float, float]:
    autograd.training = False
    correct, loss_sum = 0, 0.0
    for i in range(0, len(y), batch_size):
        xb, yb = x[i:i + batch_size], y[i:i + batch_size]
        out = model.forward(tensor.from_numpy(xb, dev))
        loss_sum += autograd.softmax_cross_entropy(out, tensor.from_numpy(yb, dev)).item() * len(yb)
        correct += int((tensor.to_numpy(tensor.argmax(out, 1)) == yb).sum())
    return loss_sum / len(y), correct / len(y)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Train SINGA's MNIST CNN (or an MLP) with singa_lite.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--data-dir", help="directory with the four MNIST IDX files (optionally .gz)")
    src.add_argument("--synthetic", action="store_true", help="generated quadrant images instead of digits")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--max-steps", type=int, default=None, help="stop each epoch after this many steps")
    p.add_argument("--no-progress", action="store_true", help="no progress bar, one line per epoch")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        sys.exit("--epochs and --batch-size must be >= 1 and --lr > 0")
    if args.threads:
        device.set_num_threads(args.threads)
    dev = device.get_default_device()
    dev.SetRandSeed(args.seed)
    rng = np.random.default_rng(args.seed)

    if args.data_dir:
        (train_x, train_y), (test_x, test_y) = load_mnist(args.data_dir)
        source = f"MNIST from {args.data_dir}"
    elif args.synthetic:
        (train_x, train_y), (test_x, test_y) = load_synthetic(args.seed)
        source = "synthetic quadrants"
    else:
        try:
            (train_x, train_y), (test_x, test_y) = load_digits(args.seed)
        except ImportError:
            sys.exit("the offline default dataset comes with scikit-learn: pip install scikit-learn "
                     "(or pass --data-dir with MNIST files, or --synthetic)")
        source = "scikit-learn digits (8x8 scans resized to 28x28)"
    model = CNN() if args.model == "cnn" else MLP()
    sgd = opt.SGD(lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    steps = len(train_y) // args.batch_size
    if args.max_steps:
        steps = min(steps, args.max_steps)
    if steps == 0:
        sys.exit(f"the training set ({len(train_y)} samples) is smaller than one batch of {args.batch_size}")
    print(f"{args.model.upper()} on {source}: {len(train_y)} train / {len(test_y)} test, batch {args.batch_size}, "
          f"{steps} steps per epoch, {device.get_num_threads()} threads")

    show = not args.no_progress and sys.stdout.isatty()
    test_acc = 0.0
    for epoch in range(1, args.epochs + 1):
        autograd.training = True
        order = rng.permutation(len(train_y))
        start, loss_sum, correct = time.perf_counter(), 0.0, 0
        for step in range(steps):
            idx = order[step * args.batch_size:(step + 1) * args.batch_size]
            tx = tensor.from_numpy(train_x[idx], dev)
            ty = tensor.from_numpy(train_y[idx], dev)
            out = model.forward(tx)
            loss = autograd.softmax_cross_entropy(out, ty)
            sgd(loss)
            loss_sum += loss.item()
            correct += int((tensor.to_numpy(tensor.argmax(out, 1)) == train_y[idx]).sum())
            progress(f"epoch {epoch}", step + 1, steps, f"loss {loss_sum / (step + 1):.4f}", show)
        elapsed = time.perf_counter() - start
        test_loss, test_acc = evaluate(model, test_x, test_y, 256, dev)
        train_acc = correct / (steps * args.batch_size)
        print(f"epoch {epoch:3d}  train loss {loss_sum / steps:.4f}  train acc {train_acc:.4f}"
              f"  test loss {test_loss:.4f}  test acc {test_acc:.4f}  "
              f"({elapsed:.2f} s, {1e3 * elapsed / steps:.1f} ms/step)", flush=True)
    print(f"final test accuracy {test_acc:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
