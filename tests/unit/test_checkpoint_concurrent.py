"""Concurrent writers and readers of one checkpoint, with real processes: checkpoint.save to one directory
from two processes (each save used to delete the other's files, leaving nothing loadable), a reader
during saves, the lock's timeout, and Model.save_states to one new path from two processes (both used to
succeed, one silently replacing the other)."""
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from singa_lite import checkpoint, tensor
from singa_lite.checkpoint import CheckpointError
from singa_lite.checkpoint_io import DirectoryLock

N = 256  # W is N x N float32: big enough that writing a file takes a while


def spawn(code: str, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p: subprocess.Popen, timeout=120) -> str:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, f"child failed ({p.returncode}):\n{out}\n{err}"
    return out


SAVER = """
    import sys, time
    import numpy as np
    from singa_lite import checkpoint, tensor
    path, value, start, saves = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    while time.time() < start:  # both writers begin together
        time.sleep(0.001)
    for i in range(saves):
        W = tensor.from_numpy(np.full((%d, %d), value, np.float32))
        checkpoint.save(path, {"W": W}, extra={"value": value, "i": i})
    print("ok")
""" % (N, N)

READER = """
    import sys, time
    import numpy as np
    from singa_lite import checkpoint, tensor
    from singa_lite.checkpoint import CheckpointError
    path, start, until = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    while time.time() < start:
        time.sleep(0.001)
    complete = errors = 0
    # Reads through the writers' window, and on until one load was complete: on a busy machine this interpreter
    # may start after the window has passed (a deadline of its own bounds that).
    while time.time() < until or (complete == 0 and time.time() < until + 60):
        W = tensor.from_numpy(np.zeros((%d, %d), np.float32))
        try:
            extra = checkpoint.load(path, {"W": W})
        except CheckpointError as e:  # allowed: a clear error, never a half-read checkpoint
            errors += 1
            continue
        w = tensor.to_numpy(W)
        assert (w == extra["value"]).all(), "W and extra come from different saves"
        complete += 1
    print(complete, errors)
""" % (N, N)


@pytest.mark.parametrize("trial", range(4))
def test_two_processes_saving_to_one_directory_leave_a_loadable_checkpoint(tmp_path, trial):
    path = str(tmp_path / "ck")
    checkpoint.save(path, {"W": tensor.from_numpy(np.zeros((N, N), np.float32))}, extra={"value": 0.0, "i": -1})
    start = time.time() + 1.5  # after both interpreters have imported singa_lite
    writers = [spawn(SAVER, path, value, start, 3) for value in (1.0, 2.0)]
    reader = spawn(READER, path, start, start + 2.5)
    for w in writers:
        assert finish(w).strip() == "ok"
    complete, errors = map(int, finish(reader).split())
    W = tensor.from_numpy(np.zeros((N, N), np.float32))
    extra = checkpoint.load(path, {"W": W})
    assert extra["i"] == 2 and extra["value"] in (1.0, 2.0), "the last save of one of the writers is there"
    assert (tensor.to_numpy(W) == extra["value"]).all()
    # only the committed checkpoint's files are left: the loser's files were retired, none was orphaned
    left = sorted(os.listdir(path))  # (the lock is the directory's own: no file)
    assert left[0] == "manifest.json" and len(left) == 3, left
    assert complete > 0, f"the reader never loaded a complete checkpoint ({errors} errors)"


def test_a_save_waits_for_the_lock_and_times_out_with_a_clear_error(tmp_path):
    path = str(tmp_path / "ck")
    W = tensor.from_numpy(np.ones((4, 4), np.float32))
    checkpoint.save(path, {"W": W}, extra={"n": 1})
    with DirectoryLock(path, 1.0, "test"):  # another save in progress
        t0 = time.monotonic()
        with pytest.raises(CheckpointError, match=r"another save to .* is in progress \(it holds the directory's "
                                                  r"lock\) and did not finish within 0.3 s"):
            checkpoint.save(path, {"W": W}, extra={"n": 2}, lock_timeout=0.3)
        assert 0.3 <= time.monotonic() - t0 < 5
    assert checkpoint.load(path, {"W": W}) == {"n": 1}, "the refused save changed nothing"
    checkpoint.save(path, {"W": W}, extra={"n": 3}, lock_timeout=0.3)  # released: the next save proceeds
    assert checkpoint.load(path, {"W": W}) == {"n": 3}


