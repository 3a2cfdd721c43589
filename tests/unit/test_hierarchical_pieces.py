"""The pipeline of the hierarchical all-reduce (comm/hierarchical.py) in one process: the pieces' bookkeeping
over a world of one rank (every piece still goes through the cross-host communicator's asynchronous work), and
chunk_bytes checked. The sums across ranks: tests/multiproc/test_hierarchical.py and tests/multihost."""
import numpy as np
import pytest

from singa_lite import dist, tensor
from singa_lite.comm import hierarchical
from singa_lite.comm.mpi import MpiCommunicator
from singa_lite.comm.tcp import TcpCommunicator


@pytest.fixture
def world():
    comm = dist.init(backend="shm", timeout=30)
    yield comm
    comm.close()


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 1003])
def test_every_piece_comes_back_in_place(world, sharded, n):
    comm = hierarchical.HierarchicalCommunicator(world, world, world, hosts=1, sharded=sharded, chunk_bytes=64)
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    for op in ("sum", "avg"):
        t = tensor.from_numpy(x.copy())
        assert comm.all_reduce(t, op) is t
        np.testing.assert_array_equal(tensor.to_numpy(t), x)  # one rank: the sum and the mean are x itself
    assert len(comm._pieces(tensor.from_numpy(x).data)) == max(1, -(-n // 16))


def test_pieces_by_default_only_over_a_world_that_sleeps_while_it_waits(world):
    # tcp waits in poll() while the kernel moves the bytes; mpi polls its progress engine, and there the pipeline
    # measured slower (docs/benchmarks/communication.md, "Pipelined hierarchical all-reduce")
    assert TcpCommunicator.sleeps_while_waiting and not MpiCommunicator.sleeps_while_waiting
    assert not world.sleeps_while_waiting and hierarchical.default_chunk_bytes(world) == 0
    assert hierarchical.HierarchicalCommunicator(world, world, world, hosts=1).chunk_bytes == 0
    assert hierarchical.CHUNK_BYTES == 2 << 20


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1M"])
def test_chunk_bytes_must_be_a_count_of_bytes(world, bad):
    with pytest.raises(ValueError, match=r"chunk_bytes must be an int >= 0 \(bytes per pipelined piece; 0 for none\)"):
        hierarchical.create(world, chunk_bytes=bad)
    with pytest.raises(ValueError, match="chunk_bytes must be an int >= 0"):
        hierarchical.HierarchicalCommunicator(world, world, world, hosts=1, chunk_bytes=bad)
