"""A PyTorch model exported to ONNX, imported by sonnx and fine-tuned data-parallel with DistOpt
(test_sonnx_dist.py runs `fine_tune` on shm ranks started by multiprocessing; spawned children import this
module, and need onnx but not torch: the model travels as bytes)."""
from __future__ import annotations

import io
import warnings

import numpy as np

N, STEPS, CLASSES = 8, 6, 3


def torch_model_bytes() -> bytes:
    """A small CNN made and exported by PyTorch (its TorchScript exporter: the torch.export one needs
    onnxscript, which the parity extra does not install)."""
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                              torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.Tanh(), torch.nn.Flatten(),
                              torch.nn.Linear(64, 10))
    net.eval()
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(net, (torch.randn(2, 1, 8, 8),), f, dynamo=False, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return f.getvalue()


def batch(step: int):
    rng = np.random.default_rng(500 + step)
    return rng.standard_normal((N, 1, 8, 8)).astype(np.float32), rng.integers(0, CLASSES, N).astype(np.int32)


def make_model(model_bytes: bytes):
    """SINGA's transfer-learning recipe (examples/onnx/training): the imported graph without its classifier,
    plus a new head."""
    import onnx

    from singa_lite import autograd, layer, sonnx

    class Tuned(sonnx.SONNXModel):
        def __init__(self, proto):
            super().__init__(proto)
            self.head = layer.Linear(CLASSES)

        def forward(self, x):
            return self.head(super().forward(x, last_layers=-3)[0])

        def train_one_batch(self, x, y):
            out = self.forward(x)
            loss = autograd.softmax_cross_entropy(out, y)
            self.optimizer(loss)
            return out, loss

    m = Tuned(onnx.load_from_string(model_bytes))
    return m


def train(model_bytes: bytes, comm=None):
    """Fine-tunes on STEPS batches: each rank on its half of every batch with DistOpt (comm given), or one
    process on whole batches. Returns (losses, {param name: values})."""
    from singa_lite import opt, tensor

    m = make_model(model_bytes)
    sgd = opt.SGD(lr=0.1, momentum=0.9)
    optimizer = sgd if comm is None else opt.DistOpt(sgd, communicator=comm)
    m.set_optimizer(optimizer)
    x0, _ = batch(0)
    m.compile([tensor.from_numpy(x0[:2])], is_train=True)
    rng = np.random.default_rng(7)  # the head starts the same everywhere (DistOpt would broadcast it anyway)
    m.head.W.copy_from_numpy(rng.standard_normal(m.head.W.shape).astype(np.float32) * 0.3)
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        if comm is not None:
            per = N // comm.world_size
            x, y = x[comm.rank * per:(comm.rank + 1) * per], y[comm.rank * per:(comm.rank + 1) * per]
        _, loss = m(tensor.from_numpy(x), tensor.from_numpy(y))
        losses.append(float(tensor.to_numpy(loss).reshape(-1)[0]))
    return losses, {k: tensor.to_numpy(v).copy() for k, v in m.get_params().items()}


def fine_tune(comm, model_bytes: bytes):
    losses, params = train(model_bytes, comm)
    return losses, params
