"""Optional TLS for the rendezvous store and the tcp mesh (``SINGA_LITE_TLS=1``).

Without it the job's key (auth.py) keeps strangers out, but the bytes after the handshake travel in clear:
whoever can read or rewrite the link can read or rewrite gradients. With it every connection of the job is
encrypted and integrity-checked, and the job handshake is bound to the TLS channel (its proofs cover the
channel's ``tls-unique`` binding), so a machine in the middle that terminates TLS on both sides cannot relay a
handshake: it would need the job's key.

Settings (every rank the same):

==========================  =====================================================================
``SINGA_LITE_TLS``          ``1`` to turn it on (``0`` or unset: off)
``SINGA_LITE_TLS_CERT``     the PEM certificate every rank presents when it accepts a connection
``SINGA_LITE_TLS_KEY``      its private key (PEM; a file only its owner can read)
``SINGA_LITE_TLS_CA``       optional: a CA file; then every peer's certificate must chain to it
==========================  =====================================================================

One certificate may serve the whole job (the ranks' identities are proved by the job's key, not by the
certificate; host names are not checked, ranks reach each other by address). Make one with::

    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365 \\
        -subj /CN=singa_lite -keyout tls.key -out tls.crt && chmod 600 tls.key

Its cost: docs/benchmarks/communication.md ("Authentication and TLS on the tcp backend").
"""
from __future__ import annotations

import os
import socket
import stat
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .communicator import CommError

if TYPE_CHECKING:  # ssl costs a few ms to import: only a job with TLS on loads it (settings)
    import ssl

TLS_VAR = "SINGA_LITE_TLS"
CERT_VAR = "SINGA_LITE_TLS_CERT"
KEY_VAR = "SINGA_LITE_TLS_KEY"
CA_VAR = "SINGA_LITE_TLS_CA"
_MAKE_ONE = ("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365 -subj /CN=singa_lite "
             "-keyout tls.key -out tls.crt && chmod 600 tls.key")


@dataclass(frozen=True)
class Tls:
    """The job's TLS contexts: one to accept connections (presenting the certificate), one to open them."""

    server: ssl.SSLContext
    client: ssl.SSLContext

    def accept(self, sock: socket.socket, timeout: float) -> ssl.SSLSocket:
        """The server side of the TLS handshake on an accepted socket, at most `timeout` seconds (a peer that
        does not speak TLS costs no more); ssl.SSLError / OSError when it fails."""
        sock.settimeout(timeout)
        return self.server.wrap_socket(sock, server_side=True)

    def connect(self, sock: socket.socket, timeout: float, where: str) -> ssl.SSLSocket:
        """The client side of the TLS handshake; CommError naming `where` when it fails."""
        import ssl
        sock.settimeout(timeout)
        try:
            return self.client.wrap_socket(sock, server_hostname=None)
        except ssl.SSLCertVerificationError as e:
            raise CommError(f"{where}: its TLS certificate does not chain to {CA_VAR} ({e.verify_message})") from None
        except (ssl.SSLError, OSError) as e:
            raise CommError(f"{where}: the TLS handshake failed ({e}): do all ranks set {TLS_VAR}=1, with the same "
                            f"{CA_VAR} if any?") from None


def binding(sock) -> bytes:
    """The TLS channel's tls-unique binding (b"" for a plain socket): both ends see the same bytes, a relay
    between two TLS sessions does not."""
    if is_tls(sock):
        return sock.get_channel_binding("tls-unique") or b""
    return b""


def is_tls(sock) -> bool:
    """Whether sock is a TLS socket (without importing ssl: if no one has, no socket can be one)."""
    ssl = sys.modules.get("ssl")
    return ssl is not None and isinstance(sock, ssl.SSLSocket)


def retryable(sock) -> tuple:
    """The exceptions that mean "try again when the socket is ready" for a nonblocking sock."""
    if is_tls(sock):
        ssl = sys.modules["ssl"]
        return BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError
    return BlockingIOError, InterruptedError


def settings(environ=None) -> Tls | None:
    """The job's TLS from its environment, or None when it is off. ValueError naming the variable for a missing or
    unusable file."""
    environ = os.environ if environ is None else environ
    raw = environ.get(TLS_VAR, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return None
    if raw not in ("1", "true", "yes", "on"):
        raise ValueError(f"{TLS_VAR} must be 1 (encrypt the job's connections) or 0, got {environ[TLS_VAR]!r}")
    cert, key, ca = environ.get(CERT_VAR), environ.get(KEY_VAR), environ.get(CA_VAR)
    if not cert or not key:
        raise ValueError(f"{TLS_VAR}=1 needs {CERT_VAR} and {KEY_VAR} (PEM files; one pair may serve every rank). "
                         f"Make them with: {_MAKE_ONE}")
    _check_private(key)
    import ssl
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    for ctx in (server, client):
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        server.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"{CERT_VAR}={cert!r} / {KEY_VAR}={key!r}: cannot load the certificate and key ({e})") \
            from None
    client.check_hostname = False  # ranks reach each other by address; who they are, the job's key proves
    if ca:
        try:
            client.load_verify_locations(ca)
        except (OSError, ssl.SSLError) as e:
            raise ValueError(f"{CA_VAR}={ca!r}: cannot load it ({e})") from None
        client.verify_mode = ssl.CERT_REQUIRED
    else:
        client.verify_mode = ssl.CERT_NONE
    return Tls(server, client)


def _check_private(path: str) -> None:
    try:
        st = os.stat(path)
    except OSError as e:
        raise ValueError(f"{KEY_VAR}={path!r}: {e.strerror or e}") from None
    if st.st_mode & 0o077:
        raise ValueError(f"{KEY_VAR}={path!r} has mode {stat.S_IMODE(st.st_mode):04o}: a private key must be readable "
                         f"by its owner alone (chmod 600 {path})")

