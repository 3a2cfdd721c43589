"""A host-side arrival board for the nccl backend: which collectives each rank has entered.

NCCL cannot tell which rank a stuck collective waits for: its watchdog only knows that the operation has not
finished. The mpi backend keeps a one-sided MPI window and the shm backend its segment for that; here every
rank of one host maps the same small shared-memory file and, from the host thread that enqueues a
collective, writes how many collectives it has entered and the kind of the last one. A rank that times out
reads the board and names the ranks that never entered the collective it waits in.

The file lives in /dev/shm (else the temporary directory), named from a digest of the communicator's NCCL
unique id (the same on every rank, unpredictable to others), created with mode 0600 and refused unless this
user owns it. It is unlinked as soon as every rank of the host has mapped it (the mappings stay valid), and
again at close, so nothing is left behind. Each rank's slot is four int64 written by that rank only:

    entered   collectives entered so far
    kind      the kind of the last one (an index in KINDS)
    pid       the rank's process id (0: the rank never mapped this board: it runs on another host)
    state     OPEN, CLOSED (closed its communicator normally) or FAILED

Ranks on other hosts have their own file (the same name, another machine): this board cannot see them, and
the message says so.
"""
from __future__ import annotations

import collections
import hashlib
import mmap
import os
import sys
import tempfile
import weakref

KINDS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather", "scatter", "barrier")
_FIELDS = 4
ENTERED, KIND, PID, STATE = range(_FIELDS)
OPEN, CLOSED, FAILED = 1, 2, 3
RECENT = 256  # collectives whose kind and call site a rank remembers (a step of DistOpt makes a few)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def default_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def call_site(skip: int = 1) -> str:
    """'file:line' of the nearest caller outside singa_lite (the user's line), or '' when there is none."""
    frame = sys._getframe(skip)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    return "" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


class HostBoard:
    """This host's board of one communicator. Use :meth:`open`, which gives None (and a reason) when the
    board cannot be made; a communicator then says that it cannot tell who is missing, and why."""

    def __init__(self, view, path: str, rank: int, world_size: int, local_size: int):
        self._view, self._path = view, path
        self.rank, self.world_size, self.local_size = rank, world_size, local_size
        self._mine = rank * _FIELDS
        self.entered = 0
        self._recent = collections.deque(maxlen=RECENT)  # (number, kind, the user's line) of this rank's last

    @classmethod
    def open(cls, key: bytes, rank: int, world_size: int, local_size: int, directory: str | None = None):
        """(board, '') or (None, why not). key: bytes the same on every rank of the communicator (the NCCL
        unique id)."""
        name = "singa_lite_board_" + hashlib.sha256(b"singa_lite board\0" + bytes(key)).hexdigest()[:24]
        path = os.path.join(directory or default_dir(), name)
        size = 8 * _FIELDS * world_size
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                         0o600)
        except OSError as e:
            return None, f"its file {path} could not be created ({e.strerror})"
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid():
                return None, f"its file {path} belongs to another user"
            if st.st_size not in (0, size):
                return None, f"its file {path} has {st.st_size} bytes, not {size}"
            os.ftruncate(fd, size)  # every rank extends it to the same size: no-op once done
            view = memoryview(mmap.mmap(fd, size)).cast("q")
        except (OSError, ValueError) as e:
            return None, f"its file {path} could not be mapped ({e})"
        finally:
            os.close(fd)
        board = cls(view, path, rank, world_size, local_size)
        weakref.finalize(board, _unlink, path)  # a communicator never closed leaves no file either (at exit)
        board._write(PID, os.getpid())
        board._write(STATE, OPEN)
        if board.joined() >= local_size:  # every rank of this host has it mapped: the name is not needed
            board.unlink()
        return board, ""

    def _write(self, field: int, value: int) -> None:
        self._view[self._mine + field] = value  # one aligned 8-byte store: readers never see half of it

    def joined(self) -> int:
        return sum(1 for r in range(self.world_size) if self._view[r * _FIELDS + STATE] != 0)

    def enter(self, kind: str, site: str = "") -> int:
        """Counts one collective entered by this rank (site: the user's line that called it); returns its
        number (1, 2, ...)."""
        self.entered += 1
        self._recent.append((self.entered, kind, site))
        self._write(KIND, KINDS.index(kind))
        self._write(ENTERED, self.entered)
        return self.entered

    def _entry(self, number: int) -> tuple:
        """(kind, site) of this rank's collective #number, or ('collective', '') once forgotten."""
        for n, kind, site in reversed(self._recent):
            if n == number:
                return kind, site
        return "collective", ""

    def mark(self, state: int) -> None:
        self._write(STATE, state)

    def unlink(self) -> None:
        _unlink(self._path)

    def read(self) -> list:
        """[(entered, kind, pid, state)] per rank, as this host sees them."""
        v = self._view
        return [tuple(int(v[r * _FIELDS + f]) for f in range(_FIELDS)) for r in range(self.world_size)]

    def explain(self, number: int) -> str:
        """Who never entered this rank's collective #number (the one a wait timed out in), or an earlier one
        that it queued behind, as one sentence."""
        slots = self.read()
        elsewhere = [r for r, s in enumerate(slots) if s[PID] == 0]
        here = [r for r in range(self.world_size) if r not in elsewhere and r != self.rank]
        late, closed, dead, other_kind = [], [], [], []
        kind, site = self._entry(number)
        for r in here:
            entered, k, pid, state = slots[r]
            if entered < number:
                late.append(r)
                if state == CLOSED:
                    closed.append(r)
                elif not _alive(pid):
                    dead.append(r)
            elif entered == number and 0 <= k < len(KINDS) and KINDS[k] != kind:
                other_kind.append((r, KINDS[k]))
        parts = []
        if late:
            first = min(slots[r][ENTERED] for r in late) + 1  # GPU work queues: later ones wait behind it
            kind, site = self._entry(first)
            counts = ", ".join(f"rank {r} entered {slots[r][ENTERED]}" for r in late)
            parts.append(f"{counts} collective(s), this rank {self.entered}: {_ranks(late)} never entered "
                         f"{kind} #{first}" + (f" (this rank entered it at {site})" if site else ""))
            if closed:
                parts.append(f"{_ranks(closed)} closed its communicator normally (its script ended: a different "
                             f"number of steps per rank?)")
            if dead:
                parts.append(f"{_ranks(dead)} is no longer running (killed, or crashed: see its output)")
        if other_kind:
            parts.append("; ".join(f"rank {r}'s collective #{number} is a {k}, this rank's a {kind}"
                                   for r, k in other_kind) + ": every rank must call the same collectives in the "
                                                            "same order")
        if not late and not other_kind and here:
            where = f" (this rank entered it at {site})" if site else ""
            parts.append(f"every rank on this host entered {kind} #{number}{where}, so one of them is stuck inside "
                         f"it (a GPU hang, or a rank that died inside it)")
        if elsewhere:
            parts.append(f"{_ranks(elsewhere)} run(s) on other hosts, where this host's board cannot see: look "
                         f"at their output")
        return "; ".join(parts) or "no other rank to ask"


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _ranks(ranks: list) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, another user's (cannot happen for our own ranks, but it is alive)
        return True
    try:  # a rank that ended stays a zombie until its parent (the launcher) reaps it
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError):  # ended (and reaped) since the kill(0) above
        return False
    except (OSError, IndexError):
        return True
