"""Autograd, optimizers and a training step on the GPU against the CPU, with the same Python code:
every autograd operator forward and backward (float32), each optimizer's steps, and SINGA's CNN trained
for a few steps. Marked `gpu`: skipped where no GPU is usable."""
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from singa_lite import autograd, device, layer, model, opt, tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from autograd_cases import CASES, make_inputs  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("training")]  # training: tests/conftest.py
TOL = dict(rtol=2e-4, atol=2e-5)


@pytest.fixture(scope="module")
def gpu():
    return device.create_cuda_gpu_on(0)


def on(dev, a, grad=True):
    return tensor.Tensor(data=np.asarray(a, np.float32), device=dev, requires_grad=grad, stores_grad=grad)


@pytest.mark.parametrize("name,fn,ref,specs", CASES, ids=[c[0] for c in CASES])
def test_operator_forward_and_backward(gpu, name, fn, ref, specs):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    arrays = make_inputs(rng, specs)
    results = []
    for dev in (device.get_default_device(), gpu):
        params = [on(dev, a) for a in arrays]
        y = fn(*params)
        assert y.device is dev
        R = tensor.Tensor(data=np.random.default_rng(1).standard_normal(y.shape).astype(tensor.to_numpy(y).dtype),
                          device=dev, requires_grad=False)
        grads = autograd.gradients(y, R)
        results.append((tensor.to_numpy(y), [tensor.to_numpy(grads[p]) for p in params]))
    (y_cpu, g_cpu), (y_gpu, g_gpu) = results
    np.testing.assert_allclose(y_gpu, y_cpu, **TOL)
    for a, b in zip(g_gpu, g_cpu):
        np.testing.assert_allclose(a, b, **TOL)


def run_case(dev, fn, arrays, dtype):
    """fn's output and the gradients of its inputs on `dev`, all in `dtype`; or the exception it raised."""
    try:
        params = [tensor.Tensor(data=np.asarray(a, dtype), device=dev, requires_grad=True, stores_grad=True)
                  for a in arrays]
        y = fn(*params)
        R = tensor.Tensor(data=np.random.default_rng(1).standard_normal(y.shape).astype(dtype), device=dev,
                          requires_grad=False)
        grads = autograd.gradients(y, R)
        return tensor.to_numpy(y), [tensor.to_numpy(grads[p]) for p in params]
    except (TypeError, ValueError) as e:
        return e


@pytest.mark.parametrize("name,fn,ref,specs", CASES, ids=[c[0] for c in CASES])
def test_operator_forward_and_backward_in_float16(gpu, name, fn, ref, specs):
    """Every operator in float16, GPU against CPU: both compute each op in float32 and round its result once, so
    they differ by rounding only (accumulation order in sums and GEMMs). An operator the CPU refuses in float16 must
    be refused on the GPU with the same error type."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    arrays = [np.asarray(a, np.float16) for a in make_inputs(rng, specs)]
    on_cpu = run_case(device.get_default_device(), fn, arrays, np.float16)
    on_gpu = run_case(gpu, fn, arrays, np.float16)
    if isinstance(on_cpu, Exception):
        assert type(on_gpu) is type(on_cpu), (on_cpu, on_gpu)
        return
    assert not isinstance(on_gpu, Exception), on_gpu
    (y_cpu, g_cpu), (y_gpu, g_gpu) = on_cpu, on_gpu
    assert y_gpu.dtype == y_cpu.dtype == (np.float64 if name == "cast_same_dtype" else np.float16)  # it casts up
    for got, want in [(y_gpu, y_cpu), *zip(g_gpu, g_cpu)]:
        want64 = want.astype(np.float64)
        bound = 2e-2 * max(1.0, np.abs(want64[np.isfinite(want64)]).max(initial=0.0))
        np.testing.assert_allclose(got.astype(np.float64), want64, rtol=2e-2, atol=bound, equal_nan=True)


@pytest.mark.parametrize("make", [lambda: opt.SGD(lr=0.1, momentum=0.9, weight_decay=1e-4),
                                  lambda: opt.SGD(lr=0.1, momentum=0.9, nesterov=True),
                                  lambda: opt.Adam(lr=0.01), lambda: opt.RMSProp(lr=0.01),
                                  lambda: opt.AdaGrad(lr=0.05),
                                  lambda: opt.AdamW(lr=0.01, weight_decay=0.1, amsgrad=True),
                                  lambda: opt.LAMB(lr=0.05), lambda: opt.LARS(lr=1.0, eta=0.05)],
                         ids=["sgd", "nesterov", "adam", "rmsprop", "adagrad", "adamw", "lamb", "lars"])
def test_optimizer_steps(gpu, make):
    rng = np.random.default_rng(0)
    w0, grads = rng.standard_normal((13, 7)), [rng.standard_normal((13, 7)) for _ in range(5)]
    final = []
    for dev in (device.get_default_device(), gpu):
        w = on(dev, w0)
        w.name = "w"
        o = make()
        for g in grads:
            o.apply("w", w, on(dev, g, grad=False))
            o.step()
        final.append(tensor.to_numpy(w))
    np.testing.assert_allclose(final[1], final[0], **TOL)


class CNN(model.Model):
    """The CNN of SINGA's distributed-training page (conv 20@5x5, pool, conv 50@5x5, pool, fc 500, fc 10)."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = layer.Conv2d(20, 5, padding=0), layer.Conv2d(50, 5, padding=0)
        self.pool1, self.pool2 = layer.MaxPool2d(2, 2, padding=0), layer.MaxPool2d(2, 2, padding=0)
        self.fc1, self.fc2 = layer.Linear(500), layer.Linear(10)
        self.relu, self.flatten = layer.ReLU(), layer.Flatten()
        self.loss = layer.SoftMaxCrossEntropy()

    def forward(self, x):
        y = self.pool1(self.conv1(x))
        y = self.pool2(self.conv2(y))
        return self.fc2(self.relu(self.fc1(self.flatten(y))))

    def train_one_batch(self, x, y):
        out = self.forward(x)
        loss = self.loss(out, y)
        self.optimizer(loss)
        return out, loss


def test_cnn_training_steps_match_the_cpu(gpu):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 16).astype(np.int32)
    losses, weights = [], []
    for dev in (device.get_default_device(), gpu):
        dev.SetRandSeed(7)  # the GPU draws the CPU's random numbers: identical initial weights
        m = CNN()
        m.set_optimizer(opt.SGD(lr=0.05, momentum=0.9))
        tx, ty = tensor.Tensor(data=x, device=dev), tensor.Tensor(data=y, device=dev)
        m.compile([tx], is_train=True)
        run = []
        for _ in range(5):
            _, loss = m(tx, ty)
            run.append(tensor.to_numpy(loss)[0])
        dev.Sync()
        losses.append(run)
        weights.append({k: tensor.to_numpy(v) for k, v in m.get_params().items()})
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-3)
    for k in weights[0]:
        np.testing.assert_allclose(weights[1][k], weights[0][k], rtol=1e-3, atol=1e-4, err_msg=k)
