"""dist.elastic over NCCL on one GPU (issue 31, point 2's NCCL code path): a one-rank job whose train function
fails once. run aborts the NCCL communicator, makes a new one through the job's store (a new unique id), rebinds
DistOpt to it and goes on from the last in-memory commit. A rank dying for real needs two GPUs (NCCL puts one rank
on each); tests/multiproc/test_elastic_inprocess.py does that on shm and tcp. Marked `gpu`."""
import numpy as np
import pytest

from singa_lite import _core, dist, opt, tensor
from singa_lite.comm.communicator import CommError
from singa_lite.data import ElasticSampler
from test_elastic_run import Net, data, one_rank  # noqa: F401  (one_rank: the fixture of a one-rank env job)

pytestmark = pytest.mark.gpu


def test_a_failure_regroups_over_nccl_and_goes_on_from_the_last_commit(one_rank):  # noqa: F811
    from singa_lite.comm import nccl

    problem = nccl.readiness()
    if problem:
        pytest.skip(problem)
    comm = dist.elastic.init(timeout=120, backend="nccl")
    assert comm.backend == "nccl" and (comm.rank, comm.world_size) == (0, 1)
    dev = comm.device
    x, y = data()
    net = Net()
    sgd = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9), communicator=comm)
    net.set_optimizer(sgd)
    net.compile([tensor.from_numpy(x[:2], dev)], is_train=True)
    state = dist.elastic.State(model=net, optimizer=sgd, sampler=ElasticSampler(len(x), 0, 1, batch_size=4, seed=1),
                               every=3)
    calls, at_commit = [], {}

    @dist.elastic.run
    def train(state):
        calls.append(state.steps)
        if len(calls) == 2:  # restored from the commit at step 6, on the GPU
            for k, v in net.get_states().items():
                np.testing.assert_array_equal(tensor.to_numpy(v), at_commit[k])
        for epoch in range(state.epoch, 2):
            state.sampler.set_epoch(epoch)
            for idx in state.sampler:
                net.train_one_batch(tensor.from_numpy(x[idx], dev), tensor.from_numpy(y[idx], dev))
                if state.step() and state.steps == 6 and not at_commit:
                    at_commit.update({k: tensor.to_numpy(v).copy() for k, v in net.get_states().items()})
                if state.steps == 8 and len(calls) == 1:
                    raise CommError("rank 1 (pid 1) died (a simulated failure)")
            state.commit()
        return state.steps

    assert train(state) == 20
    assert calls == [0, 6]
    new = dist.elastic.current().communicator
    assert new is not comm and comm.closed and new.backend == "nccl" and sgd.communicator is new
    t = _core.Tensor.from_buffer(np.arange(4, dtype=np.float32)).to(dev.core)
    new.all_reduce(t, "sum")  # the new communicator works
    np.testing.assert_array_equal(np.asarray(t.to(_core.Device("cpu"))), np.arange(4))
