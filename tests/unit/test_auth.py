"""The job identity, the key and the handshake of singa_lite/comm/auth.py, both sides in this process over
socket pairs (the store and the mesh tests use them over TCP)."""
import os
import socket
import stat
import struct
import threading
import time

import pytest

from singa_lite.comm import auth
from singa_lite.comm.communicator import CommError


@pytest.fixture
def key_dir(tmp_path):
    d = tmp_path / "keys"
    return str(d)


def creds(key_dir, job="j", single_host=True, **extra):
    return auth.credentials({auth.KEY_DIR_VAR: key_dir, auth.JOB_ID_VAR: job, **extra}, single_host=single_host)


def handshake(server_creds, client_creds, purpose="store", admit=None, client_purpose=None, extra=None):
    """(server's Peer or None, client's Peer or the exception it raised)."""
    a, b = socket.socketpair()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("s", auth.serve(a, server_creds, purpose, admit=admit)))
    t.start()
    try:
        out["c"] = auth.client(b, client_creds, client_purpose or purpose, extra or {"rank": 1}, timeout=5)
    except CommError as e:
        out["c"] = e
    t.join(10)
    a.close()
    b.close()
    return out["s"], out["c"]


# ---------------------------------------------------------------- identity
@pytest.mark.parametrize("environ,expected", [
    ({}, ""),
    ({"SINGA_LITE_JOB_ID": "exp-7"}, "exp-7"),
    ({"TORCHELASTIC_RUN_ID": "abc"}, "abc"),
    ({"TORCHELASTIC_RUN_ID": "none"}, ""),  # torchrun's placeholder when no --rdzv-id is given
    ({"SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0"}, "1234.0"),
    ({"SLURM_JOB_ID": "1234"}, "1234"),
    ({"SINGA_LITE_JOB_ID": "mine", "TORCHELASTIC_RUN_ID": "abc", "SLURM_JOB_ID": "1"}, "mine"),
])
def test_job_id_comes_from_ours_then_the_launchers(environ, expected):
    assert auth.job_id(environ) == expected


@pytest.mark.parametrize("value", ["x" * 129, "two\nlines", "naïve"])
def test_a_job_id_that_cannot_travel_is_refused_naming_the_variable(value):
    with pytest.raises(ValueError, match="SINGA_LITE_JOB_ID must be at most 128 printable ASCII"):
        auth.job_id({"SINGA_LITE_JOB_ID": value})


# ---------------------------------------------------------------- keys
def test_the_host_key_is_made_once_private_and_shared_by_the_users_processes(key_dir):
    a, b = creds(key_dir), creds(key_dir)
    assert a.kind == "host" and a.key == b.key and a.key_id == b.key_id
    path = os.path.join(key_dir, "host.key")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(key_dir).st_mode) == 0o700
    assert creds(key_dir, job="other").key != a.key  # one key per job


def test_a_host_key_others_can_read_is_refused(key_dir):
    creds(key_dir)
    os.chmod(os.path.join(key_dir, "host.key"), 0o644)
    with pytest.raises(ValueError, match="not a file only you can read .*mode 0644.*remove it"):
        creds(key_dir)


def test_a_key_directory_others_can_write_is_not_used(tmp_path):
    d = tmp_path / "open"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    with pytest.raises(OSError, match="not a private directory"):
        auth.host_key_file({auth.KEY_DIR_VAR: str(d)})


def test_a_secret_must_be_long_enough_and_given_once(tmp_path):
    assert auth.credentials({auth.SECRET_VAR: "s" * 16}).kind == "secret"
    with pytest.raises(ValueError, match="a job secret must be 16 to 4096 characters, got 5.*token_hex"):
        auth.credentials({auth.SECRET_VAR: "short"})
    f = tmp_path / "secret"
    f.write_text("t" * 32 + "\n")
    os.chmod(f, 0o600)
    with pytest.raises(ValueError, match="both SINGA_LITE_JOB_SECRET and SINGA_LITE_JOB_SECRET_FILE"):
        auth.credentials({auth.SECRET_VAR: "s" * 16, auth.SECRET_FILE_VAR: str(f)})


def test_a_secret_file_must_be_private(tmp_path):
    f = tmp_path / "secret"
    f.write_text("t" * 32 + "\n")
    os.chmod(f, 0o600)
    c = auth.credentials({auth.SECRET_FILE_VAR: str(f)})
    assert c.kind == "secret" and c.key == auth.credentials({auth.SECRET_VAR: "t" * 32}).key
    os.chmod(f, 0o640)
    with pytest.raises(ValueError, match=r"mode 0640: a secret must be yours and readable by you alone \(chmod 600"):
        auth.credentials({auth.SECRET_FILE_VAR: str(f)})
    link = tmp_path / "link"
    os.chmod(f, 0o600)
    link.symlink_to(f)
    with pytest.raises(ValueError, match="cannot open it"):  # a planted link is not followed
        auth.credentials({auth.SECRET_FILE_VAR: str(link)})


def test_require_secret_takes_only_yes_or_no():
    with pytest.raises(ValueError, match="SINGA_LITE_REQUIRE_SECRET must be 1"):
        auth.credentials({auth.REQUIRE_VAR: "maybe"})


