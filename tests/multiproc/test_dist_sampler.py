"""DistributedSampler in separate processes (spawned: each with its own interpreter state and hash seed)
deals the same shares as computed in one process: disjoint, equal, covering, and new every epoch -- with
no communication between the ranks."""
import numpy as np
import pytest

from shm_harness import ok_values, run_ranks
from singa_lite.data import DistributedSampler

EPOCHS = 3


def deal(rank, P, _name, n, drop_last):
    sampler = DistributedSampler(n, rank, P, seed=11, drop_last=drop_last)
    out = []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


@pytest.mark.parametrize("P,n,drop_last", [(3, 100, True), (4, 50, False)])
def test_ranks_in_separate_processes_agree(P, n, drop_last):
    shares = ok_values(run_ranks(deal, P, n, drop_last))
    orders = set()
    for epoch in range(EPOCHS):
        per_rank = [shares[r][epoch] for r in range(P)]
        assert len({len(s) for s in per_rank}) == 1
        everything = np.concatenate(per_rank)
        if drop_last:
            assert len(set(everything.tolist())) == len(everything) == P * (n // P)
        else:
            assert set(everything.tolist()) == set(range(n))
        assert per_rank == [deal(r, P, None, n, drop_last)[epoch] for r in range(P)]  # same as in this process
        orders.add(tuple(everything.tolist()))
    assert len(orders) == EPOCHS
