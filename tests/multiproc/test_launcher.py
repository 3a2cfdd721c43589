"""singa-run (singa_lite/comm/launcher.py), run as `python -m singa_lite.run` in a subprocess, always under a
timeout: ranks that find each other from the environment (dist.init and DistOpt), output prefixes, a rank
that raises or is killed, Ctrl-C, bad input; after every job no rank process and no shared-memory segment
is left."""
import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from singa_lite import _core, dist
from singa_lite.comm import nccl

from paths import HELPERS
from procs import survivors

pytestmark = pytest.mark.skipif(not hasattr(_core, "ShmComm"), reason="this build has no shm backend")

RUN = [sys.executable, "-m", "singa_lite.run"]
# Variables of an enclosing launcher (or of singa-run itself, should the tests run under it) must not leak in.
CLEAN = {k: v for k, v in os.environ.items()
         if k not in ("SINGA_LITE_HOLDER", "SINGA_LITE_COMM_BACKEND", "SINGA_LITE_COMM_TIMEOUT", "RANK",
                      "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}

COMMON = """\
import os, signal, sys, time
import numpy as np
from singa_lite import dist, opt, tensor
print(f"pid {os.getpid()}", flush=True)
"""

SCRIPTS = {
    "allreduce.py": COMMON + """
comm = dist.init()
r, n = comm.rank, comm.world_size
assert (r, n) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
t = tensor.from_numpy(np.arange(5, dtype=np.float32) + 10 * r)
comm.all_reduce(t, "sum")
assert np.array_equal(tensor.to_numpy(t), n * np.arange(5) + 10 * n * (n - 1) // 2), tensor.to_numpy(t)
sys.stdout.flush()
os.write(1, f"ok rank={r} of {n} backend={comm.backend} local={os.environ['LOCAL_RANK']}/"
            f"{os.environ['LOCAL_WORLD_SIZE']} timeout={comm.timeout:g} args={sys.argv[1:]}\\n".encode())  # one write
print(f"to stderr {r}", file=sys.stderr)
""",
    "distopt.py": COMMON + """
sys.path.insert(0, sys.argv[1])
from distopt_cases import make_params, reference, train
comm = dist.init()
sgd = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9))  # nccl_id=None: the holder and rank come from singa-run
assert sgd.communicator is comm and dist.init() is comm  # one rendezvous per rank: later calls share it
r, n = sgd.global_rank, sgd.world_size
got = train(make_params(0), sgd, 5, shard=(r, n))
want = reference("sgd", 5)
for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)
print(f"distopt rank={r} of {n} backend={sgd.communicator.backend} local={sgd.rank_in_local}", flush=True)
comm.close()
try:
    dist.init()
except dist.CommError as e:
    print(f"after close: {e}")
""",
    # rank 1 raises once every rank has joined; the others sleep, so only singa-run can stop them (and rank
    # 0's own child process, in its process group)
    "raises.py": COMMON + """
comm = dist.init()
if comm.rank == 0:
    import subprocess
    print(f"pid {subprocess.Popen(['sleep', '120']).pid}", flush=True)
comm.barrier()
if comm.rank == 1:
    raise RuntimeError("boom from rank 1")
time.sleep(120)
""",
    # rank 2 is killed while the others wait for it in a collective
    "killed.py": COMMON + """
comm = dist.init()
comm.barrier()
if comm.rank == 2:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
comm.barrier()
time.sleep(120)
""",
    # every rank waits to be interrupted; rank 1 ignores SIGINT, so it needs SIGKILL after the grace period
    "waits.py": COMMON + """
comm = dist.init()
if comm.rank == 1:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
comm.barrier()
print("ready", flush=True)
time.sleep(120)
""",
    # rank 1 exits before joining, while rank 0 waits for it in the segment it created
    "exits3.py": COMMON + """
if int(os.environ["RANK"]) == 1:
    time.sleep(1)
    sys.exit(3)
dist.init()
""",
    # the nccl backend: DistOpt from the environment, GPU tensors (one GPU per rank)
    "nccl.py": COMMON + """
sgd = opt.DistOpt(opt.SGD(lr=0.1))
r, n = sgd.global_rank, sgd.world_size
t = tensor.from_numpy(np.arange(5, dtype=np.float32) + 10 * r).to_device(sgd.communicator.device)
sgd.all_reduce(t.data)
assert np.array_equal(tensor.to_numpy(t.to_host()), n * np.arange(5) + 10 * n * (n - 1) // 2)
print(f"nccl rank={r} of {n} backend={sgd.communicator.backend} device={sgd.communicator.device}")
""",
    "pkg/job.py": COMMON + """
print(f"module {__name__} rank {os.environ['RANK']}")
""",
}


@pytest.fixture
def scripts(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    for name, text in SCRIPTS.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


class Result:
    def __init__(self, proc, out, err, elapsed):
        self.pid, self.returncode, self.out, self.err, self.elapsed = proc.pid, proc.returncode, out, err, elapsed
        self.rank_pids = [int(line.split()[-1]) for line in out.splitlines() if line.split()[-2:-1] == ["pid"]]

    def lines(self, text, rank):
        return [line for line in text.splitlines() if line.startswith(f"[rank {rank}] ")]


def launch(args, cwd, timeout=60, interrupt_after=None):
    """Runs singa-run with args; interrupt_after: a callable(proc) run once the job started (reads stdout)."""
    start = time.monotonic()
    proc = subprocess.Popen(RUN + args, cwd=cwd, env=CLEAN, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        early = interrupt_after(proc) if interrupt_after else ""
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    result = Result(proc, early + out, err, time.monotonic() - start)
    assert_nothing_left(result)
    return result


def assert_nothing_left(result):
    assert not survivors(result.rank_pids), f"rank processes left behind\n{result.err}"
    # NcclIdHolder names its segment /singa_lite_<pid of its creator>_<random>: the launcher's pid here
    assert glob.glob(f"/dev/shm/singa_lite_{result.pid}_*") == [], "shared-memory segment left behind"


@pytest.mark.parametrize("n", [2, 3])
def test_ranks_find_each_other_from_the_environment(scripts, n):
    r = launch(["-np", str(n), "--timeout", "42", "allreduce.py", "-np", "x", "--no-prefix"], scripts)
    assert r.returncode == 0, r.err
    for rank in range(n):
        assert r.lines(r.out, rank)[-1] == (f"[rank {rank}] ok rank={rank} of {n} backend=shm local={rank}/{n} "
                                            f"timeout=42 args=['-np', 'x', '--no-prefix']")
        assert r.lines(r.err, rank) == [f"[rank {rank}] to stderr {rank}"]  # stderr stays on stderr
    assert "to stderr" not in r.out and len(r.rank_pids) == n


def test_distopt_from_the_environment(scripts):
    r = launch(["-np", "3", "distopt.py", HELPERS], scripts)
    assert r.returncode == 0, r.err
    for rank in range(3):
        assert r.lines(r.out, rank)[-2:] == [
            f"[rank {rank}] distopt rank={rank} of 3 backend=shm local={rank}",
            f"[rank {rank}] after close: this singa-run rank's communicator was closed, and the launcher's holder "
            f"serves one rendezvous: keep the communicator open while the rank needs one"]


def test_no_prefix_passes_output_through(scripts):
    r = launch(["-np", "2", "--no-prefix", "allreduce.py"], scripts)
    assert r.returncode == 0, r.err
    assert sorted(line for line in r.out.splitlines() if line.startswith("ok")) == [
        f"ok rank={k} of 2 backend=shm local={k}/2 timeout=300 args=[]" for k in range(2)]
    assert "[rank" not in r.out + r.err


def test_a_rank_that_raises_stops_the_others(scripts):
    r = launch(["-np", "3", "raises.py"], scripts)
    assert r.returncode == 1, r.err
    assert r.err.count("RuntimeError: boom from rank 1") == 1, r.err  # the traceback, once
    assert "[rank 1] RuntimeError: boom from rank 1" in r.err
    assert "singa-run: rank 1 failed: exit code 1" in r.err
    assert "rank 0 killed by SIGTERM" in r.err and "rank 2 killed by SIGTERM" in r.err, r.err
    assert r.elapsed < 30  # the others sleep for 120 s unless stopped


def test_a_killed_rank_stops_the_others_within_10_s(scripts):
    r = launch(["-np", "3", "killed.py"], scripts)
    assert r.returncode == 128 + signal.SIGKILL, r.err
    assert "singa-run: rank 2 failed (killed by SIGKILL)" in r.err
    assert "singa-run: rank 2 failed: killed by SIGKILL" in r.err
    stop = r.err.index("rank 2 failed (killed by SIGKILL)")
    assert "SIGKILL after" in r.err[stop:]
    assert r.elapsed < 10 + 10, r.err  # start-up (a few s) + at most the 5 s grace period


def test_exit_code_of_the_failed_rank_and_no_segment_left_when_a_rank_never_joined(scripts):
    r = launch(["-np", "2", "exits3.py"], scripts)  # launch() checks that the segment rank 0 made is gone
    assert r.returncode == 3 and "rank 1 failed: exit code 3" in r.err and "rank 0 killed by SIGTERM" in r.err, r.err


@pytest.mark.parametrize("sig,ends", [
    (signal.SIGINT, "rank 0 killed by SIGINT, rank 1 killed by SIGKILL"),  # rank 1 ignores SIGINT
    (signal.SIGTERM, "rank 0 killed by SIGTERM, rank 1 killed by SIGTERM")])
def test_ctrl_c_and_sigterm_stop_every_rank(scripts, sig, ends):
    def interrupt(proc):
        seen, ready = [], 0
        while ready < 2:
            line = proc.stdout.readline()
            assert line, "singa-run ended before the ranks were ready"
            seen.append(line)
            ready += line.rstrip().endswith("] ready")
        proc.send_signal(sig)
        return "".join(seen)

    r = launch(["-np", "2", "--grace", "1", "waits.py"], scripts, timeout=30, interrupt_after=interrupt)
    assert r.returncode == 128 + sig, r.err
    assert f"singa-run: got {sig.name}: passing it to the ranks" in r.err
    assert f"interrupted by {sig.name}; {ends}" in r.err, r.err
    if sig == signal.SIGINT:
        assert "[rank 0] KeyboardInterrupt" in r.err  # Python ends by SIGINT after the KeyboardInterrupt
        assert "rank(s) 1 still running 1 s after being told to stop: SIGKILL" in r.err


def test_module_and_dry_run(scripts):
    r = launch(["-np", "2", "-m", "pkg.job"], scripts)
    assert r.returncode == 0, r.err
    assert sorted(line for line in r.out.splitlines() if "module" in line) == [
        "[rank 0] module __main__ rank 0", "[rank 1] module __main__ rank 1"]
    r = launch(["-np", "2", "--backend", "shm", "--dry-run", "allreduce.py", "a"], scripts)
    assert r.returncode == 0 and r.rank_pids == []
    assert f"{sys.executable} allreduce.py a" in r.out
    assert "rank 1: LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 " in r.out and "SINGA_LITE_COMM_BACKEND=shm" in r.out


def test_words_after_the_script_belong_to_the_script(scripts):
    # --n and --time look like abbreviations of singa-run's --np / --timeout: they are the script's
    args = ["--n", "5", "--time", "1", "-np", "3", "--backend", "x"]
    r = launch(["-np", "2", "--dry-run", "allreduce.py", *args], scripts)
    assert r.returncode == 0 and f"{sys.executable} allreduce.py {' '.join(args)}" in r.out, r.out + r.err
    r = launch(["-np", "2", "--dry-run", "--", "allreduce.py", "--np", "4"], scripts)
    assert r.returncode == 0 and f"{sys.executable} allreduce.py --np 4" in r.out, r.out + r.err


@pytest.mark.parametrize("args,message", [
    (["-np", "0", "allreduce.py"], "-np must be at least 1, got 0"),
    (["-np", "2", "missing.py"], "script 'missing.py' does not exist"),
    (["-np", "2", "-m", "no_such_module_xyz"], "no module named 'no_such_module_xyz'"),
    (["-np", "2", "--timeout", "0", "allreduce.py"], "--timeout must be a positive number"),
    (["allreduce.py"], "the following arguments are required: -np"),
    (["-np", "2", "--timeout", "inf", "allreduce.py"], "--timeout must be a positive number of seconds, at most 1e+07"),
    (["-np", "2", "--grace", "inf", "allreduce.py"], "--grace must be a finite number of seconds >= 0, got inf"),
    # a directory that cannot be: under a regular file, at a dangling link, empty, too long a name to create
    (["-np", "2", "--timeline", "allreduce.py/sub", "allreduce.py"], "allreduce.py' (in --timeline "
                                                                     "'allreduce.py/sub') is a file"),
    (["-np", "2", "--timeline", "allreduce.py", "allreduce.py"], "allreduce.py' is a file"),
    (["-np", "2", "--timeline", "dangling/tl", "allreduce.py"], "dangling' (in --timeline 'dangling/tl') is a "
                                                                "symbolic link to nothing"),
    (["-np", "2", "--timeline", "", "allreduce.py"], "--timeline wants a directory name for the ranks' files"),
    (["-np", "2", "--timeline", "x" * 300, "allreduce.py"], "cannot create the directory: File name too long"),
    (["-np", "2", "--dry-run", "--timeline", "allreduce.py/sub", "allreduce.py"], "is a file"),
    (["--hostfile", "binary", "allreduce.py"], "the hostfile 'binary' is not a text file"),
    (["--hostfile", "hosts", "--launcher-exec", "ssh -o 'x", "allreduce.py"], "--launcher-exec \"ssh -o 'x\": "
                                                                               "No closing quotation"),
    (["--hostfile", "hosts", "--master-addr", "", "allreduce.py"], "--master-addr must be a host name or address"),
])
def test_bad_input_exits_2_with_a_message(scripts, args, message):
    (scripts / "binary").write_bytes(b"\xff\xfe\x00 not text")
    (scripts / "hosts").write_text("localhost slots=2\n")
    os.symlink(scripts / "nowhere", scripts / "dangling")
    before = sorted(os.listdir(scripts))
    r = launch(args, scripts, timeout=30)
    assert r.returncode == 2 and message in r.err and "Traceback" not in r.err, r.err
    assert [line for line in r.err.splitlines() if "error" in line] == [r.err.splitlines()[-1]], r.err  # one line
    assert sorted(os.listdir(scripts)) == before, "a refused command line created something"


def test_the_timeline_directory_is_made_by_a_run_not_by_a_dry_run(scripts):
    r = launch(["-np", "2", "--dry-run", "--timeline", "tl/sub", "allreduce.py"], scripts, timeout=30)
    assert r.returncode == 0 and not os.path.exists(scripts / "tl"), r.err
    r = launch(["-np", "2", "--timeline", "tl/sub", "allreduce.py"], scripts, timeout=60)
    assert r.returncode == 0 and os.path.isdir(scripts / "tl" / "sub"), r.err


def test_nccl_backend_needs_nccl(scripts):
    if dist.NcclIdHolder().nccl_id is not None:
        pytest.skip("NCCL works here: test_nccl_backend_through_singa_run runs instead")
    r = launch(["-np", "2", "--backend", "nccl", "allreduce.py"], scripts, timeout=30)
    assert r.returncode == 2 and "--backend nccl, but NCCL cannot be used here" in r.err, r.err
    assert "Traceback" not in r.err and r.rank_pids == []


@pytest.mark.gpu
def test_nccl_backend_through_singa_run(scripts):
    problem = nccl.readiness()
    if problem:
        pytest.skip(problem)
    n = min(_core.cuda_device_count(), 4)  # NCCL needs one GPU per rank
    r = launch(["-np", str(n), "--backend", "nccl", "nccl.py"], scripts, timeout=120)
    assert r.returncode == 0, r.err
    for rank in range(n):
        assert r.lines(r.out, rank)[-1] == f"[rank {rank}] nccl rank={rank} of {n} backend=nccl device=cuda:{rank}"


def test_help():
    r = subprocess.run(RUN + ["--help"], capture_output=True, text=True, timeout=30, env=CLEAN)
    assert r.returncode == 0 and "usage: singa-run" in r.stdout
    assert "SINGA_LITE_HOLDER" in r.stdout and "exit status" in r.stdout


def test_rank_variables_alone_do_not_make_a_singa_run_rank(monkeypatch):
    # another launcher's RANK / WORLD_SIZE: init() keeps to its one-process default
    monkeypatch.delenv("SINGA_LITE_HOLDER", raising=False)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert dist.from_launcher() is None
    comm = dist.init(backend="shm")
    assert (comm.rank, comm.world_size) == (0, 1)
    comm.close()


def test_launcher_environment_errors(monkeypatch):
    h = dist.NcclIdHolder()
    monkeypatch.setenv("SINGA_LITE_HOLDER", h.to_string())
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="need 0 <= RANK < WORLD_SIZE, got RANK=2, WORLD_SIZE=2"):
        dist.init()
    monkeypatch.delenv("RANK")
    with pytest.raises(ValueError, match="RANK must be an integer, got None"):
        dist.init()
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="this process is a singa-run rank"):
        dist.init(backend="mpi")
    if nccl.readiness():  # the environment's holder reaches the nccl backend too
        with pytest.raises(dist.CommError, match="the nccl backend needs"):
            dist.init(backend="nccl")
    monkeypatch.setenv("SINGA_LITE_HOLDER", "garbage")
    with pytest.raises(ValueError, match="expected the text of NcclIdHolder.to_string"):
        dist.init()


def test_holder_string_form_round_trips():
    h = dist.NcclIdHolder()
    h2 = dist.NcclIdHolder.from_string(h.to_string())
    assert (h2.shm_name, h2.nccl_id, h2.nccl_error) == (h.shm_name, h.nccl_id, h.nccl_error)
    assert h2._owner_pid is None  # a copy never removes the parent's segment name
    assert "\n" not in h.to_string()


def test_console_script_is_installed():
    exe = os.path.join(os.path.dirname(sys.executable), "singa-run")
    if not os.path.exists(exe):
        pytest.skip("singa-run is not installed next to this interpreter (reinstall the package)")
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=30, env=CLEAN)
    assert r.returncode == 0 and "usage: singa-run" in r.stdout
