"""The convolutions of ResNet-18 (CIFAR form, batch 16) one by one: forward and backward (input and weight
gradients; the stem's input gradient is not needed) of singa_lite on oneDNN, singa_lite as im2col + GEMM
(oneDNN switched off), and PyTorch, in the same process, blocks interleaved, medians. ms per call; the column
'x' is how many such layers one step has; GF/s counts the forward's multiply-adds twice. Then batch norm's
training forward + backward at each stage's shape: singa_lite's fused kernels, the element-wise ops they
replaced (composed here as ops/nn.py still does for other devices), and PyTorch's.

    python bench/bench_conv_layers.py                 # 2 threads
    python bench/bench_conv_layers.py --threads 1
"""
from __future__ import annotations

import argparse
import statistics
import time

# name, in channels, out channels, input size, kernel, stride, layers of this shape in one step
LAYERS = [("stem", 3, 64, 32, 3, 1, 1), ("s1", 64, 64, 32, 3, 1, 4), ("s2_down", 64, 128, 32, 3, 2, 1),
          ("s2_short", 64, 128, 32, 1, 2, 1), ("s2", 128, 128, 16, 3, 1, 3), ("s3_down", 128, 256, 16, 3, 2, 1),
          ("s3_short", 128, 256, 16, 1, 2, 1), ("s3", 256, 256, 8, 3, 1, 3), ("s4_down", 256, 512, 8, 3, 2, 1),
          ("s4_short", 256, 512, 8, 1, 2, 1), ("s4", 512, 512, 4, 3, 1, 3)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--repeat", type=int, default=5, help="timed blocks per side")
    p.add_argument("--calls", type=int, default=4, help="calls per block")
    args = p.parse_args()
    import numpy as np
    import torch

    from singa_lite import _core, device, tensor
    from singa_lite._runtime import onednn
    from singa_lite.ops.nn import _Conv2d

    device.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    F = torch.nn.functional
    print(f"threads {args.threads}, batch {args.batch}; singa_lite's oneDNN: {onednn.status()}")
    print(f"{'layer':9s} {'x':>2s} | {'fwd ms: dnnl':>12s} {'im2col':>7s} {'torch':>7s} | {'bwd ms: dnnl':>12s} "
          f"{'im2col':>7s} {'torch':>7s} | {'fwd GF/s dnnl':>13s} {'torch':>6s}")
    totals = np.zeros(6)
    rng = np.random.default_rng(0)
    for name, C, OC, H, k, s, count in LAYERS:
        x = rng.standard_normal((args.batch, C, H, H)).astype(np.float32)
        w = (rng.standard_normal((OC, C, k, k)) * 0.05).astype(np.float32)
        data_input = name == "stem"
        sx, sw = tensor.from_numpy(x).data, tensor.from_numpy(w).data
        oh = (H + 2 * (k // 2) - k) // s + 1
        dy = rng.standard_normal((args.batch, OC, oh, oh)).astype(np.float32)
        sdy = tensor.from_numpy(dy).data
        tx, tw, tdy = torch.from_numpy(x).requires_grad_(not data_input), torch.from_numpy(w).requires_grad_(), \
            torch.from_numpy(dy)

        def singa(use_dnnl):
            op = _Conv2d(s, k // 2)
            op.needs_grad = (not data_input, True, False)

            def fwd():
                _core.set_onednn_enabled(use_dnnl)
                op.forward(sx, sw)

            def bwd():
                _core.set_onednn_enabled(use_dnnl)
                op.backward(sdy)
            fwd()
            return fwd, bwd

        def torch_fwd():
            with torch.no_grad():
                F.conv2d(tx, tw, None, s, k // 2)

        out = F.conv2d(tx, tw, None, s, k // 2)

        def torch_bwd():
            torch.autograd.grad(out, [tw] if data_input else [tx, tw], tdy, retain_graph=True)
        d_fwd, d_bwd = singa(True)
        i_fwd, i_bwd = singa(False)
        fns = [d_fwd, i_fwd, torch_fwd, d_bwd, i_bwd, torch_bwd]
        times = [[] for _ in fns]
        for f in fns:
            f()
        for _ in range(args.repeat):
            for f, t in zip(fns, times):
                start = time.perf_counter()
                for _ in range(args.calls):
                    f()
                t.append((time.perf_counter() - start) / args.calls * 1e3)
        _core.set_onednn_enabled(True)
        med = np.array([statistics.median(t) for t in times])
        totals += med * count
        flops = 2 * args.batch * OC * oh * oh * C * k * k
        print(f"{name:9s} {count:2d} | {med[0]:12.2f} {med[1]:7.2f} {med[2]:7.2f} | {med[3]:12.2f} {med[4]:7.2f} "
              f"{med[5]:7.2f} | {flops / med[0] / 1e6:13.0f} {flops / med[2] / 1e6:6.0f}")
    print(f"{'step':9s} {'':2s} | {totals[0]:12.1f} {totals[1]:7.1f} {totals[2]:7.1f} | {totals[3]:12.1f} "
          f"{totals[4]:7.1f} {totals[5]:7.1f} |  (ms, all of one step's convolutions)")
    batch_norm(args, np, torch, _core, tensor)


def composed_batch_norm(_core, x, scale, bias, dy, eps=1e-5):
    """Batch norm's training forward + backward as the element-wise ops ops/nn.py composes where no fused kernel
    runs (the CPU path before the fused one)."""
    axes, C = [0, 2, 3], x.shape[1]
    pshape, M = [1, C, 1, 1], x.numel // C
    mean = _core.mean(x, axes, True)
    xhat = _core.sub(x, mean)
    inv = _core.add_scalar(_core.mean(_core.square(xhat), axes, True), eps)
    _core.sqrt(inv, out=inv)
    _core.reciprocal(inv, out=inv)
    _core.mul(xhat, inv, out=xhat)
    sb = scale.reshape(pshape)
    y = _core.mul(xhat, sb)
    _core.add(y, bias.reshape(pshape), out=y)
    dbias = _core.sum(dy, axes, True)
    ds = _core.sum(_core.mul(dy, xhat), axes, True)
    k = _core.mul(sb, inv)
    dx = _core.mul(xhat, ds)
    _core.add(dx, dbias, out=dx)
    _core.sub(_core.mul_scalar(dy, float(M)), dx, out=dx)
    _core.mul_scalar(k, 1.0 / M, out=k)
    _core.mul(dx, k, out=dx)
    return y, dx


def batch_norm(args, np, torch, _core, tensor):
    rng = np.random.default_rng(1)
    print("\nbatch norm, training forward + backward, ms per call (count per step)")
    print(f"{'shape':18s} {'x':>2s} | {'fused':>7s} {'composed':>8s} {'torch':>7s}")
    for C, H, count in ((64, 32, 5), (128, 16, 5), (256, 8, 5), (512, 4, 5)):
        shape = (args.batch, C, H, H)
        x, dy = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
        sc, bi = (rng.standard_normal(C).astype(np.float32) for _ in range(2))
        sx, sdy, ssc, sbi = (tensor.from_numpy(a).data for a in (x, dy, sc, bi))
        tx = torch.from_numpy(x).requires_grad_()
        tsc, tbi = torch.from_numpy(sc).requires_grad_(), torch.from_numpy(bi).requires_grad_()
        tdy = torch.from_numpy(dy)

        def fused():
            _, mean, _, inv_std = _core.batch_norm_train_forward(sx, ssc, sbi, 1e-5)
            _core.batch_norm_train_backward(sx, sdy, mean, inv_std, ssc, True)

        def torch_bn():
            y = torch.nn.functional.batch_norm(tx, None, None, tsc, tbi, True)
            torch.autograd.grad(y, [tx, tsc, tbi], tdy)
        fns = [fused, lambda: composed_batch_norm(_core, sx, ssc, sbi, sdy), torch_bn]
        times = [[] for _ in fns]
        for f in fns:
            f()
        for _ in range(args.repeat):
            for f, t in zip(fns, times):
                start = time.perf_counter()
                for _ in range(4 * args.calls):
                    f()
                t.append((time.perf_counter() - start) / (4 * args.calls) * 1e3)
        med = [statistics.median(t) for t in times]
        print(f"{str(shape):18s} {count:2d} | {med[0]:7.3f} {med[1]:8.3f} {med[2]:7.3f}")


if __name__ == "__main__":
    main()
