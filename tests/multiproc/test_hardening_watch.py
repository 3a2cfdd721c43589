"""The mpiexec watcher (singa_lite/comm/watch.py) listens on an abstract Unix socket, which any process of
the host can reach: messages from another user must not change what it reports. Needs root (to send from
a second uid, 65534 'nobody'); CI runs as root."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from singa_lite.comm import watch

from procs import fork_as

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="the watcher needs pidfd (Linux >= 5.3)")
NOBODY = 65534


def send_as(uid, name: str, text: str) -> int:
    """Sends `text` to the abstract socket `name` from a forked child running as `uid` (None: ours); the
    child's exit status: 0 once the message was delivered."""
    import socket

    def send():
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(text.encode(), b"\0" + name.encode())

    return os.waitstatus_to_exitcode(os.waitpid(fork_as(uid, send), 0)[1])


def run_watch(sender_uid):
    """Watches two sleeping 'ranks'; a process of `sender_uid` says 'done 1', then rank 1 is SIGKILLed (and
    rank 0 later). Returns what the watcher printed."""
    ranks = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    name = f"singa_lite_watch_test_{os.getpid()}_{time.monotonic_ns()}"
    read_end, write_end = os.pipe()
    watcher = subprocess.Popen([sys.executable, watch.__file__, name, "testhost", str(write_end),
                                f"0={ranks[0].pid}", f"1={ranks[1].pid}"], pass_fds=(write_end,),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as ready:
            assert ready.readline().strip().isdigit(), "the watcher did not start"
        # delivered: nothing but the watcher itself can stop it
        assert send_as(sender_uid, name, "done 1") == 0
        time.sleep(0.5)  # the watcher has read it by now
        ranks[1].send_signal(signal.SIGKILL)
        ranks[1].wait()
        time.sleep(1.5)  # past AFTER_DONE_S: a later end is not mpiexec's clean-up after a "done" rank
        ranks[0].send_signal(signal.SIGKILL)
        ranks[0].wait()
        _, err = watcher.communicate(timeout=30)
        return err
    finally:
        for p in ranks + [watcher]:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to send from a second uid (65534 'nobody')")
def test_another_users_done_message_is_ignored():
    err = run_watch(NOBODY)
    assert "rank 1 (pid" in err and "ended first" in err, err


def test_the_ranks_own_done_message_still_counts():
    # The same message from our own uid is a rank's normal end: rank 1's death is not reported, and rank 0,
    # ending later unannounced, is the one named.
    err = run_watch(None)
    assert "rank 1" not in err and "rank 0 (pid" in err, err


def test_receive_needs_credentials_of_this_user():
    import socket
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with a, b:
        b.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        a.send(b"done 3")
        assert watch.receive(b) == ("done", 3)
        for junk in (b"done x", b"bye 1", b""):
            a.send(junk)
            assert watch.receive(b) is None
