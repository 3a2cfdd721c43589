"""The TCP rendezvous store (singa_lite/comm/store.py) on loopback, server and clients as threads of this
process (each client has its own connection, as separate processes would)."""
import socket
import struct
import threading
import time

import pytest

from singa_lite.comm import auth, env
from singa_lite.comm import store as store_mod
from singa_lite.comm.communicator import CommError
from singa_lite.comm.store import TcpStore, barrier

HOST = "127.0.0.1"


@pytest.fixture
def server():
    s = TcpStore(HOST, 0, 3, is_server=True, timeout=10)
    yield s
    s.close()


def client(server, timeout=10):
    return TcpStore(HOST, server.port, server.world_size, is_server=False, timeout=timeout)


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def hung_up(sock):
    """Whether the peer closed the connection (EOF, or a reset when it left our bytes unread)."""
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


def test_set_get_add_wait_across_clients(server):
    assert server.port > 0
    with client(server) as a, client(server) as b:
        a.set("addr/1", b"10.0.0.2:4000")
        assert b.get("addr/1") == b"10.0.0.2:4000"
        assert server.get("addr/1") == b"10.0.0.2:4000"
        a.set("addr/1", b"")  # overwrite, empty values are values
        assert b.get("addr/1") == b""
        assert a.add("count", 2) == 2 and b.add("count", 5) == 7 and server.add("count", -1) == 6
        assert a.get("count") == b"6"
        big = bytes(range(256)) * 4096  # 1 MiB: several TCP segments
        b.set("blob", big)
        assert a.get("blob") == big
        assert a.delete_key("blob") and not a.delete_key("blob")


def test_get_blocks_until_another_client_sets(server):
    with client(server) as a, client(server) as b:
        threading.Timer(0.3, lambda: b.set("late", b"x")).start()
        start = time.monotonic()
        assert a.get("late", timeout=5) == b"x"
        assert 0.2 < time.monotonic() - start < 4
        threading.Timer(0.3, lambda: b.set("w2", b"y")).start()
        a.set("w1", b"y")
        a.wait(["w1", "w2"], timeout=5)


