"""Data-parallel training over several devices in one process, after MXNet's "multi-GPU training
from scratch" tutorial.

    python examples/multi_device.py                          # 2 replicas (GPUs when there are, else CPU)
    python examples/multi_device.py --device cpu --replicas 4 --epochs 5
    python examples/multi_device.py --device cuda --replicas 2    # cuda:0 and cuda:1
    python examples/multi_device.py --device cuda --replicas 2 --allreduce host   # sum through the host

The tutorial's LeNet (conv 20@3x3, avg-pool, conv 50@5x5, avg-pool, fc 128, fc 10), written as a function of
a parameter list. The parameters are replicated on every device (singa_lite.parallel.multi_device.replicate); each
batch is split across the replicas (split_and_load: sizes may differ by one), every replica runs forward
and backward on its part, the gradients are summed into the first replica and copied back (all_reduce),
and every replica applies the same SGD step, so the replicas stay identical: checked after every epoch.
Evaluation splits the test batches across the replicas too.

The gradient sum (--allreduce): "nccl" uses NCCL's single-process multi-device communicator (the GPUs
exchange directly; needs distinct GPUs and NCCL), "host" sums on the first replica's device through host
copies (the tutorial's way), "auto" takes nccl when it can, else host. The first output line names the route.

Each replica's loss gradient is scaled by its share of the batch, so the summed gradient is the mean over
the whole batch: K replicas train as one device does with the same --batch-size (the global batch), up to
float rounding.

Devices: --device cuda uses cuda:0 .. cuda:K-1 and needs a CUDA build that sees K GPUs. --device cpu puts
all K replicas on the CPU device: they run one after the other and share the machine's cores (--threads),
so they show the algorithm, not a speedup. Data: scikit-learn's bundled digits, or MNIST from --data-dir
(see examples/train_cnn.py).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from train_cnn import load_digits, load_mnist  # noqa: E402

from singa_lite import CudaError, autograd, device, opt, tensor  # noqa: E402
from singa_lite.parallel import multi_device
from singa_lite.dist import CommError  # noqa: E402


# ---------------------------------------------------------------- the tutorial's model, as a function
def init_params(seed: int) -> list:
    """W1 (20,1,3,3), b1, W2 (50,20,5,5), b2, W3 (800,128), b3, W4 (128,10), b4 on the CPU. The tutorial draws
    every weight from N(0, 0.01^2); here each layer's weights have std sqrt(2 / fan_in) (He), which trains
    the ReLU network in one epoch on the small digits set."""
    rng = np.random.default_rng(seed)
    shapes = {"W1": (20, 1, 3, 3), "b1": (20,), "W2": (50, 20, 5, 5), "b2": (50,),
              "W3": (800, 128), "b3": (128,), "W4": (128, 10), "b4": (10,)}
    params = []
    for name, shape in shapes.items():
        fan_in = math.prod(shape[1:]) if name in ("W1", "W2") else shape[0]
        value = rng.normal(0, math.sqrt(2 / fan_in), shape) if name.startswith("W") else np.zeros(shape)
        params.append(tensor.Tensor(data=value.astype(np.float32), requires_grad=True, stores_grad=True,
                                    name=name))
    return params


def lenet(x, params):
    W1, b1, W2, b2, W3, b3, W4, b4 = params
    h = autograd.avg_pool2d(autograd.relu(autograd.conv2d(x, W1, b1)), 2)  # (N, 20, 13, 13)
    h = autograd.avg_pool2d(autograd.relu(autograd.conv2d(h, W2, b2)), 2)  # (N, 50, 4, 4)
    h = autograd.relu(autograd.add_bias(autograd.matmul(autograd.flatten(h), W3), b3))
    return autograd.add_bias(autograd.matmul(h, W4), b4)


# ---------------------------------------------------------------- one batch, data parallel
def train_batch(x, y, replicas, devices, optimizers, allreduce="auto"):
    """The tutorial's train_batch; `allreduce` is multi_device.all_reduce's backend. Returns (summed loss,
    correct predictions) over the batch."""
    xs = multi_device.split_and_load(x, devices)
    ys = multi_device.split_and_load(y, devices)
    autograd.training = True
    outs = [lenet(xi, params) for xi, params in zip(xs, replicas)]
    losses = [autograd.softmax_cross_entropy(out, yi) for out, yi in zip(outs, ys)]
    grads = []
    for loss, xi in zip(losses, xs):
        # Each loss is the mean over its part: scaling by the part's share of the batch makes the sum over
        # replicas the gradient of the mean over the whole batch.
        g = dict(autograd.backward(loss, dy=len(xi) / len(x)))
        grads.append(g)
    for i in range(len(replicas[0])):
        multi_device.all_reduce([g[params[i]] for g, params in zip(grads, replicas)], backend=allreduce)
    for params, g, sgd in zip(replicas, grads, optimizers):
        for p in params:
            sgd.apply(p.name, p, g[p])
        sgd.step()
    loss_sum = sum(loss.item() * len(xi) for loss, xi in zip(losses, xs))
    correct = sum(int((tensor.to_numpy(tensor.argmax(out, 1)) == tensor.to_numpy(yi)).sum())
                  for out, yi in zip(outs, ys))
    return loss_sum, correct


def evaluate(x, y, replicas, devices, batch_size: int) -> float:
    """Accuracy, each test batch split across the replicas (the tutorial leaves this as an exercise)."""
    autograd.training = False
    correct = 0
    for i in range(0, len(y), batch_size):
        xb, yb = x[i:i + batch_size], y[i:i + batch_size]
        k = min(len(devices), len(yb))  # a last batch smaller than the replica count uses fewer replicas
        for xi, yi, params in zip(multi_device.split_and_load(xb, devices[:k]),
                                  multi_device.split_and_load(yb, devices[:k]), replicas):
            correct += int((tensor.to_numpy(tensor.argmax(lenet(xi, params), 1)) == tensor.to_numpy(yi)).sum())
    return correct / len(y)


# ---------------------------------------------------------------- devices and main
def choose_devices(kind: str, replicas: int) -> list:
    """`replicas` devices: cuda:0 .. cuda:K-1, or the CPU device K times. Exits with a message when the
    GPUs asked for are not there."""
    if kind == "auto":
        kind = "cuda" if device.cuda_is_available() else "cpu"
    if kind == "cpu":
        return [device.create_cpu_device()] * replicas
    have = device.get_num_gpus()
    if have == 0:
        try:
            device.create_cuda_gpu_on(0)  # raises CudaError saying what is missing (build, driver or GPU)
        except CudaError as e:
            sys.exit(f"--device cuda: {e}; --device cpu puts the replicas on the CPU")
    if have < replicas:
        sys.exit(f"--device cuda --replicas {replicas} needs {replicas} GPUs, this machine has {have}: pass "
                 f"--replicas {have}, or --device cpu to put all the replicas on the CPU")
    return [device.create_cuda_gpu_on(i) for i in range(replicas)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--replicas", type=int, default=2, help="model replicas (K devices)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda when a CUDA build sees a GPU, else cpu (all replicas on the CPU device)")
    p.add_argument("--allreduce", choices=multi_device.BACKENDS, default="auto",
                   help="how gradients are summed: nccl (NCCL across distinct GPUs), host (through host copies), "
                        "auto (nccl when possible, else host)")
    p.add_argument("--data-dir", help="directory with the four MNIST IDX files (optionally .gz)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="the whole batch, split across the replicas")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="CPU threads, shared by CPU replicas (default: all)")
    args = p.parse_args(argv)
    if args.replicas < 1 or args.epochs < 1 or args.lr <= 0 or args.batch_size < args.replicas:
        p.error("--replicas and --epochs must be >= 1, --batch-size >= --replicas and --lr > 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        device.set_num_threads(args.threads)
    devices = choose_devices(args.device, args.replicas)
    replicas = multi_device.replicate(init_params(args.seed), devices)
    try:
        # the route the gradients take, decided (and an impossible --allreduce nccl reported) before any data
        route = multi_device.choose_backend([params[0] for params in replicas], args.allreduce)
    except (ValueError, CommError) as e:
        sys.exit(f"--allreduce {args.allreduce}: {e}")
    if args.data_dir:
        (train_x, train_y), (test_x, test_y) = load_mnist(args.data_dir)
    else:
        (train_x, train_y), (test_x, test_y) = load_digits(args.seed)
    optimizers = [opt.SGD(lr=args.lr, momentum=args.momentum) for _ in devices]
    steps = len(train_y) // args.batch_size
    if steps == 0:
        sys.exit(f"the training set ({len(train_y)} samples) is smaller than one batch of {args.batch_size}")
    where = ", ".join(str(d) for d in devices)
    if devices[0].is_cpu():
        where += f" (one CPU device, {device.get_num_threads()} threads shared by the replicas)"
    print(f"{args.replicas} replicas on {where}; batch {args.batch_size} split across them, {steps} steps per "
          f"epoch, {len(train_y)} train / {len(test_y)} test; gradients summed by all_reduce over {route}",
          flush=True)
    rng = np.random.default_rng(args.seed)
    test_acc = 0.0
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(train_y))
        start, loss_sum, correct = time.perf_counter(), 0.0, 0
        for step in range(steps):
            idx = order[step * args.batch_size:(step + 1) * args.batch_size]
            batch_loss, batch_correct = train_batch(train_x[idx], train_y[idx], replicas, devices, optimizers,
                                                    route)
            loss_sum, correct = loss_sum + batch_loss, correct + batch_correct
        for d in set(devices):
            d.Sync()  # GPU kernels run asynchronously: wait for them before reading the clock
        elapsed = time.perf_counter() - start
        test_acc = evaluate(test_x, test_y, replicas, devices, 256)
        divergence = multi_device.max_divergence(replicas)
        seen = steps * args.batch_size
        print(f"epoch {epoch:3d}  train loss {loss_sum / seen:.4f}  train acc {correct / seen:.4f}  "
              f"test acc {test_acc:.4f}  ({elapsed:.2f} s)  replicas identical: "
              f"{'yes' if divergence == 0 else 'NO'} (max difference {divergence:.1e})", flush=True)
        if divergence != 0:
            print("the replicas' parameters diverged: every replica must apply the same summed gradient",
                  file=sys.stderr)
            return 1
    print(f"final test accuracy {test_acc:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
