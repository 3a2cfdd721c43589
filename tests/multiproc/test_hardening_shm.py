"""Hardening of the shm backend's segment against other local users and killed start-ups:

- a rank joins an existing segment only when it belongs to our uid with mode 0600 (another user could
  otherwise re-create a name it saw in /dev/shm, join the job, read and change its data);
- every use of a holder gets a fresh name, so a second dist.init() with the same holder never meets a name
  that was listed during the first rendezvous;
- a start-up killed at any point (SIGKILL to singa-run, or to a multiprocessing job's process group) leaves no
  segment once the next job starts (NcclIdHolder sweeps names of dead creators).

Tests with a second uid need root (a forked child setuid()s to 65534 'nobody'); CI runs as root."""
from __future__ import annotations

import glob
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from singa_lite import _core, dist
from singa_lite.comm import holder as holder_mod
from singa_lite.comm.shm import ShmCommunicator

from paths import job
from procs import fork_as, survivors
from shm_harness import listening_addresses, memfd_links, rendezvous_listening, wait_for_rendezvous

pytestmark = pytest.mark.skipif(not hasattr(_core, "ShmComm") or not os.path.isdir("/dev/shm"),
                                reason="needs the shm backend and /dev/shm")
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second uid (65534 'nobody')")
CLEAN = {k: v for k, v in os.environ.items()
         if k not in ("SINGA_LITE_HOLDER", "SINGA_LITE_COMM_BACKEND", "SINGA_LITE_COMM_TIMEOUT", "RANK",
                      "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}


def wait_for(predicate, seconds=30.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def reap(pid, seconds=30.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


# ---------------------------------------------------------------- attach checks owner and mode
@pytest.fixture(params=["memfd", "named"])
def transport(request, monkeypatch):
    """Each test under each transport (SINGA_LITE_SHM_TRANSPORT; forked children inherit it)."""
    monkeypatch.setenv("SINGA_LITE_SHM_TRANSPORT", request.param)
    return request.param


def _intruder_segment(uid, mode, name):
    """A child (as `uid`) creates segment `name` as rank 1 of 2, as a real rank would, then sets its mode and
    waits in the rendezvous (30 s). Returns the child's pid once the segment exists."""
    def create():
        os.umask(0)
        comm = _core.ShmComm(name, 1, 2, 30.0, 1 << 20)  # blocks until rank 0 joins, or times out
        comm.close()
    pid = fork_as(uid, create)
    wait_for_rendezvous(name)
    if _core.shm_transport() == "named":
        path = "/dev/shm" + name
    else:  # no name: the memory is reached through the creator's descriptor (root may open any process's)
        assert wait_for(lambda: memfd_links(pid, name)), "the intruder made no segment"
        path = memfd_links(pid, name)[0]
    os.chmod(path, mode)  # as the intruder would (root may change any file's mode)
    return pid


@pytest.mark.parametrize("who,mode", [pytest.param(NOBODY, 0o666, marks=needs_root),
                                      pytest.param(NOBODY, 0o600, marks=needs_root),
                                      (None, 0o666), (None, 0o644)])
def test_a_segment_of_another_owner_or_mode_is_refused(who, mode, transport):
    # Without the check rank 0 joined the intruder's segment (root opens any file), the rendezvous completed
    # and the intruder could read and change rank 0's data.
    name = f"/singa_lite_test_intruder_{os.getpid()}_{time.monotonic_ns()}"
    pid = _intruder_segment(who, mode, name)
    try:
        t0 = time.monotonic()
        with pytest.raises(dist.CommError, match="refusing to join shared-memory segment") as e:
            ShmCommunicator(name, 0, 2, timeout=10)
        assert time.monotonic() - t0 < 5  # refused at once, not after a timeout
        text = str(e.value)
        assert name in text and f"uid {NOBODY if who else os.geteuid()} " in text
        # (under memfd another user's server is refused before it hands anything over: its mode is not seen)
        if transport == "named" or who is None:
            assert f"mode {mode:04o}" in text
    finally:
        os.kill(pid, signal.SIGKILL)
        reap(pid)
        _core.shm_unlink(name)


def test_our_own_segment_is_still_joined(transport):
    name = f"/singa_lite_test_own_{os.getpid()}_{time.monotonic_ns()}"
    pid = _intruder_segment(None, 0o600, name)
    try:
        comm = ShmCommunicator(name, 0, 2, timeout=30)
        comm.close()
        assert reap(pid) == 0
    finally:
        _core.shm_unlink(name)


def _fds_received(address: bytes) -> tuple:
    """Connects to `address` as a client would and returns (bytes, descriptors) of the first message."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect(address)
        msg, fds, _, _ = socket.recv_fds(s, 16, 4)
        for fd in fds:
            os.close(fd)
        return msg, len(fds)


@needs_root
def test_the_memfd_server_hands_the_segment_to_no_other_user(monkeypatch):
    # The rendezvous address is listed in /proc/net/unix for anyone to connect to: the creator checks the
    # client's uid (SO_PEERCRED) and gives another user nothing but end-of-file.
    monkeypatch.setenv("SINGA_LITE_SHM_TRANSPORT", "memfd")
    name = f"/singa_lite_test_stranger_{os.getpid()}_{time.monotonic_ns()}"
    comms = {}
    creator = threading.Thread(target=lambda: comms.setdefault(0, _core.ShmComm(name, 0, 2, 30.0)))
    creator.start()
    try:
        wait_for_rendezvous(name)
        address = _core.shm_rendezvous_address(name)
        r, w = os.pipe()

        def stranger():
            os.write(w, repr(_fds_received(address)).encode())
        pid = fork_as(NOBODY, stranger)
        os.close(w)
        with os.fdopen(r) as f:
            got = f.read()
        assert reap(pid) == 0
        assert got == "(b'', 0)", got  # end-of-file, no descriptor
        assert _fds_received(address) == (b"S", 1)  # the same connection from our uid gets the segment
    finally:
        comms[1] = _core.ShmComm(name, 1, 2, 30.0)  # completes the rendezvous: the creator stops serving
        creator.join(30)
        for c in comms.values():
            c.close()
    assert not rendezvous_listening(name)


# ---------------------------------------------------------------- a fresh name per use
def test_every_use_of_a_holder_gets_a_fresh_name_agreed_by_its_copies():
    h = dist.NcclIdHolder()
    copy = pickle.loads(pickle.dumps(h))
    text_copy = dist.NcclIdHolder.from_string(h.to_string())
    names = [h.take_shm_name() for _ in range(3)]
    assert names[0] == h.shm_name and len(set(names)) == 3
    assert [copy.take_shm_name() for _ in range(3)] == names == [text_copy.take_shm_name() for _ in range(3)]
    assert all(n.startswith(h.shm_name) and "/" not in n[1:] for n in names)
    # The later names come from a secret no name shows: another holder with the same visible name differs.
    other = pickle.loads(pickle.dumps(h))
    other._secret = "guess"
    other.take_shm_name()
    assert other.take_shm_name() != names[1]
    # A forked child counts its own uses (SINGA's multiprocessing pattern, forked: the parent may have used it first).
    r, w = os.pipe()
    pid = fork_as(None, lambda: os.write(w, h.take_shm_name().encode()))
    os.close(w)
    with os.fdopen(r, "rb") as f:
        assert f.read().decode() == h.shm_name
    assert reap(pid) == 0


@pytest.mark.parametrize("who", [pytest.param(NOBODY, marks=needs_root), None])
def test_a_second_init_with_the_same_holder_avoids_the_listed_name(who):
    # The reported attack: after the first rendezvous (whose name was listed in /dev/shm), another user
    # re-creates the name with mode 0666; a second init with the same holder must not go near it.
    h = dist.NcclIdHolder()
    first = dist.init(backend="shm", holder=h, rank=0, world_size=1, timeout=5)
    first.close()
    path = "/dev/shm" + h.shm_name

    def squat():
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666)
        os.fchmod(fd, 0o666)
        os.ftruncate(fd, 1 << 20)
        os.close(fd)
    assert reap(fork_as(who, squat)) == 0
    try:
        second = dist.init(backend="shm", holder=h, rank=0, world_size=1, timeout=5)
        t = _core.Tensor.from_buffer(__import__("numpy").arange(4, dtype="float32"))
        second.all_reduce(t)
        second.close()
        assert os.path.exists(path)  # untouched: the second job used another name
    finally:
        os.unlink(path)


# ---------------------------------------------------------------- killed start-ups leave nothing
def all_joined(stream, n: int) -> bool:
    """Reads the job's output until every rank said 'joined <rank>' (processes writing to one pipe may join
    their lines) or it ends."""
    seen = ""
    while not all(f"joined {r}" in seen for r in range(n)):
        line = stream.readline()
        if not line:
            return False
        seen += line
    return True


def _ours(pid):
    """The job's traces by the pid of the process that made its holder: names in /dev/shm (named transport), and
    rendezvous sockets still listening (memfd)."""
    return glob.glob(f"/dev/shm/singa_lite_{pid}_*") + \
        [a for a in listening_addresses() if a.startswith(f"@sl_shm/singa_lite_{pid}_")]


def _descendants_gone(pids):
    assert not survivors(pids, seconds=15), "processes left behind"


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _mapping(pid, job_pid) -> bool:
    """Whether process `pid` has mapped a memfd segment of the job whose holder process is `job_pid`."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return f"/memfd:sl_shm/singa_lite_{job_pid}_" in f.read()
    except OSError:
        return False


# Where singa-run is killed: before it made the ranks; once they exist (their holder too) but no segment yet;
# with rank 0 in the rendezvous (memfd: it created the memory and serves it); with some ranks attached and one
# not (3 ranks, the last one late); and once every rank joined.
POINTS = [(2, "at_start"), (2, "holder_made"), (2, "rank0_in_rendezvous"), (3, "some_attached"), (2, "all_joined")]


def late_by(point: str) -> str:
    """How long the job's last rank sleeps before dist.init(): until the kill, unless the point is after every
    rank joined (a loaded machine must not let it join before the point was seen)."""
    return "0" if point == "all_joined" else "3600"


@pytest.mark.parametrize("ranks,point", POINTS, ids=[p for _, p in POINTS])
def test_singa_run_killed_at_any_point_of_start_up_leaves_no_segment(ranks, point, tmp_path):
    # Under memfd nothing of the job has a name in /dev/shm at any point, and what it has (the memory, the
    # rendezvous socket) ends with its processes: nothing is left even before the next job's sweep. (Before,
    # the segment's name stayed in /dev/shm from rank 0's creation until every rank had joined.)
    env = {**CLEAN, "SINGA_LITE_SHM_TRANSPORT": "memfd"}
    proc = subprocess.Popen([sys.executable, "-m", "singa_lite.run", "-np", str(ranks), "--timeout", "60",
                             job("hardening_job.py"), late_by(point)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ranks_pids = []
    try:
        if point == "holder_made":  # the ranks exist (so the holder does), the segment not yet
            assert wait_for(lambda: len(_children(proc.pid)) == ranks)
        elif point == "rank0_in_rendezvous":
            assert wait_for(lambda: _ours(proc.pid)), "rank 0 never created the segment"
        elif point == "some_attached":  # ranks 0 and 1 map the segment, rank 2 sleeps before dist.init()
            assert wait_for(lambda: sum(_mapping(p, proc.pid) for p in _children(proc.pid)) == ranks - 1), \
                "ranks 0 and 1 never mapped the segment"
        elif point == "all_joined":
            assert all_joined(proc.stdout, ranks)
        ranks_pids = _children(proc.pid)
        at_kill = glob.glob(f"/dev/shm/singa_lite_{proc.pid}_*")
    finally:
        proc.kill()
        proc.wait()
    assert at_kill == []  # never a name in /dev/shm
    _descendants_gone(ranks_pids)  # the kernel kills the ranks when singa-run dies (PR_SET_PDEATHSIG)
    # No sweep needed (no holder made since): the rendezvous socket goes with its processes. Bounded wait, not
    # an instant check: /proc/net/unix listed it for a moment after they ended (1 full-suite run in ~10).
    assert wait_for(lambda: _ours(proc.pid) == [], seconds=10), _ours(proc.pid)


def test_singa_run_killed_in_the_rendezvous_of_a_named_segment_is_swept(tmp_path):
    # The named transport (SINGA_LITE_SHM_TRANSPORT=named, and off Linux) keeps the name in /dev/shm until every
    # rank joined: the next holder on the host sweeps what a killed job left there.
    env = {**CLEAN, "SINGA_LITE_SHM_TRANSPORT": "named"}
    proc = subprocess.Popen([sys.executable, "-m", "singa_lite.run", "-np", "2", "--timeout", "60",
                             job("hardening_job.py"), late_by("rank0_in_rendezvous")], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    ranks = []
    try:
        assert wait_for(lambda: _ours(proc.pid)), "rank 0 never created the segment"
        ranks = _children(proc.pid)
        left_at_kill = _ours(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    _descendants_gone(ranks)
    assert left_at_kill and _ours(proc.pid) == left_at_kill  # what the next start has to clean
    dist.NcclIdHolder()  # the next start on this host
    assert _ours(proc.pid) == []


@pytest.mark.parametrize("point", ["rank0_in_rendezvous", "all_joined"])
def test_a_killed_multiprocessing_job_leaves_no_segment(point, tmp_path):
    env = {**CLEAN, "SINGA_LITE_SHM_TRANSPORT": "memfd"}
    proc = subprocess.Popen([sys.executable, job("hardening_job.py"), "--mp", late_by(point)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    everyone = [proc.pid]
    try:
        assert proc.stdout.readline().startswith("holder /singa_lite_")
        if point == "rank0_in_rendezvous":
            assert wait_for(lambda: _ours(proc.pid)), "rank 0 never created the segment"
        else:
            assert all_joined(proc.stdout, 2)
        everyone += _children(proc.pid)
        at_kill = glob.glob(f"/dev/shm/singa_lite_{proc.pid}_*")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole job at once: no atexit, no clean-up of any kind
        proc.wait()
    _descendants_gone(everyone)
    assert at_kill == [] and _ours(proc.pid) == []


# ---------------------------------------------------------------- what the sweep removes, and what not
def test_sweep_removes_only_our_dead_creators_names(tmp_path):
    me, ns = os.getpid(), holder_mod.pid_namespace()
    start = holder_mod.start_time(me)
    dead = subprocess.Popen(["true"])
    dead.wait()
    old = time.time() - 2 * holder_mod.OLD_NAME_AGE_S
    files = {
        f"singa_lite_{dead.pid}_123_{ns}_{'a' * 16}": True,              # creator gone
        f"singa_lite_{me}_{start + 1}_{ns}_{'b' * 16}": True,            # pid reused by another process
        f"singa_lite_{dead.pid}_123_{ns}_{'c' * 16}_{'d' * 16}": True,   # a later use's name
        f"singa_lite_{me}_{start}_{ns}_{'e' * 16}": False,               # creator alive
        f"singa_lite_{dead.pid}_123_{ns + 1}_{'f' * 16}": False,         # another pid namespace
        f"singa_lite_{dead.pid}_{'1' * 16}": True,                       # old form, old, creator gone
        f"singa_lite_{me}_{'2' * 16}": False,                            # old form, creator alive
        f"singa_lite_{dead.pid}_{'3' * 16}x": False,                     # not our pattern
        "mpich_shm_1234": False,
    }
    fresh_old_form = f"singa_lite_{dead.pid}_{'4' * 16}"                 # old form, but young: a live start-up?
    for name in list(files) + [fresh_old_form]:
        (tmp_path / name).write_bytes(b"x")
        if name != fresh_old_form:
            os.utime(tmp_path / name, (old, old))
    files[fresh_old_form] = False
    if os.geteuid() == 0:
        foreign = f"singa_lite_{dead.pid}_123_{ns}_{'9' * 16}"
        (tmp_path / foreign).write_bytes(b"x")
        os.chown(tmp_path / foreign, NOBODY, NOBODY)
        files[foreign] = False                                          # another user's
    removed = holder_mod.sweep_stale_segments(str(tmp_path))
    assert sorted(removed) == sorted(n for n, gone in files.items() if gone)
    assert sorted(os.listdir(tmp_path)) == sorted(n for n, gone in files.items() if not gone)


def test_sweep_removes_nothing_where_processes_cannot_be_looked_up(tmp_path, monkeypatch):
    # Without a readable /proc every creator would look dead, live jobs' names included.
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"singa_lite_{dead.pid}_123_{holder_mod.pid_namespace()}_{'a' * 16}"
    (tmp_path / name).write_bytes(b"x")
    monkeypatch.setattr(holder_mod, "start_time", lambda pid: None)
    assert holder_mod.sweep_stale_segments(str(tmp_path)) == []
    assert os.listdir(tmp_path) == [name]
