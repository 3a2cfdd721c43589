"""Names the rank that died first in an mpiexec job.

When one rank of an MPI job is killed (SIGKILL, the out-of-memory killer, a crash in C), mpiexec (MPICH's
Hydra) kills every other rank at once, before any of them can notice, and reports a failed process by a
PID that is not always the dead one (it names the first of its list that exited badly: all of them, by
then). So on each host, local rank 0 starts this small watcher, in a session of its own so the clean-up
leaves it alone:

    python .../singa_lite/comm/watch.py <socket name> <host> <ready fd> <rank>=<pid> ...

It waits on a pidfd per local rank (woken the moment a process ends, without polling) and on an abstract
Unix datagram socket (no file to clean up) where ranks say ``done <rank>`` when they exit normally, or
``reported <rank>`` when singa_lite already explained their end (an uncaught exception aborting the job).
An abstract name can be reached by any process of the host (it has no file mode), so the watcher reads the
sender's credentials the kernel attaches to each message (SO_PASSCRED / SCM_CREDENTIALS) and ignores
messages from other users: otherwise another user's ``done 1`` silenced the line naming a killed rank 1.
The first rank to end without having said either is the one that died: the watcher prints its name to
the job's stderr and exits. When it wakes to several ends at once (a busy host: mpiexec had ended the
others before the watcher ran), it tells them apart by a progress board, a memfd (no name, nothing to clean
up) that every rank maps through /proc and where it counts the collectives it entered: the dead rank is the
one the others had gone past, waiting for it in a later collective. It exits silently once every rank ended,
when a ``reported`` rank ends, when a rank ends within a second of a ``done`` one (a rank that ended with
``sys.exit(code)`` says ``done`` too, and mpiexec, which reports that code itself, then ends the others), or
when the PIDs cannot be watched (no pidfd: not Linux >= 5.3).
"""
from __future__ import annotations

import mmap
import os
import select
import socket
import struct
import sys
import time

ENV_SWITCH = "SINGA_LITE_WATCH"  # "0": no watcher
AFTER_DONE_S = 1.0  # an unexplained end this soon after a "done" one is mpiexec's clean-up, not a death
GATHER_S = 0.25  # after an unexplained end, how long other ends are gathered before the dead rank is named
MAX_S = 7 * 24 * 3600.0  # a week without any event: give up (a watcher must never outlive its job for long)


def socket_name(spawner_pid: int) -> bytes:
    return f"\0singa_lite_watch_{spawner_pid}".encode()


def tell(name: bytes, word: str, rank: int) -> None:
    """Sends ``<word> <rank>`` to the watcher named `name`; never fails (no watcher is fine)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(f"{word} {rank}".encode(), name)
    except OSError:
        pass


def _sender_uid(ancillary) -> int | None:
    """The uid in a message's SCM_CREDENTIALS (struct ucred: pid, uid, gid as three ints), or None."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= 12:
            return struct.unpack("3i", data[:12])[1]
    return None


def receive(server) -> tuple | None:
    """(word, rank) of one message on the watcher's socket, or None when it is not one of ours: malformed,
    or sent by another user (or without credentials, which SO_PASSCRED makes the kernel always attach)."""
    data, ancillary, _, _ = server.recvmsg(64, socket.CMSG_SPACE(12))
    if _sender_uid(ancillary) != os.getuid():
        return None
    word, _, rank = data.decode(errors="replace").partition(" ")
    return (word, int(rank)) if rank.isdigit() and word in ("done", "reported") else None


def start(name: bytes, host: str, ranks: dict):
    """Starts the watcher of `ranks` ({rank: pid}) and returns once it listens, so no message is lost:
    (its pid, the number of its progress board's descriptor), or None when it cannot watch."""
    import subprocess

    read_end, write_end = os.pipe()
    # Run as a file, not as singa_lite.comm.watch: it needs nothing of the package (importing it costs time).
    args = [sys.executable, os.path.abspath(__file__), name[1:].decode(), host, str(write_end),
            *(f"{r}={p}" for r, p in sorted(ranks.items()))]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=(write_end,),
                            start_new_session=True, close_fds=True)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as ready:
        line = ready.readline()  # "<board fd>\n" when listening; nothing (EOF) when it could not watch
    return (proc.pid, int(line)) if line.strip().isdigit() else None


