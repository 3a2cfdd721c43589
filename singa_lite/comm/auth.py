"""Who may join a job: its identity, its key, and the handshake that begins every TCP connection of the job
(the rendezvous store's and the tcp mesh's).

The job identity
----------------
``SINGA_LITE_JOB_ID`` when set (singa-run sets its own), else the launcher's: ``TORCHELASTIC_RUN_ID`` (torchrun;
its placeholder ``none`` does not count), ``SLURM_JOB_ID`` with ``SLURM_STEP_ID`` (``1234.0``). Ranks of two
jobs whose ids differ never talk: a rank that reaches another job's store hears "another job (id X) uses this
port" and neither job is touched. A job with no id still works; it just cannot be told apart from another
id-less job of the same user.

The key
-------
1. ``SINGA_LITE_JOB_SECRET`` (at least 16 characters), or ``SINGA_LITE_JOB_SECRET_FILE`` naming a file only
   its owner can read (mode 0600 or stricter). singa-run makes a fresh random one per job and hands it to its
   ranks through their environment (to a hostfile's hosts through the remote shell's stdin): never on a command
   line, never on the wire.
2. Else a key derived from this user's host key (``host.key``, 32 random bytes, mode 0600, in
   ``SINGA_LITE_KEY_DIR``, else ``$XDG_CONFIG_HOME/singa_lite``, else ``~/.config/singa_lite``, else
   ``/tmp/singa_lite-<uid>``) and the job id. Only this user can read it, so on one host other users are
   refused; hosts that share the home directory share the key, so such a job is authenticated across them too.
3. Else none (no key file can be written): the job runs unauthenticated where that is allowed.

Who is let in
-------------
Both sides of a connection prove they hold the key (see :func:`client` / :func:`serve`): the key never
crosses the wire. A job whose ranks all run on one host (MASTER_ADDR is a loopback address, or the launcher
says one node) requires it: a stranger, another user's process included, is refused. A job across hosts with
no shared key (no secret, and host keys that differ) still works, unauthenticated, after one warning per
process naming the risk and the variable; ``SINGA_LITE_REQUIRE_SECRET=1`` makes that an error instead.

The handshake (every message a small frame: magic ``SLAU``, version, length <= MAX_FRAME, a JSON object)::

    client -> server   hello: job id, key kind and key id, a fresh nonce, what it connects for, its claim
    server -> client   hello: the same of the server's, or why it refuses
    client -> server   HMAC(key, "client" | transcript)      (empty when unauthenticated)
    server -> client   HMAC(key, "server" | transcript), and the verdict on the claim

The transcript is a digest of both hellos, nonces included, so no proof can be replayed or reflected (and, with
TLS, of the channel's binding, so no proof can be relayed: tls.py). Before
the client's proof is checked a connection costs the server at most a few KiB and ``HANDSHAKE_S`` seconds.
What the key does not protect: without TLS (``SINGA_LITE_TLS=1``, tls.py) the bytes after the handshake travel in
clear (an attacker who can read or rewrite the link can read or rewrite gradients); root on a rank's host can
read the key. See
docs/reliability.md, "Threat model".
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import stat
import struct
import sys
import tempfile
import time
from dataclasses import dataclass

from .communicator import CommError
from .tls import binding as tls_binding
from .tls import settings as tls_settings

JOB_ID_VAR = "SINGA_LITE_JOB_ID"
SECRET_VAR = "SINGA_LITE_JOB_SECRET"
SECRET_FILE_VAR = "SINGA_LITE_JOB_SECRET_FILE"
REQUIRE_VAR = "SINGA_LITE_REQUIRE_SECRET"
KEY_DIR_VAR = "SINGA_LITE_KEY_DIR"

MAX_JOB_ID = 128
MIN_SECRET = 16
MAX_SECRET = 4096
MAGIC = b"SLAU"
VERSION = 1
_FRAME = struct.Struct("!4sBH")  # magic, version, payload length
MAX_FRAME = 4096  # bytes of JSON in one handshake message
HANDSHAKE_S = 5.0  # at most this long for a whole handshake
_NONCE = 16
_HOST_KEY = "host.key"

_warned = False  # the unauthenticated-job warning: once per process


class Refused(CommError):
    """The other side of a connection is not a rank of this job (or this process is not one of that job's)."""


class Dropped(CommError):
    """The other side closed the connection before answering at all (flooded, starting, or not ours)."""


# ---------------------------------------------------------------- identity
def job_id(environ=None) -> str:
    """This job's identity: SINGA_LITE_JOB_ID, else the launcher's (torchrun's run id, Slurm's job and step),
    else '' (see the module docstring). ValueError naming the variable for an unusable value."""
    environ = os.environ if environ is None else environ
    for name in (JOB_ID_VAR, "TORCHELASTIC_RUN_ID"):
        raw = environ.get(name, "").strip()
        if raw and not (name == "TORCHELASTIC_RUN_ID" and raw == "none"):
            return _checked_id(raw, name)
    raw = environ.get("SLURM_JOB_ID", "").strip()
    if raw:
        step = (environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID") or "").strip()
        return _checked_id(f"{raw}.{step}" if step else raw, "SLURM_JOB_ID")
    return ""


def _checked_id(value: str, name: str) -> str:
    if len(value) > MAX_JOB_ID or not value.isprintable() or not value.isascii():
        raise ValueError(f"{name} must be at most {MAX_JOB_ID} printable ASCII characters (a job's name or number), "
                         f"got {value[:40]!r}{'...' if len(value) > 40 else ''} ({len(value)} characters)")
    return value


def new_job_id(prefix: str = "singa-run") -> str:
    """A fresh job id for a launcher that makes its own (singa-run)."""
    return f"{prefix}-{secrets.token_hex(6)}"


def new_secret() -> str:
    """A fresh random job secret (64 hex digits)."""
    return secrets.token_hex(32)


# ---------------------------------------------------------------- the key
@dataclass(frozen=True)
class Credentials:
    """What this process shows and checks in a handshake."""

    job_id: str
    key: bytes | None  # None: unauthenticated
    kind: str  # "secret" (given to the job), "host" (derived from this user's host key) or "none"
    key_id: str  # for kind "host": which host key (a digest; the same on hosts that share the key file)
    source: str  # where the key came from, for messages
    required: bool  # an unauthenticated peer is refused (one host, or SINGA_LITE_REQUIRE_SECRET)
    required_because: str = ""  # why, in words
    tls: object = None  # tls.Tls when SINGA_LITE_TLS=1: every connection is encrypted, the handshake bound to it

    def describe(self) -> str:
        job = f"job {self.job_id!r}" if self.job_id else "a job with no id"
        return f"{job}, key from {self.source}"


def credentials(environ=None, single_host: bool = False) -> Credentials:
    """This rank's credentials from its environment (see the module docstring). single_host: every rank of the
    job runs on this host, so a peer without the key is always refused."""
    environ = os.environ if environ is None else environ
    jid = job_id(environ)
    encrypted = tls_settings(environ)
    strict = _truthy(environ.get(REQUIRE_VAR, ""), REQUIRE_VAR)
    required = single_host or strict
    because = f"{REQUIRE_VAR} is set" if strict else "every rank runs on one host" if single_host else ""
    secret = given_secret(environ)
    if secret is not None:
        key = hmac.new(b"singa_lite job secret", secret, hashlib.sha256).digest()
        source = SECRET_VAR if environ.get(SECRET_VAR) else f"{SECRET_FILE_VAR} ({environ[SECRET_FILE_VAR]})"
        return Credentials(jid, key, "secret", "", source, required, because, encrypted)
    try:
        host_key, path = host_key_file(environ)
    except OSError as e:
        if required:
            raise CommError(f"this job needs a key (it runs on one host, or {REQUIRE_VAR} is set) but none was "
                            f"given and no host key can be kept ({e}); set {SECRET_VAR} to the same random value "
                            f"on every rank (python -c 'import secrets; print(secrets.token_hex(32))'), or "
                            f"{KEY_DIR_VAR} to a private directory") from None
        return Credentials(jid, None, "none", "", f"nowhere ({e})", required, because, encrypted)
    key = hmac.new(host_key, b"singa_lite job key|" + jid.encode(), hashlib.sha256).digest()
    key_id = hashlib.sha256(b"singa_lite key id|" + host_key).hexdigest()[:16]
    return Credentials(jid, key, "host", key_id, f"this user's host key {path}", required, because,
                       encrypted)


def _truthy(raw: str, name: str) -> bool:
    value = raw.strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{name} must be 1 (require a job secret) or 0, got {raw!r}")


def given_secret(environ) -> bytes | None:
    """The job's secret from SINGA_LITE_JOB_SECRET or SINGA_LITE_JOB_SECRET_FILE (checked), or None."""
    raw, path = environ.get(SECRET_VAR), environ.get(SECRET_FILE_VAR)
    if raw and path:
        raise ValueError(f"both {SECRET_VAR} and {SECRET_FILE_VAR} are set: give the job's secret one way")
    if path:
        raw = _read_private(path, SECRET_FILE_VAR)
    if raw is None or raw == "":
        return None
    raw = raw.strip()
    if not MIN_SECRET <= len(raw) <= MAX_SECRET:
        where = SECRET_FILE_VAR if path else SECRET_VAR
        raise ValueError(f"{where}: a job secret must be {MIN_SECRET} to {MAX_SECRET} characters, got {len(raw)}; "
                         f"make one with: python -c 'import secrets; print(secrets.token_hex(32))'")
    return raw.encode()


def _read_private(path: str, name: str) -> str:
    """The text of a file only its owner (this user) can read; ValueError saying how to fix it otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        raise ValueError(f"{name}={path!r}: cannot open it ({e.strerror or e}); it must name a regular file only "
                         f"you can read") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{name}={path!r} is not a regular file")
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise ValueError(f"{name}={path!r} is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}: "
                             f"a secret must be yours and readable by you alone (chmod 600 {path})")
        data = f.read(MAX_SECRET + 2)
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ValueError(f"{name}={path!r}: the secret must be text (e.g. hex digits)") from None


def key_dirs(environ=None) -> list[str]:
    """Where the host key may live, in order of preference."""
    environ = os.environ if environ is None else environ
    if environ.get(KEY_DIR_VAR):
        return [environ[KEY_DIR_VAR]]
    dirs = []
    config = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    if config and not config.startswith("~"):
        dirs.append(os.path.join(config, "singa_lite"))
    dirs.append(os.path.join(tempfile.gettempdir(), f"singa_lite-{os.geteuid()}"))
    return dirs


def host_key_file(environ=None) -> tuple[bytes, str]:
    """(this user's host key, its path), made on first use. OSError when no directory can keep it; ValueError
    when the file exists but others could read it (it is not used then)."""
    errors = []
    for directory in key_dirs(environ):
        try:
            return _host_key_in(directory), os.path.join(directory, _HOST_KEY)
        except OSError as e:
            errors.append(f"{directory}: {e.strerror or e}")
    raise OSError("; ".join(errors))


def _host_key_in(directory: str) -> bytes:
    os.makedirs(directory, mode=0o700, exist_ok=True)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PermissionError(f"not a private directory of this user (uid {st.st_uid}, mode "
                              f"{stat.S_IMODE(st.st_mode):04o})")
    path = os.path.join(directory, _HOST_KEY)
    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            _create_host_key(directory, path)
            continue
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
                raise ValueError(f"{path} is not a file only you can read (uid {st.st_uid}, mode "
                                 f"{stat.S_IMODE(st.st_mode):04o}): remove it, singa_lite makes a new one")
            text = f.read(256).strip()
        try:
            key = bytes.fromhex(text.decode())
        except ValueError:
            key = b""
        if len(key) != 32:
            raise ValueError(f"{path} does not hold a singa_lite host key (64 hex digits): remove it, singa_lite "
                             f"makes a new one")
        return key
    raise OSError(f"{path} keeps vanishing")


def _create_host_key(directory: str, path: str) -> None:
    """Writes a new key under a private temporary name, then links it into place: a rank that races another
    one on the same host either makes the key or reads the whole of the other's."""
    fd, tmp = tempfile.mkstemp(prefix=".host.key.", dir=directory)  # 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


# ---------------------------------------------------------------- frames
def send_frame(sock: socket.socket, obj: dict) -> bytes:
    """Sends one handshake message (a JSON object in a frame); returns its payload, for the transcript."""
    payload = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    if len(payload) > MAX_FRAME:
        raise ValueError(f"handshake message of {len(payload)} bytes is over {MAX_FRAME}")
    sock.sendall(_FRAME.pack(MAGIC, VERSION, len(payload)) + payload)
    return payload


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("handshake timed out")
        sock.settimeout(left)
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the peer closed the connection during the handshake")
        buf += chunk
    return bytes(buf)


class _BadFrame(ValueError):
    """Bytes that are not a handshake message of ours."""


def recv_frame(sock: socket.socket, deadline: float) -> tuple[dict, bytes]:
    """(message, payload) of the next handshake message, by the deadline."""
    magic, version, length = _FRAME.unpack(_recv_exact(sock, _FRAME.size, deadline))
    if magic != MAGIC:
        raise _BadFrame(f"not a singa_lite handshake (first bytes {magic!r})")
    if version != VERSION:
        raise _BadFrame(f"handshake version {version}, this process speaks {VERSION}: every rank must run the "
                        f"same singa_lite version")
    if length > MAX_FRAME:
        raise _BadFrame(f"handshake message of {length} bytes is over the limit of {MAX_FRAME}")
    payload = _recv_exact(sock, length, deadline)
    try:
        obj = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        raise _BadFrame("handshake message is not JSON") from None
    if not isinstance(obj, dict):
        raise _BadFrame("handshake message is not a JSON object")
    return obj, payload


def _text(obj: dict, name: str, limit: int = 256) -> str:
    value = obj.get(name, "")
    if not isinstance(value, str) or len(value) > limit:
        raise _BadFrame(f"handshake field {name!r} is not a string of at most {limit} characters")
    return value


def _proof(key: bytes, role: bytes, transcript: bytes) -> str:
    return hmac.new(key, role + b"|" + transcript, hashlib.sha256).hexdigest()


def _hello(creds: Credentials, purpose: str, extra: dict) -> dict:
    return {"job": creds.job_id, "kind": creds.kind, "key_id": creds.key_id, "nonce": secrets.token_hex(_NONCE),
            "purpose": purpose, **extra}


def _decide(mine: Credentials, kind: str, key_id: str) -> str | None:
    """'key' (both sides prove the key), 'open' (unauthenticated) or None (refused by this side's rules)."""
    if mine.kind == "secret" or kind == "secret":
        return "key" if mine.kind == kind == "secret" else None
    if mine.kind == kind == "host" and key_id == mine.key_id:
        return "key"
    return None if mine.required else "open"


def _why_refused(mine: Credentials, kind: str, who: str) -> str:
    """Why this side refuses a peer whose key kind is `kind`. Said to strangers too: names no file or key."""
    if mine.kind == "secret" and kind != "secret":
        return f"this job has a secret and {who} has none: give every rank the same {SECRET_VAR}"
    if kind == "secret":
        return f"{who} has a job secret and this side has none: give every rank the same {SECRET_VAR}"
    return (f"{who} does not hold this job's key, which this job requires ({mine.required_because}): only its "
            f"user's processes on its host, or ranks given the job's {SECRET_VAR}, may join")


def _warn_open(creds: Credentials, who: str) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    print(f"singa_lite: warning: {who} is not authenticated: this job runs across hosts without a shared key "
          f"(no {SECRET_VAR}, and the hosts' key files differ), so anyone who can reach its ports could join it "
          f"as a rank and read or change its gradients. Set {SECRET_VAR} (or {SECRET_FILE_VAR}) to the same "
          f"random value on every rank; {REQUIRE_VAR}=1 makes this an error", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the two sides
@dataclass
class Peer:
    """The other side of a finished handshake."""

    hello: dict  # its hello (job, purpose, and whatever it claimed)
    authenticated: bool


def client(sock: socket.socket, creds: Credentials, purpose: str, extra: dict | None = None,
           timeout: float = HANDSHAKE_S, where: str = "the peer") -> Peer:
    """The connecting side of the handshake on a connected socket. Raises Refused (the server said no, or it
    is not a rank of this job), or CommError (it is not a singa_lite endpoint, or it did not answer in time)."""
    deadline = time.monotonic() + timeout
    try:
        try:
            mine = send_frame(sock, _hello(creds, purpose, extra or {}))
            theirs, raw = recv_frame(sock, deadline)
        except (ConnectionError, struct.error) as e:
            raise Dropped(f"{where} closed the connection without answering the handshake ({e})") from None
        if theirs.get("error"):
            raise Refused(f"{where} refused this process: {_text(theirs, 'error', 1024)}")
        job, kind, key_id = _text(theirs, "job", MAX_JOB_ID), _text(theirs, "kind"), _text(theirs, "key_id")
        _text(theirs, "nonce")
        if job != creds.job_id:
            raise Refused(_other_job(job, creds.job_id, where))
        mode = _decide(creds, kind, key_id)
        if mode is None:
            raise Refused(f"{where} is not trusted: {_why_refused(creds, kind, where)}")
        transcript = hashlib.sha256(tls_binding(sock) + b"\0" + mine + b"\0" + raw).digest()
        send_frame(sock, {"proof": _proof(creds.key, b"client", transcript) if mode == "key" else ""})
        verdict, _ = recv_frame(sock, deadline)
        if verdict.get("error"):
            raise Refused(f"{where} refused this process: {_text(verdict, 'error', 1024)}")
        if mode == "key":
            expected = _proof(creds.key, b"server", transcript)
            if not hmac.compare_digest(_text(verdict, "proof"), expected):
                raise Refused(f"{where} did not prove it holds this job's key: it is not a rank of this job "
                              f"(another service or process on that port?)")
        else:
            _warn_open(creds, where)
        return Peer(theirs, mode == "key")
    except (socket.timeout, TimeoutError):
        raise CommError(f"{where} accepted the connection but did not complete the handshake within "
                        f"{timeout:g} s: is it a singa_lite rank or store of this job?") from None
    except _BadFrame as e:
        raise CommError(f"{where} is not a singa_lite endpoint of this version: {e}") from None
    except CommError:
        raise
    except (ConnectionError, OSError, struct.error) as e:
        raise CommError(f"{where} closed the connection during the handshake ({e}): it may have refused this "
                        f"process, or it is not a singa_lite rank or store") from None


def _other_job(theirs: str, mine: str, where: str) -> str:
    def name(j):
        return f"id {j!r}" if j else "no id"
    return (f"another job ({name(theirs)}) uses {where}; this is job {mine!r}" if mine else
            f"another job ({name(theirs)}) uses {where}; this process has no job id ({JOB_ID_VAR})") + \
        ": the two jobs share a port (choose another MASTER_PORT), or the ranks were given different job ids"


def serve(sock: socket.socket, creds: Credentials, purpose: str, admit=None, extra: dict | None = None,
          timeout: float = HANDSHAKE_S, on_refuse=None) -> Peer | None:
    """The accepting side of the handshake. admit(hello) -> error text or None decides, once the peer proved
    the key, whether its claim (a rank, ...) is accepted. Returns the Peer, or None when the peer was refused
    or is not one of ours (it was told why when it spoke the protocol); never raises for what a peer sends.
    on_refuse(text), when given, hears why a peer that spoke the protocol was refused (for the job's errors:
    "rank 1 never arrived; meanwhile ... was refused because ...")."""
    deadline = time.monotonic() + timeout

    def refuse(why: str) -> None:
        send_frame(sock, {"error": why})
        if on_refuse is not None:
            on_refuse(f"{_peer_name(sock)} (claiming {_claim_text(theirs)}): {why}")
    try:
        theirs, raw = recv_frame(sock, deadline)
        for name in ("job", "kind", "key_id", "nonce", "purpose"):
            _text(theirs, name, MAX_JOB_ID if name == "job" else 256)
        hello = _hello(creds, purpose, extra or {})
        if theirs["job"] != creds.job_id:
            refuse(_other_job(creds.job_id, theirs["job"], "this port"))
            return None
        if theirs["purpose"] != purpose:
            refuse(f"this is a singa_lite {purpose}, not a {theirs['purpose'][:40]}")
            return None
        mode = _decide(creds, theirs["kind"], theirs["key_id"])
        if mode is None:
            refuse(_why_refused(creds, theirs["kind"], "this process"))
            return None
        mine = send_frame(sock, hello)
        transcript = hashlib.sha256(tls_binding(sock) + b"\0" + raw + b"\0" + mine).digest()
        answer, _ = recv_frame(sock, deadline)
        if mode == "key" and not hmac.compare_digest(_text(answer, "proof"),
                                                     _proof(creds.key, b"client", transcript)):
            refuse("it did not prove it holds this job's key")
            return None
        problem = admit(theirs) if admit is not None else None
        if problem:
            refuse(problem)
            return None
        send_frame(sock, {"proof": _proof(creds.key, b"server", transcript) if mode == "key" else ""})
        if mode == "open":
            _warn_open(creds, f"a peer at {_peer_name(sock)}")
        return Peer(theirs, mode == "key")
    except (OSError, ValueError, struct.error):  # a stray, slow or hostile client: dropped, no traceback
        return None


def accept_tls(sock: socket.socket, creds: Credentials, timeout: float = HANDSHAKE_S):
    """The TLS side of an accepted connection, or None. A rank that connects without TLS (its first bytes are a
    plain handshake) is told to set SINGA_LITE_TLS instead of being dropped unanswered."""
    deadline = time.monotonic() + timeout
    try:
        sock.settimeout(timeout)
        if sock.recv(len(MAGIC), socket.MSG_PEEK) == MAGIC:
            recv_frame(sock, deadline)
            send_frame(sock, {"error": "this job encrypts its connections (SINGA_LITE_TLS=1): set it, with the same "
                                  "certificate settings, on every rank"})
            return None
        return creds.tls.accept(sock, max(deadline - time.monotonic(), 0.01))
    except (OSError, ValueError, struct.error):  # ssl.SSLError is an OSError: not a TLS peer of ours
        return None


def _claim_text(hello: dict) -> str:
    rank = hello.get("rank")
    return f"rank {rank}" if type(rank) is int else "no rank"


def _peer_name(sock: socket.socket) -> str:
    try:
        name = sock.getpeername()
    except OSError:
        return "?"
    return f"{name[0]}:{name[1]}" if isinstance(name, tuple) and len(name) >= 2 else str(name or "?")
