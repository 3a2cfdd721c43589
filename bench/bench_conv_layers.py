"""The convolutions of ResNet-18 (CIFAR form, batch 16) one by one: forward and backward (input and weight
gradients; the stem's input gradient is not needed) of singa_lite on oneDNN, singa_lite as im2col + GEMM
(oneDNN switched off), and PyTorch, in the same process, blocks interleaved, medians. ms per call; the column
'x' is how many such layers one step has; GF/s counts the forward's multiply-adds twice.

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


if __name__ == "__main__":
    main()
