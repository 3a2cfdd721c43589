"""The rendezvous store against strangers, other jobs and broken or hostile clients (issue: beyond one host,
only the job's own ranks get in). Server and clients are threads of this process; the other-uid and
multi-process cases are in tests/multiproc/test_trust.py."""
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import textwrap
import time

import pytest

from singa_lite.comm import auth
from singa_lite.comm import store as store_mod
from singa_lite.comm.communicator import CommError
from singa_lite.comm.store import TcpStore

HOST = "127.0.0.1"


@pytest.fixture
def keys(tmp_path, monkeypatch):
    """This user's host key in a private folder of the test (not the real home)."""
    monkeypatch.setenv(auth.KEY_DIR_VAR, str(tmp_path / "keys"))
    return str(tmp_path / "keys")


@pytest.fixture
def server(keys):
    s = TcpStore(HOST, 0, 3, is_server=True, timeout=10)
    yield s
    s.close()


def client(server, **kw):
    kw.setdefault("timeout", 10)
    return TcpStore(HOST, server.port, server.world_size, is_server=False, **kw)


def raw_client(server):
    """A socket past the handshake, speaking the store's frames directly."""
    sock = socket.create_connection((HOST, server.port), timeout=5)
    auth.client(sock, server.credentials, "store", {"store": store_mod.VERSION})
    sock.settimeout(5)
    return sock


def request(sock, code, fields):
    sock.sendall(store_mod.pack_message(code, fields))
    _, status, length = store_mod.read_message_header(sock)
    return status, store_mod.split_fields(store_mod.recv_exact(sock, length))


def hung_up(sock, within=5.0):
    sock.settimeout(within)
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


def test_it_listens_only_where_master_addr_points(keys):
    for host in ("127.0.0.1", "localhost"):
        s = TcpStore(host, 0, 1, is_server=True, timeout=5)
        assert s.listen_address.startswith("127.0.0.1:"), s.listen_address
        s.close()
    s = TcpStore(HOST, 0, 1, is_server=True, timeout=5, listen_host="")
    assert s.listen_address.startswith("0.0.0.0:")  # asked for: every interface
    s.close()


def test_a_stranger_reads_and_writes_nothing(server, tmp_path):
    server.set("shm_name", b"/singa_lite_secret_name")
    stranger = auth.credentials({auth.KEY_DIR_VAR: str(tmp_path / "stranger")}, single_host=True)
    with pytest.raises(CommError, match="does not hold this job's key, which this job requires"):
        TcpStore(HOST, server.port, 3, is_server=False, timeout=5, credentials=stranger)
    # the old protocol's first bytes (a set without any handshake) get the connection dropped, unanswered
    sock = socket.create_connection((HOST, server.port), timeout=5)
    sock.sendall(struct.pack("!4sBBHI", b"SLKV", 1, store_mod.OP_SET, 0, 12) + b"\0\0\0\x03key\0\0\0\x01v")
    assert hung_up(sock)
    assert server.get("shm_name") == b"/singa_lite_secret_name" and not server.delete_key("key")


def test_another_jobs_rank_is_told_and_the_job_goes_on(server, keys):
    other = auth.credentials({auth.KEY_DIR_VAR: keys, auth.JOB_ID_VAR: "job-B"}, single_host=True)
    with pytest.raises(CommError, match="another job \\(no id\\) uses this port; this is job 'job-B'"):
        TcpStore(HOST, server.port, 3, is_server=False, timeout=5, credentials=other)
    with client(server) as c:
        c.set("k", b"v")
        assert server.get("k") == b"v"


def test_a_rank_claimed_twice_is_refused_naming_both_processes(server):
    first = client(server, rank=1)
    fake = {"store": store_mod.VERSION, "world": 3, "rank": 1, "host": "elsewhere", "pid": 4242}
    sock = socket.create_connection((HOST, server.port), timeout=5)
    with pytest.raises(auth.Refused) as info:
        auth.client(sock, server.credentials, "store", fake)
    text = str(info.value)
    assert f"rank 1 is taken: pid {os.getpid()} on host {socket.gethostname()} joined as rank 1 first" in text
    assert "this process (pid 4242 on host elsewhere) says it is rank 1 too" in text
    first.close()
    again = client(server, rank=1)  # the same process may connect again (a second store client)
    again.close()


def test_a_rank_of_another_world_size_is_refused(server):
    with pytest.raises(CommError, match="this job has WORLD_SIZE=3 \\(rank 0's\\), the client was started with "
                                        "WORLD_SIZE=2"):
        TcpStore(HOST, server.port, 2, is_server=False, timeout=5)


