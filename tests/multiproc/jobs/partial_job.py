"""backward_and_partial_update's semantics on 2 ranks, run by tests/multiproc/test_partial_update.py under
``mpiexec -n 2``. Prints ``OK rank r`` when they held on that rank.

1. A model smaller than the threshold (SINGA's default 2097152 elements: its examples' cnn and mlp) is one
   partition: every call averages every parameter, so for SGD with momentum and weight decay (linear in the
   gradients) the ranks stay identical and the run equals the fused average of the gradients to rounding.
   This is why SINGA's examples print the same losses for partialUpdate as for plain.
2. Several partitions, numbered as SINGA does in backward order (a tensor larger than the threshold takes the
   next number at once, before the group of small ones under way is complete): one partition per call,
   round robin; the parameters of the others differ between the ranks."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers"))

import numpy as np  # noqa: E402

import distopt_cases as cases  # noqa: E402
from singa_lite import autograd, dist, opt, tensor  # noqa: E402


def same_on_ranks(comm, params) -> set:
    """Names of the parameters whose values are bit-identical on every rank."""
    return {k for k, p in params.items()
            if (lambda rows: (rows == rows[0]).all())(tensor.to_numpy(comm.all_gather(p)))}


def main() -> None:
    comm = dist.init(backend="mpi", timeout=60)
    assert comm.world_size == 2, comm
    shard = (comm.rank, comm.world_size)
    # 1. one partition: identical ranks after every step, and the fused average's result to rounding
    autograd.training = True
    params, fused = cases.make_params(0), cases.make_params(0)
    # as SINGA's examples: momentum and weight decay (each rank's momentum differs; their mean is plain's)
    dopt = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9, weight_decay=1e-3), communicator=comm)
    plain = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9, weight_decay=1e-3), communicator=comm)
    for step in range(6):
        x, y = cases.data(step)
        per = cases.N // comm.world_size
        x, y = x[comm.rank * per:(comm.rank + 1) * per], y[comm.rank * per:(comm.rank + 1) * per]
        dopt.backward_and_partial_update(cases.loss_of(params, x, y))
        plain.backward_and_update(cases.loss_of(fused, x, y))
        assert same_on_ranks(comm, params) == set(params), (step, same_on_ranks(comm, params))
        assert dopt.partial == 0, dopt.partial
    for k in params:
        np.testing.assert_allclose(tensor.to_numpy(params[k]), tensor.to_numpy(fused[k]), rtol=1e-5, atol=1e-6,
                                   err_msg=k)
    # 2. threshold 200 over the backward order b2 (5), W2 (200), b1 (40), W1 (280): [b2, W2] passes 200 and
    # is partition 1; W1 is larger than 200, so partition 2; [b1], left at the end, partition 3
    params = cases.make_params(0)
    dopt = opt.DistOpt(cases.make_opt("sgd"), communicator=comm)
    expected = [{"b2", "W2"}, {"W1"}, {"b1"}, {"b2", "W2"}, {"W1"}]
    for step, averaged in enumerate(expected):
        cases.train(params, dopt, 1, shard=shard, method="backward_and_partial_update", threshold=200)
        assert same_on_ranks(comm, params) == averaged, (step, same_on_ranks(comm, params), averaged)
        assert dopt.partial == (step + 1) % 3, dopt.partial
    print(f"OK rank {comm.rank}", flush=True)


if __name__ == "__main__":
    main()
