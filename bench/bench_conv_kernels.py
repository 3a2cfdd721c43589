"""The CPU kernels under a CNN step other than GEMM, against PyTorch's own kernels for the same work, measured
in the same run: im2col / col2im (torch's unfold / fold), 2x2 max pooling forward with indices and its
backward, ReLU's backward (torch's threshold_backward), the NCHW transpose with the bias. Shapes are those of
SINGA's MNIST CNN (bench/bench_models.py) at batch 64: conv1 1->20 5x5 on 28x28, conv2 20->50 5x5 on 12x12.

Blocks of calls are interleaved (singa_lite, torch, ...); medians over blocks. The time is per call;
ratio = torch time / singa_lite time (> 1: singa_lite faster). --threads 1 (the default) compares the kernels
themselves; with more threads both libraries split the work.

    python bench/bench_conv_kernels.py
    python bench/bench_conv_kernels.py --threads 2 --repeat 9
"""
from __future__ import annotations

import argparse
import statistics
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--threads", type=int, default=1, help="threads for both libraries")
    p.add_argument("--repeat", type=int, default=7, help="timed blocks per library per case")
    p.add_argument("--calls", type=int, default=50, help="calls per timed block")
    p.add_argument("--filter", default="", help="run only cases whose name contains this")
    return p.parse_args()


def cases(np, torch, _core, from_numpy):
    """(name, singa_lite call, torch call) for each kernel and shape."""
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    out = []
    for tag, (N, C, H, OC, k) in {"conv1": (64, 1, 28, 20, 5), "conv2": (64, 20, 12, 50, 5)}.items():
        x = rng.standard_normal((N, C, H, H)).astype(np.float32)
        sx, tx = from_numpy(x), torch.from_numpy(x)
        cols = _core.im2col(sx, [k, k], [1, 1], [0, 0], [1, 1])
        tcols = F.unfold(tx, k)
        out.append((f"{tag}_im2col", lambda sx=sx, k=k: _core.im2col(sx, [k, k], [1, 1], [0, 0], [1, 1]),
                    lambda tx=tx, k=k: F.unfold(tx, k)))
        out.append((f"{tag}_col2im", lambda c=cols, s=[N, C, H, H], k=k: _core.col2im(c, s, [k, k], [1, 1], [0, 0],
                                                                                      [1, 1]),
                    lambda c=tcols, h=H, k=k: F.fold(c, (h, h), k)))
        oh = H - k + 1
        y = np.maximum(rng.standard_normal((N, OC, oh, oh)), 0).astype(np.float32)
        sy, ty = from_numpy(y), torch.from_numpy(y)
        out.append((f"{tag}_maxpool", lambda sy=sy: _core.max_pool2d(sy, [2, 2], [2, 2], [0, 0]),
                    lambda ty=ty: F.max_pool2d(ty, 2, 2, return_indices=True)))
        p, arg = _core.max_pool2d(sy, [2, 2], [2, 2], [0, 0])
        tp, targ = F.max_pool2d(ty, 2, 2, return_indices=True)
        out.append((f"{tag}_maxpool_backward", lambda p=p, a=arg, s=[N, OC, oh, oh]: _core.max_pool2d_backward(p, a, s),
                    lambda tp=tp, ty=ty, ta=targ: torch.ops.aten.max_pool2d_with_indices_backward(
                        tp, ty, [2, 2], [2, 2], [0, 0], [1, 1], False, ta)))
        dy = rng.standard_normal(y.shape).astype(np.float32)
        sdy, tdy = from_numpy(dy), torch.from_numpy(dy)
        out.append((f"{tag}_relu_backward", lambda sy=sy, sdy=sdy: _core.relu_grad(sy, sdy),
                    lambda ty=ty, tdy=tdy: torch.ops.aten.threshold_backward(tdy, ty, 0.0)))
        y2 = rng.standard_normal((OC, N * oh * oh)).astype(np.float32)
        b = rng.standard_normal(OC).astype(np.float32)
        sy2, sb, ty2, tb = from_numpy(y2), from_numpy(b), torch.from_numpy(y2), torch.from_numpy(b)
        L = oh * oh
        out.append((f"{tag}_to_nchw_bias",
                    lambda y2=sy2, b=sb, OC=OC, N=N, L=L: _core.add(y2.reshape([OC, N, L]).transpose([1, 0, 2]),
                                                                    b.reshape([1, OC, 1])),
                    lambda y2=ty2, b=tb, OC=OC, N=N, L=L: y2.reshape(OC, N, L).permute(1, 0, 2) + b.reshape(1, OC, 1)))
    return out


def time_block(fn, calls):
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main():
    args = parse_args()
    import numpy as np
    import torch

    from singa_lite import _core, device, tensor

    device.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}, {args.repeat} blocks of {args.calls} calls; times per call, medians "
          f"(range); ratio = torch / singa_lite (> 1: singa_lite faster)")
    print(f"{'case':28s} {'singa_lite us':>20s} {'torch us':>20s} {'ratio':>6s}")
    for name, ours, theirs in cases(np, torch, _core, lambda a: tensor.from_numpy(a).data):
        if args.filter not in name:
            continue
        for fn in (ours, theirs):  # warm up: first-touch pages, thread pools
            time_block(fn, 5)
        s, t = [], []
        for _ in range(args.repeat):
            s.append(time_block(ours, args.calls) * 1e6)
            t.append(time_block(theirs, args.calls) * 1e6)
        ms, mt = statistics.median(s), statistics.median(t)
        print(f"{name:28s} {ms:8.1f} ({min(s):5.0f}-{max(s):5.0f}) {mt:8.1f} ({min(t):5.0f}-{max(t):5.0f}) "
              f"{mt / ms:6.2f}")


if __name__ == "__main__":
    main()