def open_board(watcher_pid: int, board_fd: int, slots: int):
    """This process's view of a watcher's progress board (a memoryview of `slots` int64), or None."""
    try:
        fd = os.open(f"/proc/{watcher_pid}/fd/{board_fd}", os.O_RDWR)
        try:
            return memoryview(mmap.mmap(fd, 8 * slots)).cast("q")
        finally:
            os.close(fd)
    except (OSError, ValueError):  # /proc hidden or restricted here: the watcher falls back to wake-up order
        return None


def first_of(ended: list, board, order: dict) -> tuple:
    """Of ranks that ended at the same wake-up, the one that died first, told by the progress board: the rank
    the others had gone past. (rank, how it was told) or (None, why not)."""
    if len(ended) == 1:
        return ended[0], ""
    if board is None:
        return None, "no progress board"
    counts = {r: board[order[r]] for r in order}
    low = min(counts[r] for r in ended)
    behind = [r for r in ended if counts[r] == low]
    if len(behind) == 1 and low < max(counts.values()):
        return behind[0], (f"; the others had entered collective #{max(counts.values())}, it stopped after "
                           f"#{low}")
    return None, "their progress was the same"


def watch(name: bytes, host: str, ready_fd: int, ranks: dict) -> str | None:
    """The watcher's loop; returns the message it printed, if any."""
    order = {r: i for i, r in enumerate(sorted(ranks))}  # board slot of each rank
    try:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # credentials with every message
        server.bind(name)
        fds = {os.pidfd_open(pid): rank for rank, pid in ranks.items()}
        board_fd = os.memfd_create("singa_lite_progress")
        os.ftruncate(board_fd, 8 * len(ranks))
        board = memoryview(mmap.mmap(board_fd, 8 * len(ranks))).cast("q")
    except (OSError, AttributeError):  # a rank already gone, no pidfd / memfd support, the name taken
        os.close(ready_fd)
        return None
    os.write(ready_fd, f"{board_fd}\n".encode())
    os.close(ready_fd)
    said = {}  # rank -> "done" | "reported"
    last_done = -1e9  # when the last "done" rank ended
    poller = select.poll()
    poller.register(server, select.POLLIN)
    for fd in fds:
        poller.register(fd, select.POLLIN)
    ended = []  # ranks that ended unannounced
    seen_alone = None  # the rank whose end was seen first, alone at its wake-up (-1: several at once)
    while fds:
        # After a first unannounced end, the next ends are gathered for a moment before judging: on a busy
        # host mpiexec may end the others while the dead rank's last threads are still exiting, so its end
        # can be seen after theirs; the progress board then tells which one the others had gone past.
        events = poller.poll((GATHER_S if ended else MAX_S) * 1000)
        if not events:
            if ended:
                break
            return None
        for fd, _ in sorted(events, key=lambda e: e[0] != server.fileno()):  # messages before deaths
            if fd == server.fileno():
                message = receive(server)
                if message is not None:
                    said[message[1]] = message[0]
                continue
            rank = fds.pop(fd)
            poller.unregister(fd)
            os.close(fd)
            if said.get(rank) == "reported":
                return None
            if said.get(rank) == "done":
                last_done = time.monotonic()
                continue
            if time.monotonic() - last_done < AFTER_DONE_S:
                return None
            ended.append(rank)
        if seen_alone is None and ended:
            seen_alone = ended[0] if len(ended) == 1 else -1
    if ended:
        first, how = first_of(ended, board, order)
        if first is None and seen_alone is not None and seen_alone >= 0:
            first, how = seen_alone, ""  # the board cannot tell them apart: the one whose end was seen first
        if first is None:
            message = (f"singa_lite: ranks {', '.join(map(str, sorted(ended)))} on {host} ended at the same moment, "
                       f"without finishing, and which one died first cannot be told ({how}); mpiexec then ended "
                       f"the job")
        else:
            message = (f"singa_lite: rank {first} (pid {ranks[first]} on {host}) ended first, without finishing "
                       f"(killed by a signal, the out-of-memory killer, or a crash){how}; mpiexec then ended the "
                       f"other ranks")
        print(message, file=sys.stderr, flush=True)
        return message
    return None


def main(argv) -> int:
    name, host, ready_fd, *pairs = argv
    ranks = {int(r): int(p) for r, p in (pair.split("=") for pair in pairs)}
    watch(b"\0" + name.encode(), host, int(ready_fd), ranks)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
