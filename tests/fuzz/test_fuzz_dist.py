"""Fuzzing the communicator and DistOpt arguments on a one-rank shared-memory communicator: any tensor,
op name, root, buffer size, threshold, sparsity and flag either works or raises a documented Python
exception, and the communicator stays usable afterwards (argument errors never break it)."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from singa_lite import autograd, dist, opt, tensor

from test_fuzz_ops import DOCUMENTED, SPECIAL, call, odd_ints, tensors

ANYTHING = st.one_of(st.none(), st.booleans(), odd_ints, st.sampled_from(SPECIAL), st.text(max_size=5),
                     st.lists(odd_ints, max_size=2))


@pytest.fixture(scope="module")
def comm():
    c = dist.init(backend="shm", holder=dist.NcclIdHolder(), rank=0, world_size=1, timeout=30)
    yield c
    c.close()


def still_usable(comm):
    t = tensor.from_numpy(np.ones(3, np.float32))
    comm.all_reduce(t, "sum")
    assert np.array_equal(tensor.to_numpy(t), np.ones(3))


@given(t=tensors(), op=st.one_of(st.sampled_from(["sum", "avg", "max", "min", "prod"]), ANYTHING),
       root=st.one_of(odd_ints, ANYTHING), async_op=st.booleans())
def test_collective_arguments(comm, t, op, root, async_op):
    for fn, args in ((comm.all_reduce, (t, op)), (comm.broadcast, (t, root)), (comm.reduce, (t, root, op)),
                     (comm.all_gather, (t,)), (comm.reduce_scatter, (t, op)), (comm.gather, (t, root)),
                     (comm.scatter, (t, root))):
        work = call(fn, *args, async_op=async_op)
        if async_op and work is not None:
            call(work.wait)
    for bad in (None, 3, "x", np.ones(2)):
        call(comm.all_reduce, bad)
    still_usable(comm)


@given(buff=ANYTHING, threshold=ANYTHING, spars=ANYTHING, top_k=ANYTHING, clip=ANYTHING, first=ANYTHING,
       method=st.sampled_from(["backward_and_update", "backward_and_update_half", "backward_and_partial_update",
                               "backward_and_sparse_update"]))
def test_distopt_arguments_leave_parameters_as_they_were_when_refused(comm, buff, threshold, spars, top_k, clip,
                                                                      first, method):
    d = call(opt.DistOpt, opt.SGD(lr=0.1), communicator=comm, buffSize=buff, first_bucket=first)
    if d is None:
        return
    w = tensor.Tensor(data=np.ones((3, 2), np.float32), requires_grad=True, stores_grad=True, name="w")
    autograd.training = True
    loss = autograd.softmax_cross_entropy(autograd.matmul(tensor.from_numpy(np.ones((4, 3), np.float32)), w),
                                          tensor.from_numpy(np.array([0, 1, 0, 1], np.int32)))
    kw = {"threshold": threshold}
    if method == "backward_and_sparse_update":
        kw.update(spars=spars, topK=top_k)
    if method == "backward_and_update_half":
        kw.update(clipping=bool(clip), clip_Value=clip)
    before = tensor.to_numpy(w).copy()
    try:
        getattr(d, method)(loss, **kw)
    except DOCUMENTED:
        np.testing.assert_array_equal(tensor.to_numpy(w), before)  # a refused step changes nothing
    still_usable(comm)
