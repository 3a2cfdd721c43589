"""GPU benchmarks of the CUDA backend (issue 6), each against a peer measured in the same run:

  (a) a training step (forward, loss, backward, SGD momentum 0.9) of SINGA's MNIST CNN (batch 64) and of a
      ResNet-18-style CIFAR-10 model (batch 128) against PyTorch eager on the same GPU (goal <= 1.3x);
  (b) the float32 -> float16 cast against a device-to-device copy of the same float32 tensor, as bandwidth
      (bytes read + written per second; goal >= 80 % of the copy's);
  (c) a DistOpt step at world size 1 (NCCL) against the bare step (its overhead);
  (d) host -> device and device -> host bandwidth of 4 / 64 / 256 MiB copies with the pinned staging buffer
      against the plain pageable cudaMemcpy (the ratio staged / plain; _core.cuda_set_copy_staging switches);
  (e) the training steps of (a) with cuDNN against the fallback (im2col + cuBLAS, own pooling / batch norm).

    python bench/bench_gpu.py                 # all five; --only a|b|c|d|e; --repeat, --steps
Blocks of steps are interleaved between the two sides and medians reported; every timed region ends with
a device synchronisation on both sides. Needs a CUDA build of singa_lite and a GPU; (a) needs PyTorch with CUDA.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from singa_lite import autograd, device, opt, tensor  # noqa: E402
from bench_models import SingaCNN, SingaResNet18, torch_cnn, torch_resnet18, torch_sgd_step  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--only", choices=("a", "b", "c", "d", "e"), action="append", help="run only these parts")
    p.add_argument("--repeat", type=int, default=7, help="timed blocks per side")
    p.add_argument("--steps", type=int, default=20, help="steps per block")
    return p.parse_args()


# ----------------------------------------------------------------- timing
def interleaved(sides: dict, repeat: int, steps: int, sync: dict) -> dict:
    """Median seconds per step of each side, blocks interleaved; sync[name]() ends a timed region."""
    for name, fn in sides.items():
        for _ in range(3):
            fn()
        sync[name]()
    times = {k: [] for k in sides}
    for _ in range(repeat):
        for name, fn in sides.items():
            sync[name]()
            t = time.perf_counter()
            for _ in range(steps):
                fn()
            sync[name]()
            times[name].append((time.perf_counter() - t) / steps)
    return {k: statistics.median(v) for k, v in times.items()}


def singa_step(net, gpu, x, y, dist_opt=None):
    tx, ty = tensor.Tensor(data=x, device=gpu), tensor.Tensor(data=y, device=gpu)
    sgd = opt.SGD(lr=0.01, momentum=0.9)
    optimizer = dist_opt(sgd) if dist_opt else sgd
    autograd.training = True

    def step():
        loss = autograd.softmax_cross_entropy(net.forward(tx), ty)
        if dist_opt:
            optimizer.backward_and_update(loss)
        else:
            for p, g in autograd.backward(loss):
                sgd.apply(sgd.name_of(p), p, g)
            sgd.step()
    return step


def part_a(torch, gpu, args):
    rng = np.random.default_rng(0)
    cases = [("SINGA's MNIST CNN, batch 64", SingaCNN, torch_cnn, (64, 1, 28, 28)),
             ("ResNet-18 CIFAR, batch 128", SingaResNet18, torch_resnet18, (128, 3, 32, 32))]
    for what, singa_model, t_model, shape in cases:
        x = rng.standard_normal(shape).astype(np.float32)
        y = rng.integers(0, 10, shape[0]).astype(np.int32)
        tm = t_model(torch).cuda()
        t_step = torch_sgd_step(torch, tm, x, y, device="cuda")
        s_step = singa_step(singa_model(), gpu, x, y)
        med = interleaved({"singa": s_step, "torch": t_step}, args.repeat, args.steps,
                          {"singa": gpu.Sync, "torch": torch.cuda.synchronize})
        print(f"(a) {what:28s} singa {1e3 * med['singa']:8.3f} ms  torch {1e3 * med['torch']:8.3f} ms  "
              f"ratio singa/torch {med['singa'] / med['torch']:.2f} (goal <= 1.3)")


def part_b(torch, gpu, args):
    from singa_lite import _core

    for n in (1 << 24, 1 << 26):
        src = _core.Tensor([n], _core.DType.float32, gpu.core)
        half = _core.Tensor([n], _core.DType.float16, gpu.core)
        same = _core.Tensor([n], _core.DType.float32, gpu.core)
        med = interleaved({"cast": lambda: _core.copy_(half, src), "copy": lambda: _core.copy_(same, src)},
                          args.repeat, args.steps, {"cast": gpu.Sync, "copy": gpu.Sync})
        cast_bw, copy_bw = 6 * n / med["cast"] / 1e9, 8 * n / med["copy"] / 1e9
        print(f"(b) {n * 4 / 2**20:6.0f} MiB float32: cast to float16 {cast_bw:7.1f} GB/s, device copy "
              f"{copy_bw:7.1f} GB/s: {100 * cast_bw / copy_bw:.0f} % (goal >= 80 %)")


def part_c(torch, gpu, args):
    from singa_lite import dist

    comm = dist.init(backend="nccl", holder=dist.NcclIdHolder(), rank=0, world_size=1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, 64).astype(np.int32)
    bare = singa_step(SingaCNN(), gpu, x, y)
    wrapped = singa_step(SingaCNN(), gpu, x, y, dist_opt=lambda o: opt.DistOpt(o, communicator=comm))
    med = interleaved({"bare": bare, "DistOpt": wrapped}, args.repeat, args.steps,
                      {"bare": gpu.Sync, "DistOpt": gpu.Sync})
    print(f"(c) DistOpt at world size 1 (nccl): {1e3 * med['DistOpt']:.3f} ms vs bare step "
          f"{1e3 * med['bare']:.3f} ms: overhead {1e3 * (med['DistOpt'] - med['bare']):.3f} ms "
          f"({100 * (med['DistOpt'] / med['bare'] - 1):.0f} %)")
    comm.close()


def part_d(torch, gpu, args):
    from singa_lite import _core

    cpu = _core.Device("cpu")
    saved = _core.cuda_copy_staging()
    try:
        for mib in (4, 64, 256):
            n = mib << 18  # float32 elements
            host = _core.Tensor.from_buffer(np.random.default_rng(0).standard_normal(n).astype(np.float32))
            dev = host.to(gpu.core)
            back = _core.Tensor([n], _core.DType.float32, cpu)
            sides = {}
            for staged in (True, False):
                def h2d(staged=staged):
                    _core.cuda_set_copy_staging(staged)
                    _core.copy_(dev, host)

                def d2h(staged=staged):
                    _core.cuda_set_copy_staging(staged)
                    _core.copy_(back, dev)
                name = "staged" if staged else "plain"
                sides[f"h2d {name}"], sides[f"d2h {name}"] = h2d, d2h
            steps = max(1, min(args.steps, 2048 // mib))
            med = interleaved(sides, args.repeat, steps, {k: gpu.Sync for k in sides})
            for way in ("h2d", "d2h"):
                st, pl = (4 * n / med[f"{way} {k}"] / 1e9 for k in ("staged", "plain"))
                print(f"(d) {mib:4d} MiB {way}: staged {st:6.1f} GB/s, plain {pl:6.1f} GB/s, ratio staged/plain "
                      f"{st / pl:.2f}")
    finally:
        _core.cuda_set_copy_staging(saved)


def part_e(torch, gpu, args):
    from singa_lite import _core

    if not _core.cudnn_available():
        print(f"(e) skipped: cuDNN not used ({_core.cudnn_unavailable_reason()})")
        return
    rng = np.random.default_rng(0)
    for what, singa_model, shape in (("SINGA's MNIST CNN, batch 64", SingaCNN, (64, 1, 28, 28)),
                                     ("ResNet-18 CIFAR, batch 128", SingaResNet18, (128, 3, 32, 32))):
        x = rng.standard_normal(shape).astype(np.float32)
        y = rng.integers(0, 10, shape[0]).astype(np.int32)
        steps = {}
        for use in (True, False):
            inner = singa_step(singa_model(), gpu, x, y)

            def step(inner=inner, use=use):
                _core.set_cudnn_enabled(use)
                inner()
            steps["cudnn" if use else "fallback"] = step
        try:
            med = interleaved(steps, args.repeat, args.steps, {k: gpu.Sync for k in steps})
        finally:
            _core.set_cudnn_enabled(True)
        print(f"(e) {what:28s} cuDNN {1e3 * med['cudnn']:8.3f} ms  fallback {1e3 * med['fallback']:8.3f} ms  "
              f"ratio cudnn/fallback {med['cudnn'] / med['fallback']:.2f}")


def main():
    args = parse_args()
    parts = args.only or ("a", "b", "c", "d", "e")
    if not device.cuda_is_available():
        sys.exit("needs a GPU and a CUDA build of singa_lite (cuda available: False)")
    torch = None
    if "a" in parts:
        try:
            import torch
        except ImportError:
            sys.exit("part (a) compares against PyTorch: install a CUDA build of torch, or run --only b/c/d/e")
        if not torch.cuda.is_available():
            sys.exit("part (a) needs torch with CUDA (torch.cuda.is_available() is False)")
    gpu = device.create_cuda_gpu_on(0)
    info = __import__("singa_lite").build_info()
    print(f"GPU: {torch.cuda.get_device_name(0) if torch else 'cuda:0'}; torch {torch.__version__ if torch else '-'}; "
          f"singa_lite build {info['cuda']}; cuDNN {info['cudnn']}")
    for part in parts:
        {"a": part_a, "b": part_b, "c": part_c, "d": part_d, "e": part_e}[part](torch, gpu, args)


if __name__ == "__main__":
    main()
