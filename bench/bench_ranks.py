"""The world of a benchmark's rank processes (bench_straggler.py, bench_replica_check.py): shm through the
parent's holder, or tcp through the parent's store on loopback at `port`."""
from __future__ import annotations


def join(backend: str, holder, port: int, rank: int, world_size: int):
    """(communicator, store or None) of rank `rank`."""
    from singa_lite import dist

    if backend == "shm":
        return dist.init(backend="shm", holder=holder, rank=rank, world_size=world_size, timeout=120), None
    from singa_lite.comm.store import TcpStore
    from singa_lite.comm.tcp import TcpCommunicator

    store = TcpStore("127.0.0.1", port, world_size, is_server=False, timeout=60)
    return TcpCommunicator(store, rank, world_size, rank, world_size, timeout=120), store