def test_a_killed_saver_does_not_hold_the_lock(tmp_path):
    path = str(tmp_path / "ck")
    os.makedirs(path)
    holder = spawn("""
        import sys, time
        from singa_lite.checkpoint_io import DirectoryLock
        with DirectoryLock(sys.argv[1], 5, "holder"):
            print("held", flush=True)
            time.sleep(60)
    """, path)
    assert holder.stdout.readline().strip() == "held"
    W = tensor.from_numpy(np.ones((2, 2), np.float32))
    with pytest.raises(CheckpointError, match="in progress"):
        checkpoint.save(path, {"W": W}, lock_timeout=0.1)
    holder.kill()
    holder.communicate()
    checkpoint.save(path, {"W": W}, extra={"ok": True}, lock_timeout=5)
    assert checkpoint.load(path, {"W": W}) == {"ok": True}


STATES_SAVER = """
    import sys, time
    import numpy as np
    from singa_lite import layer, model, tensor

    class M(model.Model):
        def __init__(self):
            super().__init__()
            self.fc = layer.Linear(64)

        def forward(self, x):
            return self.fc(x)

    folder, value, start, rounds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    m = M()
    m.compile([tensor.Tensor((2, 512))], is_train=False)
    m.set_states({"fc.W": np.full((512, 64), value, np.float32)})
    results = []
    for r in range(rounds):
        while time.time() < start + 0.4 * r:  # both processes save round r's path together
            time.sleep(0.0005)
        try:
            m.save_states(f"{folder}/m{r}.zip", aux_states={"value": np.array(value)})
            results.append("saved")
        except FileExistsError:
            results.append("exists")
    print(" ".join(results))
"""


def test_two_processes_saving_states_to_one_new_path_one_wins(tmp_path):
    rounds = 6
    start = time.time() + 1.5
    procs = [spawn(STATES_SAVER, tmp_path, value, start, rounds) for value in (1.0, 2.0)]
    results = [finish(p).split() for p in procs]
    for r in range(rounds):
        outcome = sorted(res[r] for res in results)
        assert outcome == ["exists", "saved"], f"round {r}: {outcome} (exactly one save may succeed)"
        winner = 1.0 if results[0][r] == "saved" else 2.0
        from singa_lite import layer, model

        class M(model.Model):
            def __init__(self):
                super().__init__()
                self.fc = layer.Linear(64)

            def forward(self, x):
                return self.fc(x)

        m = M()
        m.compile([tensor.Tensor((2, 512))], is_train=False)
        aux = m.load_states(str(tmp_path / f"m{r}.zip"))
        assert float(tensor.to_numpy(aux["value"])) == winner, "the file is the winner's, whole"
        assert (tensor.to_numpy(m.get_states()["fc.W"]) == winner).all()
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")], "no temporary files left"


def test_where_directories_cannot_be_locked_a_lock_file_is_used(tmp_path, monkeypatch):
    """NFS emulates flock with byte-range locks, which a directory (open read-only) cannot take."""
    import errno
    import fcntl
    import stat

    real = fcntl.flock

    def nfs_like(fd, op):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EBADF, "Bad file descriptor")
        return real(fd, op)
    monkeypatch.setattr(fcntl, "flock", nfs_like)
    path = str(tmp_path / "ck")
    W = tensor.from_numpy(np.ones((2, 2), np.float32))
    checkpoint.save(path, {"W": W}, extra={"n": 1})
    assert os.path.isfile(os.path.join(path, ".lock"))
    with DirectoryLock(path, 1.0, "test"):
        holder = r"in progress \(it holds the directory's lock: pid %d on " % os.getpid()
        with pytest.raises(CheckpointError, match=holder):
            checkpoint.save(path, {"W": W}, extra={"n": 2}, lock_timeout=0.1)
    checkpoint.save(path, {"W": W}, extra={"n": 3})
    assert checkpoint.load(path, {"W": W}) == {"n": 3}


def test_exclusive_write_without_hard_links_still_refuses_an_existing_path(tmp_path, monkeypatch):
    import errno

    from singa_lite.checkpoint_io import exclusive_write

    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")
    monkeypatch.setattr(os, "link", no_links)
    target = str(tmp_path / "f.zip")
    exclusive_write(target, b"first", "test")
    with pytest.raises(FileExistsError, match="test: .*f.zip already exists"):
        exclusive_write(target, b"second", "test")
    assert open(target, "rb").read() == b"first"
    assert os.stat(target).st_mode & 0o777 == 0o600 and os.listdir(tmp_path) == ["f.zip"]
