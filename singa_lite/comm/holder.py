"""NcclIdHolder: what processes started by ``multiprocessing`` (or singa-run) need to find each other.

Created once in the parent and passed to every rank (as SINGA's scripts do); unlike SINGA's it is picklable,
so it works with both the ``fork`` and the ``spawn`` start methods and with ``Pool``. It carries the name of
the shared-memory segment the ``shm`` backend rendezvouses in (every build) and, when NCCL and a GPU are
available, a NCCL unique id for the ``nccl`` backend (``nccl_id``; otherwise None, and ``nccl_error`` says
why, so the holder still serves the ``shm`` backend). Creating the id does not initialise CUDA: the parent
can still fork workers that use the GPU. ``to_string()`` / ``from_string()`` carry it through an environment
variable (how singa-run hands it to the ranks it starts). Everything stays on this host: the segment is
owner-only (mode 0600; a rank refuses to join one of another owner or mode), and NCCL's bootstrap listens on
loopback only (``NCCL_SOCKET_IFNAME=lo`` unless set).

On Linux the name never appears in /dev/shm: the segment is an anonymous memfd, and the name only identifies
the ranks' rendezvous, an abstract Unix socket that the creating rank closes once every rank has joined (it
serves the memory to processes of our uid only, and a rank refuses a server of another uid; see
csrc/comm/shm_rendezvous.h). A job killed at any moment, its start-up included, leaves nothing behind. With
``SINGA_LITE_SHM_TRANSPORT=named`` (and off Linux) the segment has the name in /dev/shm until every rank has
joined; what follows about stale names concerns that transport (and names left by earlier versions).

Each use of a holder in a process gets a fresh segment name (``take_shm_name()``: the first use
``shm_name``, the k-th a name derived from a secret the holder carries but no name shows), so a second
``dist.init(holder=h, ...)`` never reuses a name another user saw during the first rendezvous (in /dev/shm, or
in /proc/net/unix, which lists the memfd transport's socket).
The ranks of one job all use their copy the same number of times, so they agree on the name: the
pattern of SINGA's distributed-training page (one holder from the parent, one init per process) uses ``shm_name``.

A segment name is ``/singa_lite_<pid>_<start>_<pidns>_<token>``: the pid, start time and pid namespace of
the process that created the holder. Under the named transport, a job killed during its start-up (SIGKILL to
singa-run or to a multiprocessing job's process group, before every rank had joined) leaves its name behind;
the next holder created on the host removes such names when they are ours (our uid), follow this pattern, and
their creator is dead (no process with that pid and start time in our pid namespace): ``sweep_stale_segments()``.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import secrets
import time

from .. import _core
from . import nccl


NCCL_IFNAME_VAR = "NCCL_SOCKET_IFNAME"
SHM_DIR = "/dev/shm"
# /singa_lite_<pid>_<start time>_<pid namespace>_<token>[_<use>]: see the module docstring.
_NAME = re.compile(r"singa_lite_(\d+)_(\d+)_(\d+)_[0-9a-f]{16}(?:_[0-9a-f]{16})?")
# Names of the earlier form /singa_lite_<pid>_<token> carry no start time: removed only when their creator's
# pid is gone and the segment is older than this (a start-up that still waits for its ranks is not).
_OLD_NAME = re.compile(r"singa_lite_(\d+)_[0-9a-f]{16}")
OLD_NAME_AGE_S = 3600.0


def start_time(pid: int):
    """Field 22 of /proc/<pid>/stat (clock ticks after boot), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()  # after the command name, which may hold spaces
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def pid_namespace() -> int:
    """The inode of this process's pid namespace (0 where /proc does not say): a pid means a process only within it."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def sweep_stale_segments(directory: str = SHM_DIR) -> list:
    """Removes the names of shared-memory segments left by killed jobs and returns them: segments of our
    uid, named by a holder (see the module docstring) whose creating process is gone. A process with the
    same pid but another start time is another process (the pid was reused). Names from another pid
    namespace are left alone (their pid means nothing here), and so is everything else in the directory."""
    removed = []
    try:
        entries = os.listdir(directory)
    except OSError:  # no /dev/shm (not Linux): nothing to sweep
        return removed
    if start_time(os.getpid()) is None:  # no readable /proc: every creator would look dead
        return removed
    my_ns, now = pid_namespace(), time.time()
    for entry in entries:
        new, old = _NAME.fullmatch(entry), _OLD_NAME.fullmatch(entry)
        if not (new or old):
            continue
        path = os.path.join(directory, entry)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid != os.geteuid() or not (st.st_mode & 0o170000 == 0o100000):
            continue
        if new:
            pid, start, ns = map(int, new.groups())
            if ns != my_ns or start_time(pid) == start:
                continue
        elif start_time(int(old.group(1))) is not None or now - st.st_mtime < OLD_NAME_AGE_S:
            continue
        try:
            os.unlink(path)
            removed.append(entry)
        except OSError:  # another process removed it first
            pass
    return removed


def new_shm_name() -> str:
    """A name for a new shared-memory segment: owner-only and unguessable, so another user cannot pre-create
    or join it; the creator's pid, start time and pid namespace in it tell sweep_stale_segments when it is
    stale."""
    return f"/singa_lite_{os.getpid()}_{start_time(os.getpid()) or 0}_{pid_namespace()}_{secrets.token_hex(8)}"


class NcclIdHolder:
    def __init__(self):
        # Leftovers of jobs killed during their start-up: this is the next start.
        sweep_stale_segments()
        self.shm_name = new_shm_name()
        self._secret = secrets.token_hex(16)  # derives the names of later uses: never part of a name
        self._uses = (os.getpid(), 0)
        self.nccl_id, self.nccl_error = None, None
        # The ranks of a holder share this host (it travels by multiprocessing or singa-run), so NCCL's
        # bootstrap listener, opened by unique_id(), needs no interface but loopback: it stays off the network
        # unless the user chose an interface (NCCL_SOCKET_IFNAME). Set here, so the ranks inherit it too.
        os.environ.setdefault(NCCL_IFNAME_VAR, "lo")
        try:
            self.nccl_id = nccl.unique_id()
        except (_core.CommError, _core.CudaError) as e:  # no NCCL or no GPU here: fine for the shm backend
            self.nccl_error = str(e)
        self._owner_pid = os.getpid()
        # Named segments: the ranks unlink the name once all have joined; if a rank died before that, the parent
        # removes it when it exits. (memfd segments have no name to remove.)
        atexit.register(self.cleanup)

    def take_shm_name(self) -> str:
        """The segment name for the next rendezvous of this process with this holder: ``shm_name`` the first
        time, then a new name each time (the same sequence in every process that received the holder)."""
        pid, uses = self._uses
        if pid != os.getpid():  # a forked child counts its own uses, as a spawned one does
            uses = 0
        self._uses = (os.getpid(), uses + 1)
        if uses == 0:
            return self.shm_name
        digest = hashlib.sha256(f"{self._secret}:{uses}".encode()).hexdigest()[:16]
        return f"{self.shm_name}_{digest}"

    def cleanup(self):
        """In the process that created the holder, at its exit: removes the names of every use that a rank
        did not remove (one that never joined)."""
        if os.getpid() != self._owner_pid:
            return
        unlink = getattr(_core, "shm_unlink", None)
        if unlink is not None:  # where shared memory has no directory (not Linux), at least the first name
            unlink(self.shm_name)
        prefix = self.shm_name[1:]
        try:
            entries = os.listdir(SHM_DIR)
        except OSError:
            entries = []
        for entry in entries:
            if entry == prefix or entry.startswith(prefix + "_"):
                try:
                    os.unlink(os.path.join(SHM_DIR, entry))
                except OSError:
                    pass

    def __getstate__(self):
        return {"shm_name": self.shm_name, "nccl_id": self.nccl_id, "nccl_error": self.nccl_error,
                "secret": self._secret}

    def __setstate__(self, state):
        self.shm_name, self.nccl_id = state["shm_name"], state["nccl_id"]
        self.nccl_error = state.get("nccl_error")
        self._secret = state.get("secret") or ""
        self._uses = (os.getpid(), 0)
        self._owner_pid = None  # a copy in a child never removes the parent's segment name

    def to_string(self) -> str:
        """This holder as one line of text (JSON), for an environment variable; from_string() reads it."""
        return json.dumps({"shm_name": self.shm_name, "nccl_id": self.nccl_id.hex() if self.nccl_id else None,
                           "nccl_error": self.nccl_error, "secret": self._secret}, separators=(",", ":"))

    @classmethod
    def from_string(cls, text: str) -> "NcclIdHolder":
        """The holder written by to_string() in the parent (a copy: it never removes the parent's segment)."""
        try:
            state = json.loads(text)
            shm_name, nccl_id = state["shm_name"], state["nccl_id"]
            if not isinstance(shm_name, str) or not shm_name.startswith("/"):
                raise ValueError("shm_name")
            nccl_id = None if nccl_id is None else bytes.fromhex(nccl_id)
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"NcclIdHolder.from_string: expected the text of NcclIdHolder.to_string(), got "
                             f"{text[:80]!r} ({type(e).__name__}: {e})") from None
        holder = cls.__new__(cls)
        holder.__setstate__({"shm_name": shm_name, "nccl_id": nccl_id, "nccl_error": state.get("nccl_error"),
                             "secret": state.get("secret")})
        return holder

    def __repr__(self):
        return f"NcclIdHolder(shm_name={self.shm_name!r}, nccl_id={'set' if self.nccl_id else 'none'})"
