"""A transformer encoder layer trained with DistOpt on shm ranks: each rank takes its share of the batch, and
after a few SGD steps every rank's parameters equal those of one process trained on the whole batch."""
from __future__ import annotations

import numpy as np

from singa_lite import autograd, layer, opt, tensor

BATCH, SEQ, WIDTH, CLASSES = 4, 6, 16, 3


def make_model():
    enc = layer.TransformerEncoderLayer(WIDTH, 4, 32, dropout=0.0)
    head = layer.Linear(WIDTH, CLASSES)
    rng = np.random.default_rng(0)
    for lay in (enc, head):
        lay.set_params({k: rng.standard_normal(v.shape).astype(np.float32) * 0.3 for k, v in lay.get_params().items()})
    return enc, head


def data(step: int):
    rng = np.random.default_rng(100 + step)
    return (rng.standard_normal((BATCH, SEQ, WIDTH)).astype(np.float32),
            rng.integers(0, CLASSES, (BATCH, SEQ)).astype(np.int32))


def train(optimizer, rows: slice, steps: int = 3) -> dict:
    enc, head = make_model()
    autograd.training = True
    for step in range(steps):
        x, y = (a[rows] for a in data(step))
        out = autograd.reshape(head(enc(tensor.from_numpy(x))), [-1, CLASSES])
        optimizer(autograd.softmax_cross_entropy(out, tensor.from_numpy(y.reshape(-1))))
    params = {f"enc.{k}": v for k, v in enc.get_params().items()}
    params.update({f"head.{k}": v for k, v in head.get_params().items()})
    return {k: tensor.to_numpy(v).copy() for k, v in params.items()}


def scenario_distopt(comm):
    per = BATCH // comm.world_size
    got = train(opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm),
                slice(comm.rank * per, (comm.rank + 1) * per))
    want = train(opt.SGD(lr=0.1, momentum=0.9), slice(0, BATCH))
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=2e-5, err_msg=k)
    start = tensor.to_numpy(make_model()[0].get_params()["linear1.W"])
    assert not np.allclose(got["enc.linear1.W"], start), "the parameters did not move"
    return "ok"
