"""Optional TLS for the rendezvous store and the tcp mesh (singa_lite/comm/tls.py): encrypted connections, the
job handshake bound to the TLS channel (a relay that terminates TLS on both sides cannot pass it on), clear
errors for missing or unusable files and for ranks that disagree about TLS."""
import os
import select
import shutil
import socket
import ssl
import subprocess
import threading

import numpy as np
import pytest

from singa_lite import tensor
from singa_lite.comm import auth, tls
from singa_lite.comm.communicator import CommError
from singa_lite.comm.store import TcpStore
from singa_lite.comm.tcp import TcpCommunicator

HOST = "127.0.0.1"
pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a "
                                                                       "test certificate")


def make_cert(folder, name="tls"):
    key, cert = os.path.join(folder, f"{name}.key"), os.path.join(folder, f"{name}.crt")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "2", "-subj", f"/CN={name}", "-keyout", key, "-out", cert], check=True,
                   capture_output=True)
    os.chmod(key, 0o600)
    return cert, key


@pytest.fixture
def pem(tmp_path):
    return make_cert(str(tmp_path))


def creds(tmp_path, pem, on=True, **extra):
    cert, key = pem
    environ = {auth.KEY_DIR_VAR: str(tmp_path / "keys"), auth.JOB_ID_VAR: "tls-job", **extra}
    if on:
        environ.update({tls.TLS_VAR: "1", tls.CERT_VAR: cert, tls.KEY_VAR: key})
    return auth.credentials(environ, single_host=True)


def test_the_store_speaks_tls_and_a_plain_rank_is_refused_clearly(tmp_path, pem):
    c = creds(tmp_path, pem)
    server = TcpStore(HOST, 0, 2, is_server=True, timeout=10, credentials=c)
    try:
        assert isinstance(server._sock, ssl.SSLSocket)
        with TcpStore(HOST, server.port, 2, is_server=False, timeout=10, credentials=c) as client:
            client.set("k", b"v" * 100000)
            assert server.get("k") == b"v" * 100000
        plain = creds(tmp_path, pem, on=False)
        with pytest.raises(CommError, match="refused this process: this job encrypts its connections "
                                            "\\(SINGA_LITE_TLS=1\\)"):
            TcpStore(HOST, server.port, 2, is_server=False, timeout=3, credentials=plain)
    finally:
        server.close()
    plain_server = TcpStore(HOST, 0, 2, is_server=True, timeout=10, credentials=creds(tmp_path, pem, on=False))
    try:
        with pytest.raises(CommError, match="the TLS handshake failed .*do all ranks set SINGA_LITE_TLS=1"):
            TcpStore(HOST, plain_server.port, 2, is_server=False, timeout=3, credentials=c)
    finally:
        plain_server.close()


def test_a_ca_checks_the_peers_certificate(tmp_path, pem):
    other_cert, _ = make_cert(str(tmp_path), "other")
    server = TcpStore(HOST, 0, 2, is_server=True, timeout=10, credentials=creds(tmp_path, pem))
    try:
        good = creds(tmp_path, pem, SINGA_LITE_TLS_CA=pem[0])
        TcpStore(HOST, server.port, 2, is_server=False, timeout=5, credentials=good).close()
        wrong = creds(tmp_path, pem, SINGA_LITE_TLS_CA=other_cert)
        with pytest.raises(CommError, match="its TLS certificate does not chain to SINGA_LITE_TLS_CA"):
            TcpStore(HOST, server.port, 2, is_server=False, timeout=5, credentials=wrong)
    finally:
        server.close()


def test_a_relay_that_terminates_tls_on_both_sides_cannot_pass_the_handshake_on(tmp_path, pem):
    """The proofs cover the channel binding: the relay has two channels, so the proofs it passes on fail."""
    c = creds(tmp_path, pem)
    server = TcpStore(HOST, 0, 2, is_server=True, timeout=10, credentials=c)
    relay = socket.create_server((HOST, 0))
    port = relay.getsockname()[1]

    def run_relay():
        inside, _ = relay.accept()
        inside = c.tls.accept(inside, 5)
        outside = c.tls.connect(socket.create_connection((HOST, server.port)), 5, "store")
        # One thread for both directions: an SSL socket read in one thread while written in another loses data
        # now and then (OpenSSL's connection state is not shared safely), which made this test flaky (3 in 15).
        other = {inside: outside, outside: inside}
        try:
            while True:
                ready = [s for s in other if s.pending()] or select.select(list(other), [], [], 10)[0]
                if not ready:
                    break
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    other[s].sendall(data)
        except OSError:
            pass
        finally:
            for s in other:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
    t = threading.Thread(target=run_relay, daemon=True)
    t.start()
    try:
        with pytest.raises(CommError, match="did not prove it holds this job's key"):
            TcpStore(HOST, port, 2, is_server=False, timeout=5, credentials=c)
    finally:
        relay.close()
        server.close()


@pytest.mark.parametrize("size", [1000, 300000])  # inside the header exchange, and the ring
def test_the_mesh_all_reduces_over_tls(tmp_path, pem, size):
    c = creds(tmp_path, pem)
    server = TcpStore(HOST, 0, 2, is_server=True, timeout=30, credentials=c)
    client = TcpStore(HOST, server.port, 2, is_server=False, timeout=30, credentials=c)
    made = {}

    def rank(r, store):
        made[r] = TcpCommunicator(store, r, 2, timeout=20, single_host=True)
    threads = [threading.Thread(target=rank, args=(r, s)) for r, s in ((0, server), (1, client))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert all(isinstance(p.sock, ssl.SSLSocket) for r in (0, 1) for p in made[r]._peers.values())
        data = [np.arange(size, dtype=np.float32) * (r + 1) for r in (0, 1)]
        ts = [tensor.from_numpy(d) for d in data]
        for _ in range(3):
            works = [made[r].all_reduce(ts[r], async_op=True) for r in (0, 1)]
            for w in works:
                w.wait()
        for t in ts:
            np.testing.assert_array_equal(tensor.to_numpy(t), np.arange(size, dtype=np.float32) * 3 * 2 ** 2)
    finally:
        for comm in made.values():
            comm.close()
        client.close()
        server.close()


def test_bad_settings_are_named(tmp_path, pem):
    cert, key = pem
    with pytest.raises(ValueError, match="SINGA_LITE_TLS=1 needs SINGA_LITE_TLS_CERT and SINGA_LITE_TLS_KEY.*openssl"):
        tls.settings({tls.TLS_VAR: "1"})
    with pytest.raises(ValueError, match="SINGA_LITE_TLS must be 1"):
        tls.settings({tls.TLS_VAR: "maybe"})
    os.chmod(key, 0o644)
    with pytest.raises(ValueError, match="has mode 0644: a private key must be readable by its owner alone"):
        tls.settings({tls.TLS_VAR: "1", tls.CERT_VAR: cert, tls.KEY_VAR: key})
    os.chmod(key, 0o600)
    with pytest.raises(ValueError, match="cannot load the certificate and key"):
        tls.settings({tls.TLS_VAR: "1", tls.CERT_VAR: key, tls.KEY_VAR: key})
    assert tls.settings({}) is None and tls.settings({tls.TLS_VAR: "0"}) is None