def test_silent_connections_do_not_delay_the_ranks(server):
    silent = [socket.create_connection((HOST, server.port), timeout=5) for _ in range(20)]
    start = time.monotonic()
    with client(server) as c:
        c.set("k", b"v")
    assert time.monotonic() - start < auth.HANDSHAKE_S  # not after the silent ones timed out
    for s in silent:
        s.close()


def test_a_flood_of_connections_is_capped_and_the_ranks_still_get_in(server, monkeypatch):
    monkeypatch.setattr(store_mod, "MAX_HANDSHAKES", 4)
    small = TcpStore(HOST, 0, 2, is_server=True, timeout=10)
    try:
        silent = [socket.create_connection((HOST, small.port), timeout=5) for _ in range(4)]
        extra = socket.create_connection((HOST, small.port), timeout=5)
        assert hung_up(extra)  # over the cap: closed at once, nothing read
        for s in silent:
            s.close()
        with TcpStore(HOST, small.port, 2, is_server=False, timeout=10) as c:  # retries until a slot is free
            c.set("k", b"v")
    finally:
        small.close()


def test_announced_sizes_reserve_nothing(server):
    """A header announcing a 64 MiB message with no bytes behind it: the store must not allocate it (it did,
    for 8 connections +514 MiB)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    socks = [raw_client(server) for _ in range(8)]
    for s in socks:
        s.sendall(struct.pack("!4sBBHI", b"SLKV", store_mod.VERSION, store_mod.OP_SET, 0, store_mod.MAX_VALUE_BYTES))
    time.sleep(0.5)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 64, f"the store grew by {grown_mib:.0f} MiB for announced, unsent messages"
    for s in socks:
        s.close()
    server.set("still", b"serving")
    assert server.get("still") == b"serving"


def test_the_stores_data_has_a_quota(server, monkeypatch):
    monkeypatch.setattr(store_mod, "QUOTA_BYTES", 1 << 20)
    with client(server) as c:
        c.set("a", b"x" * (600 << 10))
        with pytest.raises(CommError, match="the store is full \\(quota 1048576 bytes"):
            c.set("b", b"x" * (600 << 10))
        c.set("a", b"x" * (900 << 10))  # replacing counts the difference
        assert c.delete_key("a")
        c.set("b", b"x" * (600 << 10))  # freed by the delete


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 1e300])
def test_every_timeout_read_from_the_wire_is_checked(server, bad):
    sock = raw_client(server)
    status, fields = request(sock, store_mod.OP_GET, [b"k", store_mod.DOUBLE.pack(bad)])
    assert status == store_mod.STATUS_ERROR and b"not a finite number of seconds" in b"".join(fields)
    status, fields = request(sock, store_mod.OP_WAIT, [store_mod.DOUBLE.pack(bad), b"k"])
    assert status == store_mod.STATUS_ERROR
    status, _ = request(sock, store_mod.OP_SET, [b"k", b"v"])  # the connection still serves
    assert status == store_mod.STATUS_OK
    sock.close()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e300, -1])
def test_a_bad_timeout_is_a_clear_error_on_the_client(server, bad):
    with pytest.raises(ValueError, match="timeout must be a finite number of seconds from 0 to 1e\\+07"):
        server.get("k", timeout=bad)
    with pytest.raises(ValueError, match="timeout must be a finite number of seconds"):
        TcpStore(HOST, server.port, 3, is_server=False, timeout=bad)


def test_add_never_overflows(server):
    with client(server) as c:
        c.add("n", 2 ** 63 - 2)
        with pytest.raises(CommError, match="add would overflow a 64-bit integer"):
            c.add("n", 5)
        assert c.add("n", 1) == 2 ** 63 - 1


EMFILE_JOB = textwrap.dedent("""
    import json, os, resource, socket, sys, time
    from singa_lite.comm.store import TcpStore
    server = TcpStore("127.0.0.1", 0, 2, is_server=True, timeout=20)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    hog = []
    try:
        while True:
            hog.append(open(os.devnull))
    except OSError:
        pass
    hog.pop().close()  # one for the connecting end: none is left for the server's accept(), which gets EMFILE
    pending = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    time.sleep(1.0)
    for f in hog[:16]:
        f.close()
    client = TcpStore("127.0.0.1", server.port, 2, is_server=False, timeout=20)
    client.set("k", b"v")
    print(json.dumps({"got": server.get("k").decode()}))
""")


def test_accept_survives_running_out_of_descriptors(keys):
    proc = subprocess.run([sys.executable, "-c", EMFILE_JOB], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {"got": "v"}
    assert proc.stderr.count("cannot accept a connection (Too many open files)") == 1, proc.stderr
