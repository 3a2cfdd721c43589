"""What SINGA's graph mode and the time profiler cost in singa_lite: training steps of one model run in
four settings in the same process, blocks interleaved so machine noise hits all of them.

- eager:      ``model.compile(..., use_graph=False)``
- graph:      ``use_graph=True``. singa_lite runs graph mode eagerly (see singa_lite/model.py): a step
              differs by the device graph flag being on and one ``dev.RunGraph`` (Sync + counter) after it,
              so the expected difference is none. The parameters after the same steps are compared bit for
              bit.
- profile1:   eager with ``dev.SetVerbosity(1)``, ``SetSkipIteration(0)``: every operator's forward and
              backward timed through the autograd engine's hook.
- profile2:   the same at verbosity 2 (the per-operator table costs nothing more while timing).

Models: SINGA's examples/cnn CNN (conv 20@5x5 relu, pool, conv 50@5x5 relu, pool, fc 500, relu, fc 10,
batch 64, MNIST-sized input) and its MLP (784 -> 100 relu -> 10, batch 64). Reports, per setting, the
fastest block's ms per step (the least disturbed on a shared machine) with its ratio to eager's fastest
(> 1: slower than eager), and the median; then the same for the process's CPU time per step, which a
loaded machine disturbs less than wall time (run with ``OMP_NUM_THREADS=1`` so it counts one thread).

    OMP_NUM_THREADS=1 python bench/bench_graph.py --repeat 9

    python bench/bench_graph.py                       # both models
    python bench/bench_graph.py --model mlp --repeat 9 --steps 20
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from singa_lite import device, layer, model, opt, tensor

SETTINGS = ("eager", "graph", "profile1", "profile2")


class CNN(model.Model):
    def __init__(self):
        super().__init__()
        self.conv1 = layer.Conv2d(1, 20, 5, activation="RELU")
        self.conv2 = layer.Conv2d(20, 50, 5, activation="RELU")
        self.pool1, self.pool2 = layer.MaxPool2d(2, 2), layer.MaxPool2d(2, 2)
        self.flatten, self.relu = layer.Flatten(), layer.ReLU()
        self.linear1, self.linear2 = layer.Linear(500), layer.Linear(10)
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        y = self.pool2(self.conv2(self.pool1(self.conv1(x))))
        return self.linear2(self.relu(self.linear1(self.flatten(y))))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


class MLP(CNN):
    def __init__(self):
        model.Model.__init__(self)
        self.linear1, self.linear2 = layer.Linear(100), layer.Linear(10)
        self.relu, self.loss = layer.ReLU(), layer.SoftMaxCrossEntropy()

    def forward(self, x):
        return self.linear2(self.relu(self.linear1(x)))


MODELS = {"cnn": (CNN, (64, 1, 28, 28)), "mlp": (MLP, (64, 784))}


def build(name: str, setting: str, dev):
    cls, shape = MODELS[name]
    dev.SetRandSeed(0)
    m = cls()
    m.set_optimizer(opt.SGD(lr=0.01, momentum=0.9))
    rng = np.random.default_rng(0)
    tx = tensor.from_numpy(rng.random(shape, dtype=np.float32))
    ty = tensor.from_numpy(rng.integers(0, 10, shape[0]).astype(np.int32))
    m.compile([tx], is_train=True, use_graph=setting == "graph")
    return m, tx, ty


def block(m, tx, ty, setting: str, dev, steps: int) -> float:
    dev.SetVerbosity({"profile1": 1, "profile2": 2}.get(setting, 0))
    dev.SetSkipIteration(0)
    m.graph(setting == "graph")
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        m(tx, ty)
    dt, dc = (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps
    dev.SetVerbosity(0)
    return dt, dc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), action="append", help="default: all")
    p.add_argument("--repeat", type=int, default=7, help="timed blocks per setting")
    p.add_argument("--steps", type=int, default=10, help="steps per block")
    p.add_argument("--gap", type=float, default=0.1, help="seconds of sleep before each block")
    args = p.parse_args()
    dev = device.get_default_device()
    for name in args.model or sorted(MODELS):
        # identical results first: the same steps, eager and graph, from the same start
        finals = {}
        for setting in ("eager", "graph"):
            m, tx, ty = build(name, setting, dev)
            for _ in range(3):
                m(tx, ty)
            finals[setting] = {k: tensor.to_numpy(v) for k, v in m.get_states().items()}
        same = all(np.array_equal(finals["eager"][k], finals["graph"][k]) for k in finals["eager"])

        runs = {s: build(name, s, dev) for s in SETTINGS}
        for s in SETTINGS:  # warm-up
            block(*runs[s], s, dev, 2)
        times = {s: [] for s in SETTINGS}
        for _ in range(args.repeat):
            for s in SETTINGS:
                time.sleep(args.gap)
                times[s].append(block(*runs[s], s, dev, args.steps))
        print(f"{name}: graph results identical to eager: {same}")
        for i, clock in enumerate(("wall", "cpu")):
            best = {s: min(t[i] for t in v) for s, v in times.items()}
            for s in SETTINGS:
                print(f"  {clock:4s} {s:9s} best {best[s] * 1e3:8.2f} ms/step  x{best[s] / best['eager']:.3f} of "
                      f"eager   median {statistics.median(t[i] for t in times[s]) * 1e3:8.2f} ms/step")
        dev.ResetGraph()


if __name__ == "__main__":
    main()
