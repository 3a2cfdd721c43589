"""A model whose forward on one rank skips a layer at one step, so that rank's backward has no gradient for the
layer's parameters (tests/multiproc/test_mismatch_names.py, on the shm backend and under mpiexec)."""
from __future__ import annotations

import sys

import numpy as np

from singa_lite import autograd, layer, model, opt, parallel, tensor

STEPS = 3


class Net(model.Model):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = layer.Linear(16), layer.Linear(16), layer.Linear(16)
        self.out = layer.Linear(3)

    def forward(self, x, skip=False):
        h = autograd.relu(self.fc1(x))
        h = autograd.relu(self.fc2(h))
        if not skip:  # a data-dependent branch: the rank that takes it uses fc3, the other does not
            h = autograd.relu(self.fc3(h))
        return self.out(h)


def train_skipping(comm, skip_rank: int, skip_step: int, synced_first: bool, style: str = "distopt",
                   threshold: int = 2097152, buff: int = 4194304, exchange: str = "thread"):
    """Trains STEPS steps; rank `skip_rank` skips fc3 at step `skip_step` (1-based). synced_first: the
    models are compared and broadcast before the first step (as Model.compile does with a DistOpt), so even
    the first step's gradients go out in overlapped buckets. threshold: DistOpt's (small: several buckets, and
    the largest gradients alone, so one rank sends more collectives than the other). buff: DistOpt's buffSize
    (small: the buffer fills up during backward, which then waits for its buckets before it goes on).
    style: "distopt" (backward_and_update), "two_phase" (backward, then step) or "data_parallel" (the model in
    parallel.DataParallel, a plain SGD). exchange: DistOpt's (where the buckets' all-reduces run). Returns
    ("ok", None) or (error text, line of the call that raised)."""
    np.random.seed(0)
    x = tensor.from_numpy(np.random.randn(4, 8).astype(np.float32))
    y = tensor.from_numpy(np.array([0, 1, 2, 1], np.int32))
    net = Net()
    autograd.training = True
    net.forward(x)  # creates the parameters
    if style == "data_parallel":  # gradient hooks (parallel.DataParallel) and a plain optimizer
        parallel.DataParallel(net, communicator=comm, buffSize=buff, threshold=min(threshold, buff))
        sgd = opt.SGD(lr=0.05)
    else:
        dopt = opt.DistOpt(opt.SGD(lr=0.05), communicator=comm, buffSize=buff, exchange=exchange)
    if synced_first and style != "data_parallel":
        dopt.broadcast_parameters(list(net.get_params().values()))
    line = 0
    try:
        for step in range(1, STEPS + 1):
            out = net.forward(x, skip=comm.rank == skip_rank and step == skip_step)
            loss = autograd.softmax_cross_entropy(out, y)
            if style == "data_parallel":
                line = _line(); sgd(loss)  # noqa: E702
            elif style == "two_phase":
                dopt.backward(loss, threshold)
                line = _line(); dopt.step()  # noqa: E702 -- the line the error must name
            else:
                line = _line(); dopt.backward_and_update(loss, threshold)  # noqa: E702
    except (ValueError, RuntimeError) as e:
        return (f"{type(e).__name__}: {e}", line)
    return ("ok", None)


def _line() -> int:
    return sys._getframe(1).f_lineno