def test_add_is_atomic_under_concurrency(server):
    clients = [client(server) for _ in range(4)]
    threads = [threading.Thread(target=lambda c=c: [c.add("n", 1) for _ in range(50)]) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert server.get("n") == b"200"
    for c in clients:
        c.close()


def test_get_timeout_names_the_key_and_the_rank(server):
    start = time.monotonic()
    with pytest.raises(CommError, match=r"key 'rank_addr/2' was not set within 0.3 s; rank 2 never arrived"):
        server.get("rank_addr/2", timeout=0.3)
    assert time.monotonic() - start < 3
    with pytest.raises(CommError, match=r"key 'plain' was not set within 0.2 s$"):
        server.get("plain", timeout=0.2)
    with pytest.raises(CommError, match=r"1 of 2 keys not set.*'x/1'.*rank 1 never arrived"):
        server.set("x/0", b"1")
        server.wait(["x/0", "x/1"], timeout=0.2)
    server.set("still", b"ok")  # the connection is still in step after timeouts
    assert server.get("still") == b"ok"


def test_barrier_names_the_missing_ranks(server):
    with client(server) as a:
        with pytest.raises(CommError, match=r"barrier 'b1' \(rank 0 of 3\): ranks 1, 2 never arrived within 0.3 s"):
            barrier(server, "b1", 0, 3, timeout=0.3)
        errors = []
        other = threading.Thread(target=lambda: errors.append(pytest.raises(CommError, barrier, a, "b2", 1, 3, 0.5)))
        other.start()
        with pytest.raises(CommError, match=r"rank 2 never arrived"):
            server.barrier("b2", 0, timeout=0.5)
        other.join(timeout=10)
        assert "rank 2 never arrived" in str(errors[0].value)
        with client(server) as c:
            done = []
            threads = [threading.Thread(target=lambda s=s, r=r: (s.barrier("b3", r, 5), done.append(r)))
                       for r, s in ((1, a), (2, c))]
            for t in threads:
                t.start()
            server.barrier("b3", 0, timeout=5)
            for t in threads:
                t.join(timeout=10)
            assert sorted(done) == [1, 2]


def test_nothing_listening_is_a_clear_error_after_the_timeout():
    port = free_port()
    start = time.monotonic()
    with pytest.raises(CommError) as e:
        TcpStore(HOST, port, 2, is_server=False, timeout=0.8)
    elapsed = time.monotonic() - start
    assert 0.5 < elapsed < 4, elapsed
    msg = str(e.value)
    assert f"{HOST}:{port}" in msg and "rank 0 started" in msg and "MASTER_PORT" in msg and "firewall" in msg


def test_client_waits_for_a_server_that_starts_later():
    port = free_port()
    holder = {}
    threading.Timer(0.5, lambda: holder.setdefault("s", TcpStore(HOST, port, 2, True, timeout=5))).start()
    c = TcpStore(HOST, port, 2, is_server=False, timeout=10)
    c.set("k", b"v")
    assert c.get("k") == b"v"
    c.close()
    holder["s"].close()


@pytest.mark.parametrize("behaviour", ["silent", "closes", "garbage"])
def test_a_peer_that_is_not_a_store_is_rejected_fast(behaviour):
    listener = socket.socket()
    listener.bind((HOST, 0))
    listener.listen(4)
    conns = []

    def serve():
        conn, _ = listener.accept()
        conns.append(conn)
        if behaviour == "closes":
            conn.close()
        elif behaviour == "garbage":
            conn.recv(100)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    start = time.monotonic()
    with pytest.raises(CommError, match=r"is not a singa_lite rendezvous store.*MASTER_PORT"):
        TcpStore(HOST, listener.getsockname()[1], 2, is_server=False, timeout=1.5)
    assert time.monotonic() - start < 5
    listener.close()
    for c in conns:
        c.close()


def test_server_drops_a_stray_client_and_survives_disconnects(server):
    # a client that is not a store's: its bytes are not a HELLO, so the server hangs up on it
    stray = socket.create_connection((HOST, server.port), timeout=5)
    stray.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert hung_up(stray)  # closed without an answer
    stray.close()
    # a client of the job (it passed the handshake), but an oversized message: dropped too
    rogue = socket.create_connection((HOST, server.port), timeout=5)
    auth.client(rogue, server.credentials, "store", {"store": store_mod.VERSION})
    rogue.settimeout(5)
    too_big = store_mod.MAX_PAYLOAD_BYTES + 1
    rogue.sendall(struct.pack("!4sBBHI", b"SLKV", store_mod.VERSION, store_mod.OP_SET, 0, too_big))
    assert hung_up(rogue)
    rogue.close()
    # a real client that goes away in the middle of a blocking get
    a = client(server)
    threading.Thread(target=lambda: pytest.raises(CommError, a.get, "never", 5), daemon=True).start()
    time.sleep(0.2)
    a._sock.shutdown(socket.SHUT_RDWR)
    # the server still serves new clients and the old data
    server.set("k", b"v")
    with client(server) as b:
        assert b.get("k") == b"v"
        b.set("k2", b"w")
    assert server.get("k2") == b"w"


def test_a_server_that_dies_is_named_by_the_clients():
    s = TcpStore(HOST, 0, 2, is_server=True, timeout=5)
    c = client(s)
    s.close()
    start = time.monotonic()
    with pytest.raises(CommError, match=r"rank 0, which serves the store"):
        c.get("k", timeout=3)
    assert time.monotonic() - start < 2
    with pytest.raises(CommError, match="closed"):
        c.set("k", b"v")


def test_bad_arguments():
    with pytest.raises(ValueError, match="port must be an int"):
        TcpStore(HOST, 70000, 2, False)
    with pytest.raises(ValueError, match="port 0"):
        TcpStore(HOST, 0, 2, False)
    with pytest.raises(ValueError, match="world_size"):
        TcpStore(HOST, 1234, 0, False)
    s = TcpStore(HOST, 0, 1, True, timeout=5)
    with pytest.raises(TypeError, match="bytes"):
        s.set("k", "text")
    with pytest.raises(TypeError, match="key must be a str"):
        s.get(b"k")
    with pytest.raises(ValueError, match="key must be 1 to"):
        s.set("", b"")
    s.close()


def test_port_in_use_is_a_clear_error(server):
    with pytest.raises(CommError, match=rf"cannot listen on port {server.port}.*MASTER_PORT"):
        TcpStore(HOST, server.port, 2, is_server=True, timeout=1)


def test_a_forked_child_closing_its_copy_leaves_the_parents_store_serving(server):
    import os

    with client(server) as a:
        a.set("before", b"1")
        pid = os.fork()
        if pid == 0:  # the child: its copies of the server and the client go, nothing else
            try:
                server.close()
                a.close()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert a.get("before") == b"1"
        with client(server) as b:
            b.set("after", b"2")
        assert a.get("after") == b"2"


def test_rank_0_keeps_serving_the_rendezvous_store_through_its_communicator(monkeypatch):
    # The environment rendezvous of a one-rank job on loopback: the shm communicator it gives holds rank 0's
    # store (Communicator.rendezvous_store), so that the store serves as long as the job runs.
    monkeypatch.setenv("SINGA_LITE_JOB_SECRET", "a-long-enough-secret")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launch = env.read({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    comm = env.rendezvous(launch, timeout=30)
    try:
        assert comm.backend == "shm" and not comm.keeps_store
        store = comm.rendezvous_store
        assert isinstance(store, TcpStore) and store.is_server and store.port == port
        assert store.client_address[0] == "127.0.0.1"  # its own connection, on loopback
        assert store.get("table")  # still serving
    finally:
        comm.close()
        comm.rendezvous_store.close()


def test_delete_prefix_and_keys(server):
    with client(server) as a:
        for k in ("elastic/r0/n", "elastic/r0/comm/host/0", "elastic/r1/n", "elastic/beat/x"):
            a.set(k, b"1")
        assert a.keys("elastic/r") == (3, ["elastic/r0/comm/host/0", "elastic/r0/n", "elastic/r1/n"])
        assert a.delete_prefix("elastic/r0/") == 2 and a.delete_prefix("elastic/r0/") == 0
        assert server.keys("elastic/") == (2, ["elastic/beat/x", "elastic/r1/n"])
        with pytest.raises(ValueError, match="key must be 1 to"):
            a.delete_prefix("")  # not everything at once by mistake
