"""Process checks shared by the launcher, failure-drill and hardening tests: is a rank still alive, waiting
(bounded) for the processes of a finished job to be gone, and running a function as another user."""
import os
import time


def alive(pid: int) -> bool:
    """True while the process runs; a zombie (ended, not yet reaped) counts as gone. A process that ends between
    the open and the read makes the read fail with ESRCH (ProcessLookupError): gone too."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def survivors(pids, seconds: float = 5.0, also=lambda: []) -> list:
    """The processes of `pids` (and whatever `also()` lists) still alive after waiting up to `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and ([p for p in pids if alive(p)] or also()):
        time.sleep(0.05)
    return [p for p in pids if alive(p)] + list(also())


def processes_running(marker: bytes) -> list:
    """PIDs of the processes whose command line contains `marker` (e.g. the mpiexec watcher's file name)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def fork_as(uid, fn) -> int:
    """Runs fn() in a forked child as `uid` (None: ours; a uid needs root) and returns the child's pid; the
    child exits 0 when fn returns, 1 when it raised. The hardening tests use it for another local user."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            if uid is not None:
                os.setgid(uid)
                os.setuid(uid)
            fn()
            code = 0
        finally:
            os._exit(code)
    return pid


def describe_tree(root: int) -> str:
    """A report of `root` and its descendants (state, kernel wait channel, ignored signals, command line) for a
    test whose job did not end: what each process was doing when the test gave up on it."""
    children = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(pid))
        except (OSError, ValueError, IndexError):
            pass
    lines, todo = [], [(root, 0)]
    while todo:
        pid, depth = todo.pop()
        try:
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
            with open(f"/proc/{pid}/wchan") as f:
                wchan = f.read().strip() or "-"
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            threads = []
            for tid in sorted(os.listdir(f"/proc/{pid}/task")):
                try:
                    with open(f"/proc/{pid}/task/{tid}/comm") as f:
                        name = f.read().strip()
                    with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                        threads.append(f"{name}:{f.read().strip() or '-'}")
                except OSError:
                    pass
            lines.append(f"{'  ' * depth}{pid} {status.get('State', '?').strip()} wchan={wchan} "
                         f"SigIgn={status.get('SigIgn', '?').strip()} threads=[{', '.join(threads)}] {cmd}")
        except OSError as e:
            lines.append(f"{'  ' * depth}{pid} gone ({e.strerror})")
        todo.extend((c, depth + 1) for c in sorted(children.get(pid, []), reverse=True))
    return "\n".join(lines)
