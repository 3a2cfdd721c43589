"""The training loop users write, with numpy work around each step, as SINGA's examples/cnn/train_cnn.py
does every batch: augmentation (np.pad and a random crop), accuracy (argmax of the logits), plus one
256x256 numpy matmul. bench/bench_train.py starts one worker per library, each in its own
process importing only that library (so neither one's thread settings reach the other), and times
blocks of

    loop:  augment -> training step -> accuracy and the matmul, per batch
    step:  the training step alone, on the same batch
    numpy: the numpy work alone

The worker: ``python bench/train_loop.py singa|torch [--threads N] [--batch B]`` reads lines ``loop N``,
``step N`` or ``numpy N`` on stdin and answers each with the seconds per iteration of N iterations.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def numpy_work(rng, x, logits, y, a):
    """Augments the next batch and scores this one: what the loop does in numpy around each step."""
    import numpy as np

    pad = np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)))
    i, j = rng.integers(0, 5, 2)
    batch = np.ascontiguousarray(pad[:, :, i:i + 28, j:j + 28])
    accuracy = float((np.argmax(logits, 1) == y).mean()) if logits is not None else 0.0
    a @ a
    return batch, accuracy


def make_step(lib: str, x, y, threads):
    """A training step of SINGA's MNIST CNN (SGD, momentum 0.9) on a numpy batch; returns the logits."""
    import numpy as np

    if lib == "singa":
        from singa_lite import autograd, device, opt, tensor

        from bench_models import SingaCNN

        if threads:
            device.set_num_threads(threads)
        model, sgd, ty = SingaCNN(), opt.SGD(lr=0.01, momentum=0.9), tensor.from_numpy(y)

        def step(batch):
            autograd.training = True
            out = model.forward(tensor.from_numpy(batch))
            sgd(autograd.softmax_cross_entropy(out, ty))
            return tensor.to_numpy(out)
        return step
    import torch

    from bench_models import torch_cnn

    if threads:
        torch.set_num_threads(threads)
    model = torch_cnn(torch)
    t_opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn, ty = torch.nn.CrossEntropyLoss(), torch.from_numpy(y.astype(np.int64))

    def step(batch):
        t_opt.zero_grad(set_to_none=True)
        out = model(torch.from_numpy(batch))
        loss_fn(out, ty).backward()
        t_opt.step()
        return out.detach().numpy()
    return step


def worker(lib: str, threads: int | None, batch_size: int) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch_size, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, batch_size).astype(np.int32)
    a = rng.standard_normal((256, 256)).astype(np.float32)
    step = make_step(lib, x, y, threads)
    state = {"batch": x, "logits": None}

    def loop():
        state["batch"], _ = numpy_work(rng, x, state["logits"], y, a)
        state["logits"] = step(state["batch"])

    runs = {"loop": loop, "step": lambda: step(x), "numpy": lambda: numpy_work(rng, x, state["logits"], y, a)}
    for _ in range(5):
        loop()
    print("ready", flush=True)
    for line in sys.stdin:
        what, n = line.split()
        fn = runs[what]
        start = time.perf_counter()
        for _ in range(int(n)):
            fn()
        print((time.perf_counter() - start) / int(n), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lib", choices=("singa", "torch"))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    if args.threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    sys.path.insert(0, HERE)
    worker(args.lib, args.threads, args.batch)
