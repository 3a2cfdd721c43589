"""Process groups and capabilities (issue 30) within one process: new_group on a world of one rank (the
multi-rank behaviour is in tests/multiproc/test_groups.py), the checks of its ranks, the placeholder a
non-member gets, and the capability attributes code reads instead of comparing backend names."""
import numpy as np
import pytest

from singa_lite import dist, tensor
from singa_lite.comm import Communicator, communicator
from singa_lite.comm.hierarchical import HierarchicalCommunicator
from singa_lite.comm.mpi import MpiCommunicator
from singa_lite.comm.nccl import NcclCommunicator
from singa_lite.comm.shm import ShmCommunicator
from singa_lite.comm.tcp import TcpCommunicator


@pytest.fixture
def world():
    comm = dist.init(backend="shm", timeout=30)
    yield comm
    comm.close()


def test_capabilities_are_attributes_not_names():
    table = {cls: (cls.device_kind, cls.spans_hosts, cls.routes_across_hosts, cls.supports_groups, cls.keeps_store)
             for cls in (ShmCommunicator, MpiCommunicator, TcpCommunicator, NcclCommunicator,
                         HierarchicalCommunicator)}
    assert table == {
        ShmCommunicator: ("cpu", False, False, True, False),
        MpiCommunicator: ("cpu", True, False, True, False),
        TcpCommunicator: ("cpu", True, False, True, True),
        NcclCommunicator: ("cuda", True, True, True, False),
        HierarchicalCommunicator: ("cpu", True, True, True, False),
    }
    assert Communicator.supports_groups is False and Communicator.is_member is True
    assert dist.CollectiveMismatch is communicator.CollectiveMismatch
    assert issubclass(dist.CollectiveMismatch, ValueError)
    assert "CollectiveMismatch" in dist.__all__ and "new_group" in dist.__all__


def test_a_group_of_the_one_rank(world):
    g = dist.new_group([0], timeout=5)  # the latest init()'s communicator
    assert g.is_member and g is not world and g.ranks == [0] and world.ranks == [0]
    assert (g.backend, g.rank, g.world_size, g.timeout) == ("shm", 0, 1, 5)
    t = tensor.from_numpy(np.arange(4, dtype=np.float32))
    g.all_reduce(t, "avg")
    assert tensor.to_numpy(t).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert g.all_gather_object("x") == ["x"] and g.split(True).ranks == [0] and g.split(False) is None
    world.close()
    assert g.closed
    with pytest.raises(dist.CommError, match=r"used after close\(\) \(it is a group of the shm communicator of rank "
                                             r"0, which was closed\)"):
        g.barrier()


@pytest.mark.parametrize("ranks, needle", [
    ([], "at least one rank"), ([0, 0], "distinct, got 0 more than once in [0, 0]"),
    ([1], "must be in [0, 1) (this communicator has 1 ranks), got 1 in [1]"), ([-1], "got -1"),
    ([True], "must be ints, got True"), ([0.0], "must be ints, got 0.0 (float)"), ("0", "list of ranks"),
    (None, "list of ranks"), (3, "list of ranks")])
def test_bad_ranks_are_named(world, ranks, needle):
    with pytest.raises(ValueError, match="new_group") as e:
        world.new_group(ranks)
    assert needle in str(e.value)


def test_bad_timeout_and_no_communicator(world, monkeypatch):
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        world.new_group([0], timeout=0)
    with pytest.raises(TypeError, match="communicator must be a dist.Communicator"):
        dist.new_group([0], communicator="world")
    import singa_lite.comm as comm_layer
    monkeypatch.setattr(comm_layer, "_latest", None)
    with pytest.raises(ValueError, match=r"no communicator yet: call dist.init\(\) first"):
        dist.new_group([0])


def test_a_non_member_placeholder_refuses_every_use(world):
    g = communicator.NonMember(world, [3, 5])
    assert not g.is_member and g.ranks == [3, 5] and g.backend == "shm" and not g.closed
    assert repr(g) == "NonMember(backend='shm', rank=0, group=[3, 5])" and isinstance(g, Communicator)
    g.close()
    for use in (lambda: g.all_reduce(None), lambda: g.rank, lambda: g.world_size, lambda: g.timeout,
                lambda: g.new_group([0]), lambda: g.abort()):
        with pytest.raises(ValueError, match=r"rank 0 is not in the group \[3, 5\]; only its members may use it"):
            use()
