"""Fit a linear model y = X w + b by full-batch gradient descent, on singa_lite tensors.

The data is generated here (no download): X ~ N(0, 1), true weights ~ N(0, 1), noise ~ N(0, --noise).
Gradients are written out by hand with the tensor API (matmul, transpose views, reductions, axpy),
so this job exercises the C++ core end to end. It prints the loss as it trains and exits non-zero if
the recovered weights are not close to the true ones.

    python examples/linear_regression.py                 # 20000 x 256, 200 steps
    python examples/linear_regression.py --help
"""
import argparse
import sys
import time

import numpy as np

from singa_lite import device, tensor


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=20000, help="rows of X (default 20000)")
    p.add_argument("--features", type=int, default=256, help="columns of X (default 256)")
    p.add_argument("--steps", type=int, default=200, help="gradient steps (default 200)")
    p.add_argument("--lr", type=float, default=0.1, help="learning rate (default 0.1)")
    p.add_argument("--noise", type=float, default=0.01, help="std of the label noise (default 0.01)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--log-every", type=int, default=20)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.samples < 1 or args.features < 1 or args.steps < 1 or args.lr <= 0:
        sys.exit("samples, features and steps must be >= 1 and lr > 0")
    if args.threads:
        device.set_num_threads(args.threads)
    dev = device.get_default_device()
    dev.SetRandSeed(args.seed)
    dtype = getattr(tensor, args.dtype)

    X = tensor.Tensor((args.samples, args.features), dev, dtype).gaussian(0.0, 1.0)
    w_true = tensor.Tensor((args.features, 1), dev, dtype).gaussian(0.0, 1.0)
    y = tensor.matmul(X, w_true) + 0.5
    y += tensor.Tensor(y.shape, dev, dtype).gaussian(0.0, args.noise)

    w = tensor.Tensor((args.features, 1), dev, dtype)  # zeros
    b = tensor.Tensor((1,), dev, dtype)
    Xt = X.T()  # a view: the BLAS call reads X transposed, nothing is copied
    scale = 2.0 / args.samples
    print(f"linear regression: {args.samples} x {args.features} {args.dtype}, {args.steps} steps, "
          f"lr {args.lr}, {device.get_num_threads()} threads")
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        err = tensor.matmul(X, w) + b - y          # (N, 1)
        tensor.axpy(-args.lr * scale, tensor.matmul(Xt, err), w)   # w -= lr * 2/N * X^T err
        tensor.axpy(-args.lr * scale, tensor.sum(err, 0), b)       # b -= lr * 2/N * sum(err)
        if step % args.log_every == 0 or step == 1 or step == args.steps:
            loss = tensor.average(err * err).item()
            print(f"  step {step:5d}  mse {loss:.6f}")
    elapsed = time.perf_counter() - start
    w_err = float(np.abs(tensor.to_numpy(w) - tensor.to_numpy(w_true)).max())
    b_err = abs(b.item() - 0.5)
    print(f"done in {elapsed:.2f} s ({1e3 * elapsed / args.steps:.2f} ms/step); "
          f"max |w - w_true| = {w_err:.4f}, |b - 0.5| = {b_err:.4f}")
    tol = 10 * args.noise + 1e-3
    if w_err > tol or b_err > tol:
        print(f"FAILED: weights not recovered within {tol}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