# ---------------------------------------------------------------- the handshake
def test_the_jobs_own_processes_prove_the_key_both_ways(key_dir):
    server, client = handshake(creds(key_dir), creds(key_dir))
    assert server.authenticated and client.authenticated
    assert server.hello["rank"] == 1 and client.hello["job"] == "j"


def test_another_users_process_on_one_host_is_refused(key_dir, tmp_path):
    stranger = creds(str(tmp_path / "strangers_keys"))
    server, client = handshake(creds(key_dir), stranger)
    assert server is None
    assert isinstance(client, auth.Refused)
    assert "does not hold this job's key, which this job requires (every rank runs on one host)" in str(client)


def test_a_rank_of_another_job_hears_which_job_uses_the_port(key_dir):
    server, client = handshake(creds(key_dir, job="A"), creds(key_dir, job="B"))
    assert server is None
    assert "another job (id 'A') uses this port; this is job 'B'" in str(client)


def test_a_wrong_secret_fails_the_proof_and_a_missing_one_is_named(key_dir):
    good = auth.credentials({auth.SECRET_VAR: "a" * 20, auth.JOB_ID_VAR: "j"})
    bad = auth.credentials({auth.SECRET_VAR: "b" * 20, auth.JOB_ID_VAR: "j"})
    server, client = handshake(good, bad)
    assert server is None and "did not prove it holds this job's key" in str(client)
    server, client = handshake(good, creds(key_dir))
    assert server is None and "this job has a secret and this process has none" in str(client)


def test_a_client_refuses_a_server_that_cannot_prove_the_key(key_dir):
    """A stranger squatting the port must not learn anything: the client checks the server's proof."""
    good = auth.credentials({auth.SECRET_VAR: "a" * 20, auth.JOB_ID_VAR: "j"})
    a, b = socket.socketpair()

    def impostor():  # speaks the protocol, claims the secret, has no key
        obj, _ = auth.recv_frame(a, time.monotonic() + 10)
        auth.send_frame(a, {"job": "j", "kind": "secret", "key_id": "", "nonce": "00" * 16, "purpose": "store"})
        auth.recv_frame(a, time.monotonic() + 10)
        auth.send_frame(a, {"proof": "00" * 32})
    t = threading.Thread(target=impostor)
    t.start()
    with pytest.raises(auth.Refused, match="did not prove it holds this job's key"):
        auth.client(b, good, "store", timeout=5)
    t.join(5)


def test_across_hosts_without_a_shared_key_it_runs_open_after_one_warning(key_dir, tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(auth, "_warned", False)
    here, there = creds(key_dir, single_host=False), creds(str(tmp_path / "other_host"), single_host=False)
    server, client = handshake(here, there)
    assert server is not None and not server.authenticated and not client.authenticated
    handshake(here, there)
    err = capfd.readouterr().err
    assert err.count("warning") == 1 and "SINGA_LITE_JOB_SECRET" in err and "SINGA_LITE_REQUIRE_SECRET=1" in err
    strict = creds(key_dir, single_host=False, SINGA_LITE_REQUIRE_SECRET="1")
    server, client = handshake(strict, there)
    assert server is None and "(SINGA_LITE_REQUIRE_SECRET is set)" in str(client)


def test_the_server_decides_the_claim_after_the_proof(key_dir):
    server, client = handshake(creds(key_dir), creds(key_dir), admit=lambda hello: "rank 1 is taken")
    assert server is None and "refused this process: rank 1 is taken" in str(client)
    seen = []
    server, client = handshake(creds(key_dir), creds(str(key_dir) + "2"), admit=seen.append)
    assert seen == []  # a stranger's claim is never even looked at


def test_a_purpose_mismatch_is_refused(key_dir):
    server, client = handshake(creds(key_dir), creds(key_dir), purpose="store", client_purpose="mesh")
    assert server is None and "this is a singa_lite store, not a mesh" in str(client)


@pytest.mark.parametrize("payload", [
    b"GET / HTTP/1.1\r\n\r\n",
    struct.pack("!4sBH", b"SLAU", 1, 65535),  # announces more than MAX_FRAME
    struct.pack("!4sBH", b"SLAU", 1, 5) + b"[1,2]",  # JSON, but not an object
    struct.pack("!4sBH", b"SLAU", 1, 20) + b'{"job": 5, "kind": 1}',
])
def test_the_server_drops_bad_frames_without_reading_more(payload, key_dir):
    a, b = socket.socketpair()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("s", auth.serve(a, creds(key_dir), "store", timeout=5)))
    t.start()
    b.sendall(payload)
    t.join(10)
    assert not t.is_alive() and out["s"] is None


def test_a_silent_peer_costs_the_server_at_most_the_handshake_time(key_dir):
    a, b = socket.socketpair()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("s", auth.serve(a, creds(key_dir), "store", timeout=0.5)))
    t.start()
    t.join(10)
    assert not t.is_alive() and out["s"] is None
    b.close()


def test_a_client_names_a_peer_that_is_no_singa_lite_endpoint(key_dir):
    a, b = socket.socketpair()
    a.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
    with pytest.raises(CommError, match="the peer is not a singa_lite endpoint of this version"):
        auth.client(b, creds(key_dir), "store", timeout=5, where="the peer")
    a.close()
    a, b = socket.socketpair()
    a.close()
    with pytest.raises(auth.Dropped, match="closed the connection without answering"):
        auth.client(b, creds(key_dir), "store", timeout=5)
